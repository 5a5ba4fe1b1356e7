"""The store contract on chdb (ClickHouse in-process, a database folder under the test's tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.analytics.store import AnalyticsStore, ChdbStore
from tests.analytics.store_contract import StoreContract

pytestmark = pytest.mark.unit


class TestChdbStore(StoreContract):
    def make_store(self, tmp_path: Path) -> AnalyticsStore:
        return ChdbStore(tmp_path / "chdb", database="analytics_test")

    def reopen(self, store: AnalyticsStore) -> AnalyticsStore:
        assert isinstance(store, ChdbStore)
        store.close()
        return ChdbStore(store.path, database=store.database, create=False)


def test_fsync_inserts_are_a_table_setting(tmp_path: Path) -> None:
    with ChdbStore(tmp_path / "chdb", fsync=True) as store:
        ddl = store.query("SHOW CREATE TABLE {db}.llm_calls").scalar()
        assert "fsync_after_insert = 1" in ddl
        assert store.insert("metrics", []) == 0
