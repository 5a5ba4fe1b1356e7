"""`sflow analytics sql`: a run's store answers a user's own SQL in three formats, refuses anything that
writes (the text check and the engine's readonly setting each on their own), and turns engine errors
into one line and exit status 2. The store is filled through the sink's writer, as in the other
analytics tests, so no broker is needed."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.analytics.config import AnalyticsConfig, open_store
from infra.analytics.errors import AnalyticsError
from infra.analytics.sql import query_read_only, read_only_statement, run_folder, store_config, tables_reference
from infra.analytics.store import ChdbStore, ClickHouseServerStore
from infra.cli import app
from tests.analytics.analytics_helpers import T0, ingest, llm_call, segment

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
LENGTH_PER_VERSION = (
    "SELECT max_version AS policy_version, count() AS calls, avg(output_tokens) AS mean_output_tokens, "
    "countIf(finish_reason = 'length') AS at_max_tokens FROM llm_calls FINAL "
    "GROUP BY policy_version ORDER BY policy_version"
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder whose store holds three calls: two under version 0 (10 and 20 tokens), one under 1 (30,
    cut at max_tokens)."""
    root = tmp_path_factory.mktemp("runs") / "demo-20250101-120000"
    calls = [
        llm_call("s0", "a", [segment("r0", 0, 10, T0, T0 + 100)]),
        llm_call("s1", "b", [segment("r1", 0, 20, T0, T0 + 200)], ts_ms=T0 + 1),
        llm_call("s2", "a", [segment("r0", 1, 30, T0 + 300, T0 + 600, finish="length")], ts_ms=T0 + 2),
    ]
    with ChdbStore(root / "analytics" / "chdb") as store:
        ingest(store, calls)
    return root


def sql(run_dir: Path, statement: str, *options: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["analytics", "sql", statement, "--run", str(run_dir), *options])
    return result.exit_code, result.stdout, result.stderr


def stored_calls(run_dir: Path) -> int:
    with open_store(AnalyticsConfig(data_dir=run_dir / "analytics"), read_only=True) as store:
        return store.count("llm_calls", final=False)


def test_table_format_aligns_columns_and_counts_rows(run_dir: Path) -> None:
    code, out, err = sql(run_dir, LENGTH_PER_VERSION)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "policy_version  calls  mean_output_tokens  at_max_tokens",
        "--------------  -----  ------------------  -------------",
        "             0      2                  15              0",
        "             1      1                  30              1",
        "(2 rows)",
    ]


def test_csv_format_has_a_header_and_one_line_per_row(run_dir: Path) -> None:
    code, out, _ = sql(run_dir, LENGTH_PER_VERSION, "--format", "csv")
    assert code == 0
    assert list(csv.reader(io.StringIO(out))) == [
        ["policy_version", "calls", "mean_output_tokens", "at_max_tokens"],
        ["0", "2", "15", "0"],
        ["1", "1", "30", "1"],
    ]


def test_json_format_is_a_list_of_objects(run_dir: Path) -> None:
    code, out, _ = sql(run_dir, "SELECT agent_id, sum(output_tokens) AS tokens, groupArray(call_id) = [] AS none, "
                                "NULL AS missing FROM {db}.llm_calls FINAL GROUP BY agent_id ORDER BY agent_id",
                       "--format", "json")
    assert code == 0
    assert json.loads(out) == [
        {"agent_id": "a", "tokens": 40, "none": False, "missing": None},
        {"agent_id": "b", "tokens": 20, "none": False, "missing": None},
    ]


def test_show_and_describe_list_the_tables_and_columns(run_dir: Path) -> None:
    code, out, _ = sql(run_dir, "SHOW TABLES", "--format", "json")
    assert code == 0 and {"llm_calls", "trajectories", "sink_offsets"} <= {r["name"] for r in json.loads(out)}
    code, out, _ = sql(run_dir, "/* a comment first */\nDESCRIBE TABLE llm_calls;", "--format", "csv")
    assert code == 0 and "output_tokens,UInt32" in out


@pytest.mark.parametrize("statement", [
    "INSERT INTO llm_calls (call_id) VALUES ('x')",
    "DROP TABLE llm_calls",
    "  truncate table llm_calls",
    "ALTER TABLE llm_calls DELETE WHERE 1",
    "OPTIMIZE TABLE llm_calls FINAL",
    "SELECT 1 INTO OUTFILE 'x.csv'",
])
def test_a_write_is_refused_with_a_message_and_the_table_is_unchanged(run_dir: Path, statement: str) -> None:
    before = stored_calls(run_dir)
    code, out, err = sql(run_dir, statement)
    assert code == 2 and out == ""
    assert err.startswith("error: refused:") and len(err.strip().splitlines()) == 1
    assert stored_calls(run_dir) == before == 3


