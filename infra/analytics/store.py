"""Where analytics rows live: one interface, two ClickHouse backends.

`AnalyticsStore` owns the SQL (table DDL, JSONEachRow inserts, JSONCompact results, the offset ledger);
a backend supplies three primitives (run a statement, insert a JSON block, run a query returning JSON):

- `ChdbStore`: ClickHouse in-process (chdb) on a database folder under the run folder. The default; data
  persists across processes. ClickHouse locks the folder, so one process at a time holds it: while the sink
  runs, readers (the CLI) open a `ChdbStore.snapshot` copy instead.
- `ClickHouseServerStore`: a ClickHouse server through clickhouse-connect (HTTP), when a URL is configured.

Both speak the same SQL: `{db}` in a statement names the store's database, and `{name:Type}` placeholders
take query parameters (ClickHouse's server-side binding), so a canned query runs unchanged on either.
"""

from __future__ import annotations

import fcntl
import json
import logging
import re
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from infra.analytics.errors import AnalyticsError, StoreLockedError
from infra.analytics.tables import EVENT_TABLES, OFFSETS, TABLES, Row, table, ts_text

log = logging.getLogger("sflow.analytics")

_IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JSON_SETTINGS: Final = {"output_format_json_quote_64bit_integers": 0}
TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class QueryResult:
    """Rows of a query with their column names; `title` is set by canned queries."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    title: str = ""
    types: tuple[str, ...] = field(default=(), compare=False)

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def column(self, name: str) -> list[Any]:
        try:
            i = self.columns.index(name)
        except ValueError:
            raise AnalyticsError(f"no column {name!r} in result; columns: {list(self.columns)}") from None
        return [row[i] for row in self.rows]

    def scalar(self) -> Any:
        if len(self.rows) != 1 or len(self.columns) != 1:
            raise AnalyticsError(f"expected one value, got {len(self.rows)} rows x {len(self.columns)} columns")
        return self.rows[0][0]


def check_identifier(kind: str, name: str) -> str:
    if not _IDENTIFIER.match(name):
        raise AnalyticsError(f"{kind} must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*), got {name!r}")
    return name


def json_block(columns: Sequence[str], rows: Iterable[Row], table_name: str) -> bytes:
    """Rows as a JSONEachRow block, each row checked to hold exactly the table's columns."""
    expected = set(columns)
    lines = []
    for row in rows:
        if row.keys() != expected:
            missing, extra = sorted(expected - row.keys()), sorted(row.keys() - expected)
            raise AnalyticsError(f"row for {table_name} has missing columns {missing} and unknown columns {extra}")
        lines.append(json.dumps(row, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


class AnalyticsStore(ABC):
    """Typed event rows in ClickHouse tables (see `infra.analytics.tables`).

    Inserts are idempotent in what queries see: every table is a ReplacingMergeTree keyed by
    (ts, event_id[, item]), so a row inserted twice is one row in `SELECT ... FROM {db}.t FINAL` (and
    physically one after a merge, `compact()`). `count` and the canned queries always read with FINAL.
    """

    def __init__(self, database: str, fsync: bool = False) -> None:
        self.database = check_identifier("database", database)
        self.fsync = fsync

    # --- backend primitives --------------------------------------------------------------------

    @abstractmethod
    def _command(self, sql: str) -> None:
        """Runs a statement that returns nothing."""

    @abstractmethod
    def _insert_json(self, qualified_table: str, columns: Sequence[str], block: bytes) -> None:
        """Inserts a JSONEachRow block; returns once the rows are written (a new part on disk)."""

    @abstractmethod
    def _query_json(self, sql: str, params: Mapping[str, Any]) -> bytes:
        """Runs a query and returns its JSONCompact result (64-bit integers unquoted)."""

    @abstractmethod
    def forbid_writes(self) -> None:
        """Makes this connection read-only in the engine (ClickHouse `readonly = 1`: no writes, no DDL, no
        setting changes), with the store's database as the default one. For statements a user typed
        (`sflow analytics sql`): the engine refuses a write, whatever a parse of the text missed."""

    @abstractmethod
    def close(self) -> None:
        """Releases the connection (and, for chdb, the folder lock)."""

    # --- the interface ----------------------------------------------------------------------------

    def __enter__(self) -> AnalyticsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sql(self, template: str) -> str:
        """`template` with `{db}` replaced by the database name (other braces are query parameters)."""
        return template.replace("{db}", self.database)

    def create_tables(self) -> None:
        """Creates the database and every table; tables that exist are kept as they are."""
        self._command(f"CREATE DATABASE IF NOT EXISTS {self.database}")
        for t in TABLES:
            self._command(t.ddl(self.database, self.fsync))

    def insert(self, table_name: str, rows: Sequence[Row]) -> int:
        """Writes rows into a table; durable in the store when it returns. Returns the number of rows."""
        if not rows:
            return 0
        t = table(table_name)
        self._insert_json(f"{self.database}.{t.name}", t.column_names, json_block(t.column_names, rows, t.name))
        return len(rows)

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> QueryResult:
        """Runs `sql` (with `{db}` and `{name:Type}` parameters) and returns its rows."""
        raw = self._query_json(self.sql(sql), params or {})
        try:
            doc = json.loads(raw) if raw.strip() else {"meta": [], "data": []}
        except json.JSONDecodeError as e:
            raise AnalyticsError(f"query returned non-JSON output: {raw[:200]!r}") from e
        meta = doc.get("meta", [])
        return QueryResult(
            columns=tuple(m["name"] for m in meta),
            rows=[tuple(r) for r in doc.get("data", [])],
            types=tuple(m["type"] for m in meta),
        )

    def count(self, table_name: str, final: bool = True) -> int:
        """Rows of a table as queries see them (FINAL: duplicates collapsed), or physically stored."""
        t = table(table_name)
        return int(self.query(f"SELECT count() FROM {{db}}.{t.name}{' FINAL' if final else ''}").scalar())

    def counts(self, final: bool = True) -> dict[str, int]:
        """Rows per event table (not the ledger), in one query."""
        suffix = " FINAL" if final else ""
        union = " UNION ALL ".join(
            f"SELECT '{t.name}' AS t, count() AS n FROM {{db}}.{t.name}{suffix}" for t in EVENT_TABLES
        )
        return {name: int(n) for name, n in self.query(union).rows}

    def contains(self, table_name: str, ts_ms: int, event_id: str) -> bool:
        """Whether a row of this event is stored (a primary-key lookup: ts leads the sorting key)."""
        t = table(table_name)
        found = self.query(
            f"SELECT count() FROM {{db}}.{t.name} WHERE ts = fromUnixTimestamp64Milli({{ts_ms:Int64}}, 'UTC') "
            "AND event_id = {event_id:String}",
            {"ts_ms": ts_ms, "event_id": event_id},
        )
        return int(found.scalar()) > 0

    def stored_offsets(self) -> dict[TopicPartition, int]:
        """The ledger: per (topic, partition), the next offset whose rows are not yet stored."""
        result = self.query(
            f"SELECT topic, partition, argMax(next_offset, written_ns) FROM {{db}}.{OFFSETS.name} "
            "GROUP BY topic, partition"
        )
        return {(str(topic), int(p)): int(o) for topic, p, o in result.rows}

    def record_offsets(self, offsets: Mapping[TopicPartition, int], now_ms: int) -> None:
        """Sets the ledger (the latest record per partition wins); call only after the rows below these
        offsets are inserted."""
        written_ns = time.time_ns()
        rows = [
            {"topic": topic, "partition": p, "next_offset": o, "flushed_at": ts_text(now_ms), "written_ns": written_ns}
            for (topic, p), o in sorted(offsets.items())
        ]
        self.insert(OFFSETS.name, rows)

    def compact(self) -> None:
        """Merges every table's parts now (`OPTIMIZE ... FINAL`), so duplicates are gone physically too."""
        for t in TABLES:
            self._command(f"OPTIMIZE TABLE {self.database}.{t.name} FINAL")


class ChdbStore(AnalyticsStore):
    """ClickHouse in-process (chdb) on a database folder that persists across processes.

    chdb runs one embedded server per process, on one folder at a time: close a store before opening
    another path in the same process. Another process holding the folder raises `StoreLockedError`.
    """

    def __init__(self, path: Path, database: str = "sflow", fsync: bool = False, create: bool = True,
                 _cleanup: Path | None = None) -> None:
        super().__init__(database, fsync)
        from chdb import session  # the engine is a ~400 MB library: load it only for this backend

        self.path = Path(path)
        self._cleanup = _cleanup
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self._session: Any = session.Session(str(self.path))
        except RuntimeError as e:
            if held_by_another_process(self.path):
                raise StoreLockedError(
                    f"chdb folder {self.path} is held by another process (a running analytics sink?); "
                    "read a snapshot (ChdbStore.snapshot) or stop that process"
                ) from e
            raise AnalyticsError(f"cannot open chdb at {self.path}: {e}") from e
        self._run("SET output_format_json_quote_64bit_integers = 0", {})
        if create:
            self.create_tables()

    @classmethod
    def snapshot(cls, path: Path, database: str = "sflow") -> ChdbStore:
        """A read-only copy of a folder another process holds. Parts are immutable once in place, so the
        copy is consistent per part; a part mid-merge may be copied twice, which FINAL collapses. The copy
        is deleted when the store is closed."""
        src = Path(path)
        if not src.is_dir():
            raise AnalyticsError(f"no chdb folder at {src}")
        tmp = Path(tempfile.mkdtemp(prefix="sflow-analytics-snapshot-"))
        dst = tmp / "chdb"

        def skip(_dir: str, names: list[str]) -> list[str]:
            return [n for n in names if n == "status" or n.startswith(("tmp_", "delete_tmp_"))]

        try:
            shutil.copytree(src, dst, symlinks=True, ignore=skip)  # Atomic databases link by relative path
        except (OSError, shutil.Error) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise AnalyticsError(f"cannot snapshot {src}: {e}") from e
        return cls(dst, database, create=False, _cleanup=tmp)

    def _run(self, sql: str, params: Mapping[str, Any], fmt: str = "CSV") -> Any:
        if self._session is None:
            raise AnalyticsError(f"chdb store at {self.path} is closed")
        try:
            return self._session.query(sql, fmt, params=dict(params) or None)
        except RuntimeError as e:
            raise AnalyticsError(f"chdb: {e} -- in: {sql[:300]}") from e

    def _command(self, sql: str) -> None:
        self._run(sql, {})

    def _insert_json(self, qualified_table: str, columns: Sequence[str], block: bytes) -> None:
        cols = ", ".join(f"`{c}`" for c in columns)
        self._run(f"INSERT INTO {qualified_table} ({cols}) FORMAT JSONEachRow\n{block.decode()}", {})

    def _query_json(self, sql: str, params: Mapping[str, Any]) -> bytes:
        result = self._run(sql, params, "JSONCompact")
        return bytes(result.bytes())

    def forbid_writes(self) -> None:
        self._run(f"USE {self.database}", {})
        self._run("SET readonly = 1", {})

    def close(self) -> None:
        session, self._session = getattr(self, "_session", None), None
        if session is not None:
            session.close()
        if self._cleanup is not None:
            shutil.rmtree(self._cleanup, ignore_errors=True)
            self._cleanup = None


class ClickHouseServerStore(AnalyticsStore):
    """A ClickHouse server through clickhouse-connect (HTTP interface).

    url: `http[s]://[user[:password]@]host[:port][/database]`; the path, when given, overrides `database`.
    `chdb:///abs/path` selects clickhouse-connect's in-process engine instead of HTTP: the same client calls
    against a real ClickHouse without a server (how the tests drive this backend here).
    """

    def __init__(self, url: str, database: str = "sflow", fsync: bool = False, create: bool = True,
                 connect_timeout_s: float = 10.0) -> None:
        parts = urlsplit(url)
        embedded = parts.scheme == "chdb"
        if not embedded and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise AnalyticsError(f"clickhouse url must be http[s]://host[:port][/database], got {redact(url)!r}")
        super().__init__(database if embedded else parts.path.strip("/") or database, fsync)
        import clickhouse_connect
        from clickhouse_connect.driver.exceptions import ClickHouseError

        self._errors: tuple[type[Exception], ...] = (ClickHouseError,)
        self.url = url
        try:
            if embedded:
                self._client: Any = clickhouse_connect.get_client(dsn=url, settings=_JSON_SETTINGS)
            else:
                self._client = clickhouse_connect.get_client(
                    host=parts.hostname,
                    port=parts.port or (8443 if parts.scheme == "https" else 8123),
                    username=parts.username or "default",
                    password=parts.password or "",
                    secure=parts.scheme == "https",
                    connect_timeout=connect_timeout_s,
                    settings=_JSON_SETTINGS,
                )
        except ClickHouseError as e:
            raise AnalyticsError(f"cannot reach ClickHouse at {redact(url)}: {e}") from e
        if create:
            self.create_tables()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._client is None:
            raise AnalyticsError(f"ClickHouse store at {redact(self.url)} is closed")
        try:
            return fn(*args, **kwargs)
        except self._errors as e:
            raise AnalyticsError(f"ClickHouse {what} failed: {e}") from e

    def _command(self, sql: str) -> None:
        self._call("command", self._client.command, sql)

    def _insert_json(self, qualified_table: str, columns: Sequence[str], block: bytes) -> None:
        self._call("insert", self._client.raw_insert, qualified_table, column_names=list(columns),
                   insert_block=block, fmt="JSONEachRow")

    def _query_json(self, sql: str, params: Mapping[str, Any]) -> bytes:
        out = self._call("query", self._client.raw_query, sql, parameters=dict(params) or None,
                         settings=_JSON_SETTINGS, fmt="JSONCompact")
        return bytes(out)

    def forbid_writes(self) -> None:
        if self._client is None:
            raise AnalyticsError(f"ClickHouse store at {redact(self.url)} is closed")
        self._client.database = self.database
        self._client.set_client_setting("readonly", "1")  # sent with every request from now on

    def close(self) -> None:
        client, self._client = getattr(self, "_client", None), None
        if client is not None:
            client.close()


def held_by_another_process(path: Path) -> bool:
    """Whether a ClickHouse server holds the folder: it keeps an exclusive flock on `status` while running
    (chdb reports only a generic start-up error then)."""
    try:
        f = (path / "status").open("rb")
    except FileNotFoundError:  # never held, or its holder is shutting down (it removes the file)
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)
