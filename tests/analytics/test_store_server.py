"""The store contract on a ClickHouse server (clickhouse-connect). Needs a server: set
SFLOW_TEST_CLICKHOUSE_URL=http://[user:password@]host:8123; each test gets its own database, dropped after."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from infra.analytics.store import AnalyticsStore, ClickHouseServerStore
from tests.analytics.store_contract import StoreContract

URL = os.environ.get("SFLOW_TEST_CLICKHOUSE_URL", "")

pytestmark = pytest.mark.skipif(
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
