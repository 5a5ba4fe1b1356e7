"""The store contract on `ClickHouseServerStore` (clickhouse-connect).

- `TestClickHouseServerStore`: a ClickHouse server over HTTP. Needs one: set
  SFLOW_TEST_CLICKHOUSE_URL=http://[user:password@]host:8123; each test gets its own database, dropped after.
- `TestClickHouseConnectEmbedded`: the same backend class and client calls (command, raw_insert, raw_query
  with server-side parameters) against clickhouse-connect's in-process engine (`chdb://` URL), so this
  backend's code runs here without a server; only the HTTP transport is left to the class above.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from infra.analytics.store import AnalyticsStore, ClickHouseServerStore
from tests.analytics.store_contract import StoreContract

URL = os.environ.get("SFLOW_TEST_CLICKHOUSE_URL", "")


@pytest.mark.skipif(
    not URL, reason="no ClickHouse server: set SFLOW_TEST_CLICKHOUSE_URL=http://host:8123 to run these"
)
class TestClickHouseServerStore(StoreContract):
    def make_store(self, tmp_path: Path) -> AnalyticsStore:
        return ClickHouseServerStore(URL, database=f"sflow_test_{uuid.uuid4().hex[:10]}")

    def reopen(self, store: AnalyticsStore) -> AnalyticsStore:
        store.close()
        return ClickHouseServerStore(URL, database=store.database, create=False)

    def dispose(self, store: AnalyticsStore) -> None:
        store.close()
        with ClickHouseServerStore(URL, database=store.database, create=False) as admin:
            admin.query(f"DROP DATABASE IF EXISTS {store.database}")


@pytest.mark.unit
class TestClickHouseConnectEmbedded(StoreContract):
    def make_store(self, tmp_path: Path) -> AnalyticsStore:
        return ClickHouseServerStore(f"chdb://{tmp_path / 'cc'}", database="analytics_cc")

    def reopen(self, store: AnalyticsStore) -> AnalyticsStore:
        assert isinstance(store, ClickHouseServerStore)
        store.close()
        return ClickHouseServerStore(store.url, database=store.database, create=False)
