"""The analytics tables and how each event becomes rows in them.

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

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from bus.describe import describe
from infra.analytics.errors import AnalyticsError
from schemas import events as ev

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


# --- event -> rows ---------------------------------------------------------------------------

_Rows = list[tuple[str, Row]]


def _version_range(versions: np.ndarray) -> tuple[int, int]:
    known = versions[versions >= 0]
    return (int(known.min()), int(known.max())) if known.size else (-1, -1)


def _llm_call(e: ev.LLMCall) -> _Rows:
    versions = np.asarray(e.output_versions)
    lo, hi = _version_range(versions)
    if lo < 0 and e.segments:
        seg_versions = np.asarray([s.weight_version for s in e.segments])
        lo, hi = _version_range(seg_versions)
    call: Row = {
        "call_id": e.call_id, "session_id": e.session_id, "agent_id": e.agent_id, "task_id": e.task_id,
        "group_id": e.group_id, "model": e.model, "turn": e.turn,
        "resource_id": e.segments[-1].resource_id if e.segments else "",
        "prompt_tokens": len(e.prompt_ids), "output_tokens": len(e.output_ids), "min_version": lo,
        "max_version": hi, "drift": e.drift, "finish_reason": e.finish_reason, "request_ms": e.request_ms,
        "completed_ms": e.completed_ms, "latency_ms": e.completed_ms - e.request_ms,
        "segments": len(e.segments), "parent_call_id": e.parent_call_id,
    }
    rows: _Rows = [("llm_calls", call)]
    for i, s in enumerate(e.segments):
        rows.append(("llm_call_segments", {
            "segment_index": i, "call_id": e.call_id, "session_id": e.session_id, "agent_id": e.agent_id,
            "resource_id": s.resource_id, "version": s.weight_version, "start": s.start,
            "num_tokens": s.num_tokens, "finish_reason": s.finish_reason, "started_ms": s.started_ms,
            "ended_ms": s.ended_ms, "duration_ms": s.ended_ms - s.started_ms,
        }))
    return rows


def _session(e: ev.SessionStarted | ev.SessionEnded) -> _Rows:
    row: Row = {"session_id": e.session_id, "agent_id": e.agent_id, "task_id": e.task_id, "group_id": e.group_id}
    if isinstance(e, ev.SessionEnded):
        row |= {"reward": e.reward, "status": e.status.value, "num_calls": e.num_calls, "metadata": {}}
    else:
        row |= {"reward": 0.0, "status": "", "num_calls": 0, "metadata": dict(e.metadata)}
    return [("sessions", row)]


def _trajectory(e: ev.Trajectory) -> _Rows:
    generated = sum(int(np.asarray(n.loss_mask).sum()) for n in e.nodes)
    return [("trajectories", {
        "trajectory_id": e.trajectory_id, "session_id": e.session_id, "agent_id": e.agent_id,
        "task_id": e.task_id, "group_id": e.group_id, "reward": e.reward, "status": e.status,
        "num_nodes": len(e.nodes), "num_calls": len(e.call_ids), "call_ids": list(e.call_ids),
        "tokens_in_calls": e.tokens_in_calls, "tokens_in_tree": e.tokens_in_tree, "generated_tokens": generated,
        "min_version": e.min_version, "max_version": e.max_version, "version_span": e.max_version - e.min_version,
        "drift_calls": e.drift_calls,
    })]


def _batch(e: ev.BatchReady) -> _Rows:
    return [("batches", {
        "group_id": e.group_id, "task_id": e.task_id, "trajectory_ids": list(e.trajectory_ids),
        "num_samples": e.num_samples, "min_version": e.min_version, "max_version": e.max_version,
        "ready_groups": e.ready_groups,
    })]


def _task(e: ev.TaskDispatched | ev.TaskCompleted) -> _Rows:
    row: Row = {"task_id": e.task_id, "group_id": e.group_id}
    if isinstance(e, ev.TaskCompleted):
        row |= {"num_samples": e.num_samples, "payload": "", "policy_version": -1, "seq": -1,
                "mean_reward": e.mean_reward, "status": e.status}
    else:
        row |= {"num_samples": e.n_samples, "payload": e.payload, "policy_version": e.policy_version,
                "seq": e.seq, "mean_reward": 0.0, "status": "dispatched"}
    return [("tasks", row)]


def _resource(e: ev.ResourceRegistered | ev.ResourceLost) -> _Rows:
    if isinstance(e, ev.ResourceLost):
        return [("resources", {
            "resource_id": e.resource_id, "endpoint": "", "device_kind": "", "num_devices": 0, "memory_bytes": 0,
            "hbm_bandwidth": 0.0, "peak_flops": 0.0, "capabilities": [], "reason": e.reason,
        })]
    return [("resources", {
        "resource_id": e.resource_id, "endpoint": e.endpoint, "device_kind": e.device_kind,
        "num_devices": e.num_devices, "memory_bytes": e.memory_bytes, "hbm_bandwidth": e.hbm_bandwidth,
        "peak_flops": e.peak_flops, "capabilities": list(e.capabilities), "reason": "",
    })]


def _heartbeat(e: ev.Heartbeat) -> _Rows:
    return [("heartbeats", {
        "resource_id": e.resource_id, "activity": e.activity, "weight_version": e.weight_version,
        "running_requests": e.running_requests, "queued_requests": e.queued_requests,
        "tokens_generated": e.tokens_generated,
    })]


_SCHEDULER_BLANK: Final[Row] = {
    "tag_kind": "", "from_tags": [], "to_tags": [], "from_tag": "", "to_tag": "", "cause": "", "preempted_task": "",
    "by_task": "", "assignment_id": "", "task_kind": "", "resource_ids": [], "step": -1, "policy_version": -1,
}


def _scheduler(e: ev.TagTransition | ev.Preemption | ev.Assignment) -> _Rows:
    if isinstance(e, ev.TagTransition):
        specific: Row = {
            "kind": "tag", "resource_id": e.resource_id, "tag_kind": e.tag_kind.value,
            "from_tags": list(e.from_tags), "to_tags": list(e.to_tags),
            "from_tag": e.from_tags[0] if e.from_tags else "", "to_tag": e.to_tags[0] if e.to_tags else "",
            "cause": e.cause,
        }
    elif isinstance(e, ev.Preemption):
        specific = {
            "kind": "preemption", "resource_id": e.resource_id, "cause": e.reason,
            "preempted_task": e.preempted_task, "by_task": e.by_task, "assignment_id": e.assignment_id,
        }
    else:
        specific = {
            "kind": "assignment", "resource_id": e.key if e.resource_ids else "", "assignment_id": e.assignment_id,
            "task_kind": e.task_kind, "resource_ids": list(e.resource_ids), "step": e.step,
            "policy_version": e.policy_version,
        }
    return [("scheduler_events", {**_SCHEDULER_BLANK, **specific})]


_CONTROL_BLANK: Final[Row] = {
    "mode": "", "reason": "", "version": -1, "uri": "", "sha256": "", "command_id": "", "ok": True, "error": "",
    "duration_ms": 0.0,
}


def _control(e: ev.PauseRollout | ev.ResumeRollout | ev.LoadWeights | ev.ControlAck) -> _Rows:
    specific: Row
    if isinstance(e, ev.PauseRollout):
        specific = {"command": "PauseRollout", "mode": e.mode.value, "reason": e.reason}
    elif isinstance(e, ev.ResumeRollout):
        specific = {"command": "ResumeRollout", "reason": e.reason}
    elif isinstance(e, ev.LoadWeights):
        specific = {"command": "LoadWeights", "version": e.version, "uri": e.uri, "sha256": e.sha256}
    else:
        specific = {
            "command": e.command, "command_id": e.command_id, "ok": e.ok, "error": e.error,
            "duration_ms": e.duration_ms,
        }
    return [("control_events", {**_CONTROL_BLANK, "resource_id": e.resource_id, **specific})]


_WEIGHTS_BLANK: Final[Row] = {
    "resource_id": "", "uri": "", "sha256": "", "step": -1, "num_bytes": 0, "pause_ms": 0.0, "load_ms": 0.0,
    "sync_id": "", "resource_ids": [],
}


def _weights(e: ev.WeightsPublished | ev.WeightsLoaded | ev.WeightSyncStarted | ev.WeightSyncCompleted) -> _Rows:
    specific: Row
    if isinstance(e, ev.WeightsPublished):
        specific = {"uri": e.uri, "sha256": e.sha256, "step": e.step, "num_bytes": e.num_bytes}
    elif isinstance(e, ev.WeightsLoaded):
        specific = {"resource_id": e.resource_id, "pause_ms": e.pause_ms, "load_ms": e.load_ms}
    else:
        specific = {"sync_id": e.sync_id, "resource_ids": list(e.resource_ids)}
    return [("weights", {**_WEIGHTS_BLANK, "model": e.model, "version": e.version, **specific})]


def _train(e: ev.TrainStepStarted | ev.TrainStepCompleted) -> _Rows:
    if isinstance(e, ev.TrainStepStarted):
        return [("train_steps", {
            "run_id": e.run_id, "step": e.step, "policy_version": e.policy_version, "new_version": -1,
            "resource_ids": list(e.resource_ids), "num_trajectories": e.num_trajectories,
            "num_tokens": e.num_tokens, "loss": 0.0, "reward_mean": 0.0, "kl": 0.0, "clip_fraction": 0.0,
            "staleness_histogram": [], "trajectory_ids": [], "duration_ms": 0.0,
        })]
    return [("train_steps", {
        "run_id": e.run_id, "step": e.step, "policy_version": e.new_version - 1, "new_version": e.new_version,
        "resource_ids": [], "num_trajectories": len(e.trajectory_ids), "num_tokens": e.num_tokens,
        "loss": e.loss, "reward_mean": e.reward_mean, "kl": e.kl, "clip_fraction": e.clip_fraction,
        "staleness_histogram": list(e.staleness_histogram), "trajectory_ids": list(e.trajectory_ids),
        "duration_ms": e.duration_ms,
    })]


def _train_data(e: ev.TrainData) -> _Rows:
    return [("train_data", {
        "run_id": e.run_id, "assignment_id": e.assignment_id, "step": e.step, "group_ids": list(e.group_ids),
        "group_versions": list(e.group_versions), "final": e.final,
    })]


def _journal(e: ev.SchedulerObserved | ev.SchedulerCheckpoint) -> _Rows:
    if isinstance(e, ev.SchedulerObserved):
        row: Row = {
            "seq": e.seq, "num_events": e.num_events, "source_topic": e.source_topic,
            "source_partition": e.source_partition, "source_offset": e.source_offset, "input": e.input,
            "observations_bytes": len(e.observations.encode()), "config_bytes": 0, "state_sha256": "",
            "state_bytes": 0,
        }
    else:
        row = {
            "seq": e.observed_seq, "num_events": 0, "source_topic": "", "source_partition": -1, "source_offset": -1,
            "input": "", "observations_bytes": 0, "config_bytes": len(e.config.encode()),
            "state_sha256": e.state_sha256, "state_bytes": len(e.state.encode()),
        }
    return [("scheduler_journal", {"run_id": e.run_id, "event_seq": e.event_seq, **row})]


def _other(e: ev.Event) -> _Rows:
    return [("other_events", {"body": json.dumps(describe(e), default=str, separators=(",", ":"))})]


def _metric(e: ev.MetricSample) -> _Rows:
    return [("metrics", {
        "service": e.service, "resource_id": e.resource_id, "name": e.name, "value": e.value,
        "labels": dict(e.labels),
    })]


_VALUE_HEAD: Final = 256


def _dead_letter(e: ev.DeadLetter) -> _Rows:
    value = e.value or b""
    return [("dlq", {
        "source_topic": e.source_topic, "source_partition": e.source_partition, "source_offset": e.source_offset,
        "reason": e.reason, "consumer_group": e.consumer_group,
        "key": (e.key_bytes or b"").decode("utf-8", "replace"), "value_size": len(value),
        "value_head_hex": value[:_VALUE_HEAD].hex(),
    })]


_BUILDERS: Final[dict[type[ev.Event], Callable[[Any], _Rows]]] = {
    ev.LLMCall: _llm_call, ev.SessionStarted: _session, ev.SessionEnded: _session, ev.Trajectory: _trajectory,
    ev.BatchReady: _batch, ev.TaskDispatched: _task, ev.TaskCompleted: _task, ev.ResourceRegistered: _resource,
    ev.ResourceLost: _resource, ev.Heartbeat: _heartbeat, ev.TagTransition: _scheduler, ev.Preemption: _scheduler,
    ev.Assignment: _scheduler, ev.PauseRollout: _control, ev.ResumeRollout: _control, ev.LoadWeights: _control,
    ev.ControlAck: _control, ev.WeightsPublished: _weights, ev.WeightsLoaded: _weights,
    ev.TrainStepStarted: _train, ev.TrainStepCompleted: _train, ev.MetricSample: _metric,
    ev.DeadLetter: _dead_letter, ev.TrainData: _train_data, ev.SchedulerObserved: _journal,
    ev.SchedulerCheckpoint: _journal, ev.WeightSyncStarted: _weights, ev.WeightSyncCompleted: _weights,
}


def rows_of(event: ev.Event, topic: str, partition: int, offset: int) -> list[tuple[str, Row]]:
    """(table, row) pairs for one event read from `topic`/`partition`/`offset`; the first is its main row.
    An event type without a table of its own goes to `other_events`, so no valid event is ever refused."""
    builder = _BUILDERS.get(type(event), _other)
    envelope: Row = {
        "ts": ts_text(event.ts_ms), "event_id": event.event_id, "event_type": event.event_type,
        "producer": event.producer, "correlation_id": event.correlation_id, "topic": topic,
        "partition": partition, "offset": offset,
    }
    return [(name, {**envelope, **row}) for name, row in builder(event)]

