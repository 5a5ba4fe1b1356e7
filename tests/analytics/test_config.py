"""The sink's config (validation names the field and value; flags parse) and how the CLI opens the store,
including a chdb folder another process holds (read through a snapshot)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from bus.process import ManagedProcess
from infra.analytics import config as analytics_config
from infra.analytics.__main__ import parse_config
from infra.analytics.config import ALL_TOPICS, AnalyticsConfig, open_store
from infra.analytics.errors import AnalyticsError, StoreLockedError
from infra.analytics.store import ChdbStore, ClickHouseServerStore, redact
from schemas import events as ev
from tests.analytics.analytics_helpers import ingest
from tests.factories import example

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def test_defaults_read_every_catalog_topic_into_chdb(tmp_path: Path) -> None:
    config = AnalyticsConfig(data_dir=tmp_path)
    assert config.topics == ALL_TOPICS and "dlq" in config.topics
    assert (config.backend, config.chdb_path) == ("chdb", tmp_path / "chdb")
    assert AnalyticsConfig(data_dir=tmp_path, clickhouse_url="http://ch:8123").backend == "server"


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("topics", ("llm.calls", "nope"), "nope"),
    ("database", "drop table", "drop table"),
    ("clickhouse_url", "ch:8123", "ch:8123"),
    ("batch_max_events", 0, "batch_max_events"),
    ("bootstrap_servers", "localhost", "localhost"),
    ("group_id", "a b", "a b"),
])
def test_bad_values_are_refused_naming_field_and_value(tmp_path: Path, field: str, value: object, shown: str) -> None:
    with pytest.raises(ValidationError) as info:
        AnalyticsConfig.model_validate({"data_dir": tmp_path, field: value})
    assert field in str(info.value) and shown in str(info.value)


def test_url_passwords_stay_out_of_messages() -> None:
    assert redact("http://u:secret@ch:8123") == "http://u:***@ch:8123"
    with pytest.raises(AnalyticsError) as info:
        ClickHouseServerStore("ftp://u:secret@ch:21")
    assert "secret" not in str(info.value)


def test_flags_parse_into_a_validated_config(tmp_path: Path) -> None:
    config = parse_config([
        "--data-dir", str(tmp_path), "--topics", "llm.calls, scheduler", "--batch-max-events", "50",
        "--group-instance-id", "none", "--bootstrap-servers", "127.0.0.1:9999", "--topic-prefix", "x.",
    ])
    assert config.topics == ("llm.calls", "scheduler")
    assert (config.batch_max_events, config.group_instance_id) == (50, None)
    bus = config.bus_config()
    assert (bus.bootstrap_servers, bus.topic("llm.calls"), bus.client_id) == (
        "127.0.0.1:9999", "x.llm.calls", "sflow-analytics")
    with pytest.raises(SystemExit):
        parse_config(["--data-dir", str(tmp_path), "--flush-interval-s", "-1"])


def test_read_only_open_of_a_missing_store_says_to_run_the_sink(tmp_path: Path) -> None:
    with pytest.raises(AnalyticsError, match="run the sink"):
        open_store(AnalyticsConfig(data_dir=tmp_path / "none"), read_only=True)


def test_a_read_only_open_refused_for_any_reason_reads_a_snapshot(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder may let go between chdb's refusal and the lock check that tells a lock from another
    failure: the refusal is then a plain AnalyticsError, and a reader (the CLI, a test beside a live
    dashboard) must still get the data, from a snapshot, not an error."""
    with ChdbStore(tmp_path / "chdb") as store:  # a real folder, with the tables a sink creates
        store.query("SELECT 1")
    refused: list[Path] = []

    class RefusingChdbStore(ChdbStore):
        def __init__(self, path: Path, *args: object, **kwargs: object) -> None:
            if kwargs.get("create") is False and not refused:
                refused.append(path)
                raise AnalyticsError(f"cannot open chdb at {path}: Error initializing EmbeddedServer")
            super().__init__(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(analytics_config, "ChdbStore", RefusingChdbStore)
    with open_store(AnalyticsConfig(data_dir=tmp_path), read_only=True) as store:
        assert store.query("SELECT 1").rows == [(1,)]
    assert refused == [tmp_path / "chdb"]


def test_a_store_held_by_a_running_sink_is_read_through_a_snapshot(tmp_path: Path) -> None:
    config = AnalyticsConfig(data_dir=tmp_path)
    with open_store(config) as store:
        ingest(store, [example(ev.MetricSample, i) for i in range(4)])
    holder = ManagedProcess("tests.analytics.store_holder", [str(config.chdb_path)], log=tmp_path / "holder.log",
                            cwd=REPO, name="store-holder").start()
    try:
        assert holder.wait_for_log("ready\n", 60).splitlines()[0] == "ready"
        with pytest.raises(StoreLockedError, match="held by another process"):
            ChdbStore(config.chdb_path)
        with open_store(config, read_only=True) as snapshot:
            assert isinstance(snapshot, ChdbStore) and snapshot.path != config.chdb_path
            assert snapshot.count("metrics") == 4
            copy = snapshot.path
        assert not copy.exists()
    finally:
        holder.kill()
