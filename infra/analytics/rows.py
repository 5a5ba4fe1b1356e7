"""How each event becomes rows in the analytics tables (`infra.analytics.tables`).

The first row of an event is its main row; a few events add detail rows (an LLMCall's segments). Every
row starts with the envelope columns (`ts`, `event_id`, ..., `offset`); a table's own columns that an
event of the table does not have are filled with the table's blank values (-1 for unknown versions and
steps, "" or [] otherwise), so one table can hold the several events of one family. An event type without
a table of its own (one newer than this sink) goes to `other_events` as JSON: no valid event is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from bus.describe import describe
from infra.analytics.tables import Row, ts_text
from schemas import events as ev

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
        "prompt_tokens": e.prompt_len, "output_tokens": len(e.output_ids), "min_version": lo,
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


_STEP_METRICS_BLANK: dict[str, Any] = {
    "entropy": 0.0, "response_length_mean": 0.0, "clip_fraction_low": 0.0, "clip_fraction_high": 0.0,
    "truncated_fraction": 0.0, "zero_variance_fraction": 0.0, "filtered_group_ids": [], "collapse_signals": [],
}


def _train(e: ev.TrainStepStarted | ev.TrainStepCompleted) -> _Rows:
    if isinstance(e, ev.TrainStepStarted):
        return [("train_steps", {
            "run_id": e.run_id, "step": e.step, "policy_version": e.policy_version, "new_version": -1,
            "resource_ids": list(e.resource_ids), "num_trajectories": e.num_trajectories,
            "num_tokens": e.num_tokens, "loss": 0.0, "reward_mean": 0.0, "kl": 0.0, "clip_fraction": 0.0,
            "staleness_histogram": [], "trajectory_ids": [], "duration_ms": 0.0, **_STEP_METRICS_BLANK,
            "status": "started",
        })]
    return [("train_steps", {
        "run_id": e.run_id, "step": e.step, "policy_version": e.new_version - 1, "new_version": e.new_version,
        "resource_ids": [], "num_trajectories": len(e.trajectory_ids), "num_tokens": e.num_tokens,
        "loss": e.loss, "reward_mean": e.reward_mean, "kl": e.kl, "clip_fraction": e.clip_fraction,
        "staleness_histogram": list(e.staleness_histogram), "trajectory_ids": list(e.trajectory_ids),
        "duration_ms": e.duration_ms, "status": e.status, "entropy": e.entropy,
        "response_length_mean": e.response_length_mean, "clip_fraction_low": e.clip_fraction_low,
        "clip_fraction_high": e.clip_fraction_high, "truncated_fraction": e.truncated_fraction,
        "zero_variance_fraction": e.zero_variance_fraction, "filtered_group_ids": list(e.filtered_group_ids),
        "collapse_signals": list(e.collapse_signals),
    })]


def _eval(e: ev.EvalCompleted) -> _Rows:
    return [("evals", {
        "run_id": e.run_id, "eval_id": e.eval_id, "step": e.step, "trigger": e.trigger, "num_tasks": e.num_tasks,
        "accuracy": e.accuracy, "reward_mean": e.reward_mean, "versions": list(e.versions), "pinned": e.pinned,
        "task_ids": list(e.task_ids), "task_scores": list(e.task_scores),
        "task_min_versions": list(e.task_min_versions), "task_max_versions": list(e.task_max_versions),
        "failed": e.failed, "temperature": e.temperature, "tasks_seed": e.tasks_seed, "duration_ms": e.duration_ms,
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
    ev.EvalCompleted: _eval,
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