@pytest.mark.parametrize("statement", [
    "SELECT 1; DROP TABLE llm_calls",  # passes the text check: only the engine stands in the way
    "SELECT * FROM url('http://127.0.0.1:1/x', CSV, 'a Int32')",
    "SELECT 1 SETTINGS readonly = 0",
])
def test_the_engine_refuses_what_the_text_check_lets_through(run_dir: Path, statement: str) -> None:
    read_only_statement(statement)
    before = stored_calls(run_dir)
    code, _, err = sql(run_dir, statement)
    assert code == 2 and "READONLY" in err and "Traceback" not in err
    assert stored_calls(run_dir) == before == 3


def test_forbid_writes_makes_the_connection_read_only(tmp_path: Path) -> None:
    with ChdbStore(tmp_path / "chdb") as store:
        store.forbid_writes()
        with pytest.raises(AnalyticsError, match="readonly"):
            ingest(store, [llm_call("s0", "a", [segment("r0", 0, 10, T0, T0 + 100)])])
        with pytest.raises(AnalyticsError, match="readonly"):
            store.query("CREATE TABLE {db}.extra (a Int8) ENGINE = Memory")
    with ChdbStore(tmp_path / "chdb", create=False) as store:
        assert store.count("llm_calls", final=False) == 0
        assert "extra" not in store.query("SHOW TABLES FROM {db}").column("name")


def test_forbid_writes_on_the_server_backend(tmp_path: Path) -> None:
    with ClickHouseServerStore(f"chdb://{tmp_path / 'cc'}", database="analytics_cc") as store:
        store.forbid_writes()
        assert store.query("SELECT currentDatabase(), count() FROM llm_calls").rows == [("analytics_cc", 0)]
        with pytest.raises(AnalyticsError, match="readonly"):
            store.query("DROP TABLE llm_calls")
        assert "llm_calls" in store.query("SHOW TABLES").column("name")


@pytest.mark.parametrize(("statement", "shown"), [
    ("SELECT count( FROM llm_calls", "SYNTAX_ERROR"),
    ("SELECT * FROM no_such_table", "UNKNOWN_TABLE"),
    ("SELECT no_such_column FROM llm_calls", "UNKNOWN_IDENTIFIER"),
])
def test_a_bad_query_is_one_line_and_exit_status_2(run_dir: Path, statement: str, shown: str) -> None:
    code, out, err = sql(run_dir, statement)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and shown in err and len(err.strip().splitlines()) == 1


def test_the_installed_command_prints_no_traceback(run_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "infra.cli", "analytics", "sql", "SELECT * FROM nope",
                           "--run", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert "UNKNOWN_TABLE" in done.stderr and "Traceback" not in done.stderr


def test_a_run_is_found_by_folder_or_newest_name(tmp_path: Path) -> None:
    for name in ("demo-20250101-120000", "demo-20250102-080000", "demo-big-20250103-000000", "e2e-20250104-000000"):
        (tmp_path / name).mkdir()
    assert run_folder("demo", tmp_path) == tmp_path / "demo-20250102-080000"
    assert run_folder("demo-20250101-120000", tmp_path) == tmp_path / "demo-20250101-120000"
    assert run_folder(str(tmp_path / "e2e-20250104-000000"), Path("/nonexistent")) == tmp_path / "e2e-20250104-000000"
    with pytest.raises(AnalyticsError, match=r"no run 'nope'.*demo-20250101-120000"):
        run_folder("nope", tmp_path)
    assert store_config("demo", None, tmp_path).data_dir == tmp_path / "demo-20250102-080000" / "analytics"
    with pytest.raises(AnalyticsError, match="--run or --data-dir"):
        store_config("demo", tmp_path, tmp_path)


def test_query_read_only_reads_through_the_config(run_dir: Path) -> None:
    result = query_read_only(AnalyticsConfig(data_dir=run_dir / "analytics"), LENGTH_PER_VERSION)
    assert result.column("mean_output_tokens") == [15, 30]
    with pytest.raises(AnalyticsError, match="FORMAT"):
        query_read_only(AnalyticsConfig(data_dir=run_dir / "analytics"), "SELECT 1 FORMAT CSV")


def test_canned_queries_take_the_run_option(run_dir: Path) -> None:
    result = CliRunner().invoke(app, ["analytics", "drift", "--run", str(run_dir)])
    assert result.exit_code == 0 and "a" in result.stdout and "b" in result.stdout
    result = CliRunner().invoke(app, ["analytics", "utilisation", "nope=1", "--run", str(run_dir)])
    assert result.exit_code == 2 and "no parameter" in result.stderr


def test_the_operations_doc_documents_every_table_as_tables_py_defines_it() -> None:
    doc = (REPO / "docs" / "operations.md").read_text()
    found = re.search(r"<!-- analytics-tables:start.*?-->\n(.*?)<!-- analytics-tables:end -->", doc, re.DOTALL)
    assert found, "docs/operations.md has no analytics-tables section"
    assert found.group(1) == tables_reference(), "docs/operations.md's tables drifted: paste `sflow analytics tables`"
