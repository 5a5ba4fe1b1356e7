"""The analytics tables: their columns, sorting keys and DDL (rows are built in `infra.analytics.rows`).

Every table is a `ReplacingMergeTree` ordered by time, `ORDER BY (ts, event_id[, item])`: the sorting key
is also the deduplication key, so a row written twice (an event re-read after a sink crash) collapses
into one at merge time and in every `SELECT ... FINAL` (see `infra.analytics` for the query pattern).
Copies of one event carry the same `ts` (it is part of the event), so they always meet in one partition.

Every event row carries the envelope: `ts` (the event's `ts_ms`), `event_id`, `event_type`, `producer`,
`correlation_id`, and where it was read from: `topic`, `partition`, `offset`.

`sink_offsets` is the sink's ledger, not event data: per (topic, partition) the next offset whose rows
are not yet stored, written after the rows themselves. The latest record wins (`written_ns`), not the
highest offset, so a sink that finds the ledger stale (a recreated topic) can move it back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final

from infra.analytics.errors import AnalyticsError

Row = dict[str, Any]
Column = tuple[str, str]

TS_TYPE: Final = "DateTime64(3, 'UTC')"
ENVELOPE: Final[tuple[Column, ...]] = (
    ("ts", TS_TYPE),
    ("event_id", "String"),
    ("event_type", "LowCardinality(String)"),
    ("producer", "LowCardinality(String)"),
    ("correlation_id", "String"),
    ("topic", "LowCardinality(String)"),
    ("partition", "UInt32"),
    ("offset", "UInt64"),
)


@dataclass(frozen=True)
class Table:
    """One analytics table. `columns` are its own, after the envelope (when `envelope` is set)."""

    name: str
    doc: str
    columns: tuple[Column, ...]
    order_by: tuple[str, ...] = ("ts", "event_id")
    envelope: bool = True
    engine: str = "ReplacingMergeTree"
    partition_by: str | None = "toYYYYMM(ts)"

    @property
    def all_columns(self) -> tuple[Column, ...]:
        return (*ENVELOPE, *self.columns) if self.envelope else self.columns

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.all_columns)

    def ddl(self, database: str, fsync: bool = False) -> str:
        cols = ",\n  ".join(f"`{name}` {kind}" for name, kind in self.all_columns)
        partition = f"\nPARTITION BY {self.partition_by}" if self.partition_by else ""
        comment = self.doc.replace("\\", "\\\\").replace("'", "\\'")
        settings = "\nSETTINGS fsync_after_insert = 1, fsync_part_directory = 1" if fsync else ""
        return (
            f"CREATE TABLE IF NOT EXISTS {database}.{self.name} (\n  {cols}\n)\n"
            f"ENGINE = {self.engine}{partition}\nORDER BY ({', '.join(self.order_by)}){settings}\n"
            f"COMMENT '{comment}'"
        )


TABLES: Final[tuple[Table, ...]] = (
    Table("llm_calls", "one row per LLMCall", (
        ("call_id", "String"), ("session_id", "String"), ("agent_id", "LowCardinality(String)"),
        ("task_id", "String"), ("group_id", "String"), ("model", "LowCardinality(String)"), ("turn", "UInt32"),
        ("resource_id", "LowCardinality(String)"),  # of the last segment: where the call finished
        ("prompt_tokens", "UInt32"), ("output_tokens", "UInt32"),
        ("min_version", "Int64"), ("max_version", "Int64"),  # over the output tokens' versions; -1 unknown
        ("drift", "Bool"), ("finish_reason", "LowCardinality(String)"),
        ("request_ms", "Int64"), ("completed_ms", "Int64"), ("latency_ms", "Int64"),
        ("segments", "UInt16"), ("parent_call_id", "String"),
    )),
    Table("llm_call_segments", "one row per engine run (Segment) of an LLMCall", (
        ("segment_index", "UInt16"), ("call_id", "String"), ("session_id", "String"),
        ("agent_id", "LowCardinality(String)"), ("resource_id", "LowCardinality(String)"), ("version", "Int64"),
        ("start", "UInt32"), ("num_tokens", "UInt32"), ("finish_reason", "LowCardinality(String)"),
        ("started_ms", "Int64"), ("ended_ms", "Int64"), ("duration_ms", "Int64"),
    ), order_by=("ts", "event_id", "segment_index")),
    Table("sessions", "SessionStarted and SessionEnded", (
        ("session_id", "String"), ("agent_id", "LowCardinality(String)"), ("task_id", "String"),
        ("group_id", "String"), ("reward", "Float64"), ("status", "LowCardinality(String)"),
        ("num_calls", "UInt32"), ("metadata", "Map(String, String)"),
    )),
    Table("trajectories", "one row per Trajectory (the session's prefix tree, summarised)", (
        ("trajectory_id", "String"), ("session_id", "String"), ("agent_id", "LowCardinality(String)"),
        ("task_id", "String"), ("group_id", "String"), ("reward", "Float64"), ("status", "LowCardinality(String)"),
        ("num_nodes", "UInt32"), ("num_calls", "UInt32"), ("call_ids", "Array(String)"),
        ("tokens_in_calls", "UInt64"), ("tokens_in_tree", "UInt64"), ("generated_tokens", "UInt64"),
        ("min_version", "Int64"), ("max_version", "Int64"),
        ("version_span", "Int64"),  # max_version - min_version: staleness inside the trajectory itself
        ("drift_calls", "UInt32"),
    )),
    Table("batches", "BatchReady: a task group's trajectories are ready for training", (
        ("group_id", "String"), ("task_id", "String"), ("trajectory_ids", "Array(String)"),
        ("num_samples", "UInt32"), ("min_version", "Int64"), ("max_version", "Int64"), ("ready_groups", "UInt32"),
    )),
    Table("tasks", "TaskDispatched and TaskCompleted (the streaming data loader)", (
        ("task_id", "String"), ("group_id", "String"), ("num_samples", "UInt32"), ("payload", "String"),
        ("policy_version", "Int64"), ("seq", "Int64"), ("mean_reward", "Float64"),
        ("status", "LowCardinality(String)"),
    )),
    Table("resources", "ResourceRegistered and ResourceLost", (
        ("resource_id", "LowCardinality(String)"), ("endpoint", "String"), ("device_kind", "LowCardinality(String)"),
        ("num_devices", "UInt32"), ("memory_bytes", "UInt64"), ("hbm_bandwidth", "Float64"),
        ("peak_flops", "Float64"), ("capabilities", "Array(String)"), ("reason", "String"),
    )),
    Table("heartbeats", "Heartbeat of a resource", (
        ("resource_id", "LowCardinality(String)"), ("activity", "LowCardinality(String)"),
        ("weight_version", "Int64"), ("running_requests", "UInt32"), ("queued_requests", "UInt32"),
        ("tokens_generated", "UInt64"),
    )),
    Table("scheduler_events", "TagTransition, Preemption and Assignment (kind: tag | preemption | assignment)", (
        ("kind", "LowCardinality(String)"), ("resource_id", "LowCardinality(String)"),
        ("tag_kind", "LowCardinality(String)"), ("from_tags", "Array(String)"), ("to_tags", "Array(String)"),
        ("from_tag", "LowCardinality(String)"), ("to_tag", "LowCardinality(String)"),  # first tag (activity)
        ("cause", "String"),  # TagTransition.cause or Preemption.reason
        ("preempted_task", "String"), ("by_task", "String"), ("assignment_id", "String"),
        ("task_kind", "LowCardinality(String)"), ("resource_ids", "Array(String)"), ("step", "Int64"),
        ("policy_version", "Int64"),
    )),
    Table("control_events", "PauseRollout, ResumeRollout, LoadWeights and ControlAck", (
        ("resource_id", "LowCardinality(String)"), ("command", "LowCardinality(String)"),
        ("mode", "LowCardinality(String)"), ("reason", "String"), ("version", "Int64"), ("uri", "String"),
        ("sha256", "String"), ("command_id", "String"), ("ok", "Bool"), ("error", "String"),
        ("duration_ms", "Float64"),
    )),
    Table("weights", "WeightsPublished, WeightsLoaded (pause_ms, load_ms on a resource), WeightSyncStarted/Completed", (
        ("model", "LowCardinality(String)"), ("version", "Int64"), ("resource_id", "LowCardinality(String)"),
        ("uri", "String"), ("sha256", "String"), ("step", "Int64"), ("num_bytes", "UInt64"),
        ("pause_ms", "Float64"), ("load_ms", "Float64"), ("sync_id", "String"), ("resource_ids", "Array(String)"),
    )),
    Table("train_steps", "TrainStepStarted and TrainStepCompleted", (
        ("run_id", "LowCardinality(String)"), ("step", "Int64"),
        ("policy_version", "Int64"),  # started: the version trained from; completed: new_version - 1
        ("new_version", "Int64"), ("resource_ids", "Array(String)"), ("num_trajectories", "UInt32"),
        ("num_tokens", "UInt64"), ("loss", "Float64"), ("reward_mean", "Float64"), ("kl", "Float64"),
        ("clip_fraction", "Float64"),
        ("staleness_histogram", "Array(UInt64)"),  # entry k: generated tokens of staleness k (last: beyond bound)
        ("trajectory_ids", "Array(String)"), ("duration_ms", "Float64"),
        ("status", "LowCardinality(String)"), ("entropy", "Float64"), ("response_length_mean", "Float64"),
        ("clip_fraction_low", "Float64"), ("clip_fraction_high", "Float64"), ("truncated_fraction", "Float64"),
        ("zero_variance_fraction", "Float64"), ("filtered_group_ids", "Array(String)"),
        ("collapse_signals", "Array(String)"),
    )),
    Table("evals", "EvalCompleted: held-out accuracy and reward, with the weight versions of its tokens", (
        ("run_id", "LowCardinality(String)"), ("eval_id", "String"), ("step", "Int64"),
        ("trigger", "LowCardinality(String)"), ("num_tasks", "UInt32"), ("accuracy", "Float64"),
        ("reward_mean", "Float64"), ("versions", "Array(Int64)"), ("pinned", "Bool"),
        ("task_ids", "Array(String)"), ("task_scores", "Array(Float64)"), ("task_min_versions", "Array(Int64)"),
        ("task_max_versions", "Array(Int64)"), ("failed", "UInt32"), ("temperature", "Float64"),
        ("tasks_seed", "Int64"), ("duration_ms", "Float64"),
    )),
    Table("train_data", "TrainData: the groups (and their versions) an assignment's train step reads", (
        ("run_id", "LowCardinality(String)"), ("assignment_id", "String"), ("step", "Int64"),
        ("group_ids", "Array(String)"), ("group_versions", "Array(Int64)"), ("final", "Bool"),
    )),
    Table("scheduler_journal", "SchedulerObserved and SchedulerCheckpoint (sizes of the large text fields)", (
        ("run_id", "LowCardinality(String)"), ("seq", "Int64"), ("event_seq", "Int64"), ("num_events", "Int64"),
        ("source_topic", "LowCardinality(String)"), ("source_partition", "Int32"), ("source_offset", "Int64"),
        ("input", "String"), ("observations_bytes", "UInt64"), ("config_bytes", "UInt64"),
        ("state_sha256", "String"), ("state_bytes", "UInt64"),
    )),
    Table("metrics", "MetricSample", (
        ("service", "LowCardinality(String)"), ("resource_id", "LowCardinality(String)"),
        ("name", "LowCardinality(String)"), ("value", "Float64"), ("labels", "Map(String, String)"),
    )),
    Table("dlq", "DeadLetter: undecodable or poison messages (payload summarised)", (
        ("source_topic", "LowCardinality(String)"), ("source_partition", "UInt32"), ("source_offset", "UInt64"),
        ("reason", "String"), ("consumer_group", "LowCardinality(String)"), ("key", "String"),
        ("value_size", "UInt64"), ("value_head_hex", "String"),
    )),
    Table("other_events", "events of a type without a table of its own (newer than this sink), as JSON", (
        ("body", "String"),
    )),
    Table(
        "sink_offsets", "the sink's ledger: next offset per topic partition whose rows are stored",
        (("topic", "LowCardinality(String)"), ("partition", "UInt32"), ("next_offset", "UInt64"),
         ("flushed_at", TS_TYPE), ("written_ns", "UInt64")),
        order_by=("topic", "partition"), envelope=False, engine="ReplacingMergeTree(written_ns)", partition_by=None,
    ),
)
BY_NAME: Final = {t.name: t for t in TABLES}
OFFSETS: Final = BY_NAME["sink_offsets"]
EVENT_TABLES: Final = tuple(t for t in TABLES if t.envelope)


def table(name: str) -> Table:
    try:
        return BY_NAME[name]
    except KeyError:
        raise AnalyticsError(f"no analytics table {name!r}; known: {sorted(BY_NAME)}") from None


def ts_text(ms: int) -> str:
    """Milliseconds since the epoch as ClickHouse DateTime64(3) text in UTC. Text, not a number: ClickHouse
    reads a bare number for a DateTime64 as seconds, and short numeric strings as dates."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}"
