"""Ad-hoc SQL over a run's analytics store (`sflow analytics sql "SELECT ..."`), and the reference of its
tables that docs/operations.md shows.

Read-only twice over. The text must start with a reading statement (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN),
so a write gets a clear refusal before any store is opened; and the connection itself is put in
ClickHouse's `readonly = 1` (`AnalyticsStore.forbid_writes`), so whatever the text check cannot see (a
second statement, a table function that writes, a setting change) is refused by the engine. A chdb folder
that a running sink holds is read through a snapshot copy (`open_store(read_only=True)`), never the live one.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import re
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from infra.analytics.config import AnalyticsConfig, open_store
from infra.analytics.errors import AnalyticsError
from infra.analytics.store import QueryResult
from infra.analytics.tables import ENVELOPE, TABLES, Column

READING_STATEMENTS: Final = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN")
_LEADING_NOISE: Final = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/|\()*", re.DOTALL)
_FIRST_WORD: Final = re.compile(r"[A-Za-z]+")
_FORMAT_CLAUSE: Final = re.compile(r"\bFORMAT\s+[A-Za-z]+\s*\Z", re.IGNORECASE)
_INTO_OUTFILE: Final = re.compile(r"\bINTO\s+OUTFILE\b", re.IGNORECASE)  # a file write readonly=1 allows
_RUN_STAMP: Final = r"-\d{8}-\d{6}"  # infra.demo names a run folder <name>-<%Y%m%d-%H%M%S>


class OutputFormat(StrEnum):
    """How `sflow analytics sql` prints rows."""

    TABLE = "table"  # aligned text, numbers right-aligned, NULL for missing values
    CSV = "csv"  # a header line, then one line per row
    JSON = "json"  # a list of objects, one per row


def read_only_statement(sql: str) -> str:
    """The statement to run, or an error saying why it is not one that only reads. Refusing early gives a
    message naming what is allowed; the engine's `readonly` setting is what guarantees it."""
    statement = sql.strip().rstrip(";").strip()
    body = _LEADING_NOISE.sub("", statement, count=1)
    word = _FIRST_WORD.match(body)
    keyword = word.group(0).upper() if word else ""
    if keyword not in READING_STATEMENTS:
        shown = keyword or (body[:20] or "an empty statement")
        raise AnalyticsError(
            f"refused: `sflow analytics sql` only reads ({', '.join(READING_STATEMENTS)}), got {shown!r}"
        )
    if _INTO_OUTFILE.search(statement):
        raise AnalyticsError("refused: INTO OUTFILE writes a file; redirect the output instead (> file.csv)")
    if _FORMAT_CLAUSE.search(statement):
        raise AnalyticsError("leave out the FORMAT clause: choose the output with --format table|csv|json")
    return statement


def query_read_only(config: AnalyticsConfig, sql: str) -> QueryResult:
    """Runs one reading statement on the configured store, on a connection that cannot write. `{db}` in
    the text names the store's database, which is also the default one (`FROM llm_calls` works)."""
    statement = read_only_statement(sql)
    with open_store(config, read_only=True) as store:
        store.forbid_writes()
        return store.query(statement)


def run_folder(run: str, runs_root: Path) -> Path:
    """A run given as a folder, or by name under `runs_root`: the folder of that name, else the newest run
    started with that config name (`demo` -> the latest `demo-<date>-<time>`)."""
    given = Path(run)
    if given.is_dir():
        return given
    if (runs_root / run).is_dir():
        return runs_root / run
    pattern = re.compile(re.escape(run) + _RUN_STAMP)
    found = sorted(p for p in runs_root.glob(f"{glob.escape(run)}-*") if p.is_dir() and pattern.fullmatch(p.name))
    if not found:
        known = sorted(p.name for p in runs_root.iterdir() if p.is_dir()) if runs_root.is_dir() else []
        raise AnalyticsError(f"no run {run!r}: not a folder, nor a run under {runs_root} (runs there: {known})")
    return found[-1]


def store_config(run: str | None, data_dir: Path | None, runs_root: Path) -> AnalyticsConfig:
    """The store the CLI reads: a run's (its folder's `analytics/`, where `infra.demo` points the run's
    sink), else `data_dir`, else the configured default (SFLOW_ANALYTICS_DIR or var/analytics). As for the
    sink, SFLOW_CLICKHOUSE_URL selects a ClickHouse server instead of the folder."""
    if run is not None and data_dir is not None:
        raise AnalyticsError("give --run or --data-dir, not both")
    if run is not None:
        return AnalyticsConfig(data_dir=run_folder(run, runs_root) / "analytics")
    return AnalyticsConfig(data_dir=data_dir) if data_dir is not None else AnalyticsConfig()


# --- output -------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return value
    if isinstance(value, bool | list | dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def as_table(result: QueryResult) -> str:
    """Aligned text: a header, a rule, the rows (numeric columns right-aligned), and the row count."""
    cells = [[_text(v) for v in row] for row in result.rows]
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(result.columns)]
    numeric = [bool(result.rows) and all(_is_number(r[i]) for r in result.rows) for i in range(len(widths))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True))

    lines = [line(list(result.columns)), line(["-" * w for w in widths]), *(line(row) for row in cells)]
    count = len(result.rows)
    lines.append(f"({count} row{'' if count == 1 else 's'})")
    return "\n".join(s.rstrip() for s in lines) + "\n"


def as_csv(result: QueryResult) -> str:
    """RFC 4180 CSV with a header; NULL is an empty field, arrays and maps are JSON."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(result.columns)
    for row in result.rows:
        writer.writerow("" if v is None else _text(v) for v in row)
    return out.getvalue()


def as_json(result: QueryResult) -> str:
    """A JSON list with one object per row, keyed by column name (NULL is null)."""
    return json.dumps(result.dicts(), indent=2) + "\n"


RENDERERS: Final[dict[OutputFormat, Callable[[QueryResult], str]]] = {
    OutputFormat.TABLE: as_table, OutputFormat.CSV: as_csv, OutputFormat.JSON: as_json,
}


# --- the table reference --------------------------------------------------------------------------------


def _columns(columns: tuple[Column, ...]) -> str:
    return ", ".join(f"`{name}` {kind}" for name, kind in columns)


def tables_reference() -> str:
    """The tables and their columns as Markdown, from `infra.analytics.tables` (docs/operations.md's copy is checked
    against this by a test, so the two cannot drift)."""
    lines = [
        f"Every event table starts with the envelope: {_columns(ENVELOPE)}; then its own columns. "
        "Read them with `FINAL` (duplicates a restarted sink wrote collapse).",
        "",
        "| table | a row is | columns |",
        "|---|---|---|",
    ]
    for t in TABLES:
        doc = t.doc if t.envelope else f"{t.doc} (no envelope)"
        lines.append(f"| `{t.name}` | {doc.replace('|', '/')} | {_columns(t.columns)} |")
    return "\n".join(lines) + "\n"
