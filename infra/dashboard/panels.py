"""What each dashboard panel shows, as one function per panel over the analytics store.

Every panel is the store's SQL (the canned queries of `infra.analytics.queries` where one answers the
question, else a query here), read with FINAL like every analytics query, and returns plain JSON data: the
page only draws. The functions take an open `AnalyticsStore`, so a test can compare a panel with a direct
query on the same store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from infra.analytics.queries import ACTIVITY_TRANSITIONS_WITH, CANNED
from infra.analytics.store import AnalyticsStore, QueryResult

Panel = dict[str, Any]
HISTOGRAM_BINS: Final = 20
THROUGHPUT_BUCKETS: Final = 60  # time buckets over the run's span: a bucket is span / 60, at least 1 s


def _rows(result: QueryResult) -> list[dict[str, Any]]:
    return result.dicts()


def summary(store: AnalyticsStore) -> Panel:
    """The run at a glance: what has been recorded so far, and the newest train step's reward."""
    counts = store.query("""
SELECT (SELECT count() FROM {db}.trajectories FINAL) AS trajectories,
       (SELECT count() FROM {db}.llm_calls FINAL) AS llm_calls,
       (SELECT sum(num_tokens) FROM {db}.llm_call_segments FINAL) AS generated_tokens,
       (SELECT countIf(event_type = 'TrainStepCompleted') FROM {db}.train_steps FINAL) AS train_steps,
       (SELECT if(count() > 0, max(version), NULL) FROM {db}.weights FINAL WHERE event_type = 'WeightsPublished')
         AS newest_version,
       (SELECT toInt64(max(toUnixTimestamp64Milli(ts))) FROM {db}.llm_calls) AS last_call_ms""").dicts()[0]
    last = store.query("""
SELECT step, reward_mean FROM {db}.train_steps FINAL WHERE event_type = 'TrainStepCompleted'
ORDER BY ts DESC, step DESC LIMIT 1""").dicts()
    counts["last_step"] = last[0]["step"] if last else None
    counts["last_reward"] = last[0]["reward_mean"] if last else None
    return counts


def reward(store: AnalyticsStore) -> Panel:
    """The trainer's mean reward and loss per step, and the rollouts' mean reward per policy version (which
    moves before the first step is done)."""
    rollout = store.query("""
SELECT max_version AS policy_version, count() AS trajectories, round(avg(reward), 4) AS reward
FROM {db}.trajectories FINAL GROUP BY policy_version ORDER BY policy_version""")
    return {"steps": _rows(CANNED["reward"].run(store)), "rollout": _rows(rollout)}


def evaluation(store: AnalyticsStore) -> Panel:
    """Evaluation scores: `MetricSample`s named eval* on the `metrics` topic, one series per name."""
    result = store.query("""
SELECT name, toInt64(toUnixTimestamp64Milli(ts)) AS ms, value FROM {db}.metrics FINAL
WHERE startsWith(name, 'eval') ORDER BY name, ts""")
    series: dict[str, list[list[float]]] = {}
    for row in result.rows:
        series.setdefault(row[0], []).append([row[1], row[2]])
    return {"series": series}


def throughput(store: AnalyticsStore) -> Panel:
    """Rollout tokens/s over time per resource: tokens of the engine segments that ended in each bucket."""
    result = store.query(f"""
WITH (SELECT min(ended_ms) FROM {{db}}.llm_call_segments FINAL) AS t0,
     (SELECT greatest(1000, toInt64(ceil((max(ended_ms) - min(ended_ms)) / {THROUGHPUT_BUCKETS} / 1000)) * 1000)
      FROM {{db}}.llm_call_segments FINAL) AS bucket_ms
SELECT t0 + intDiv(ended_ms - t0, bucket_ms) * bucket_ms AS start_ms, bucket_ms, resource_id AS resource,
       sum(num_tokens) AS tokens, round(sum(num_tokens) * 1000 / bucket_ms, 2) AS tokens_per_s
FROM {{db}}.llm_call_segments FINAL
GROUP BY start_ms, bucket_ms, resource ORDER BY start_ms, resource""")
    return {"buckets": _rows(result)}


def gantt(store: AnalyticsStore) -> Panel:
    """Each resource's activity tags over time (rollout, train, weight_sync, idle, ...), from its
    TagTransitions; the latest activity lasts until the newest scheduler event or heartbeat."""
    result = store.query(f"""
WITH {ACTIVITY_TRANSITIONS_WITH}
SELECT resource, activity, start_ms, if(next_ms < 0, horizon_ms, next_ms) AS end_ms
FROM transitions ORDER BY resource, start_ms""", {"until_ms": 0})
    return {"spans": _rows(result)}


def staleness(store: AnalyticsStore) -> Panel:
    """Tokens trained per staleness (the trainer's histograms), and trajectories per staleness at the step
    that consumed them."""
    return {"tokens": _rows(CANNED["staleness"].run(store)),
            "trajectories": _rows(CANNED["trajectory-staleness"].run(store))}


def response_length(store: AnalyticsStore) -> Panel:
    """LLM calls per output length (equal-width bins up to the longest), with the calls cut at max_tokens
    (finish_reason 'length'), and the mean length per policy version (a collapse shows as growth)."""
    bins = store.query(f"""
WITH (SELECT greatest(1, toUInt32(ceil(max(output_tokens) / {HISTOGRAM_BINS}))) FROM {{db}}.llm_calls FINAL) AS width
SELECT intDiv(output_tokens, width) * width AS lo, width, count() AS calls,
       countIf(finish_reason = 'length') AS cut
FROM {{db}}.llm_calls FINAL GROUP BY lo ORDER BY lo""")
    by_version = store.query("""
SELECT max_version AS policy_version, count() AS calls, round(avg(output_tokens), 1) AS mean_tokens
FROM {db}.llm_calls FINAL GROUP BY policy_version ORDER BY policy_version""")
    return {"bins": _rows(bins), "by_version": _rows(by_version)}


def drift(store: AnalyticsStore) -> Panel:
    """Per agent: calls whose prompt did not extend the session's earlier tokens (the canned `drift`)."""
    return {"agents": _rows(CANNED["drift"].run(store))}


def trajectories(store: AnalyticsStore, limit: int) -> Panel:
    """The newest trajectories, for the session view's picker."""
    result = store.query("""
SELECT trajectory_id, session_id, agent_id, round(reward, 4) AS reward, status, num_calls, min_version,
       max_version, drift_calls, toInt64(toUnixTimestamp64Milli(ts)) AS ms
FROM {db}.trajectories FINAL ORDER BY ts DESC, trajectory_id LIMIT {limit:UInt32}""", {"limit": limit})
    return {"items": _rows(result)}


PANELS: Final[Mapping[str, Callable[[AnalyticsStore], Panel]]] = {
    "summary": summary, "reward": reward, "eval": evaluation, "throughput": throughput, "gantt": gantt,
    "staleness": staleness, "response_length": response_length, "drift": drift,
}


def all_panels(store: AnalyticsStore, trajectory_limit: int) -> dict[str, Panel]:
    """Every panel of one refresh, read from one opened store (one snapshot of a live run)."""
    out = {name: panel(store) for name, panel in PANELS.items()}
    out["trajectories"] = trajectories(store, trajectory_limit)
    return out


def session(store: AnalyticsStore, trajectory_id: str) -> Panel | None:
    """One trajectory's prefix tree: its LLM calls, each under the call its prompt extends, with the output
    tokens' policy versions as runs (one per engine segment). None when the store has no such trajectory."""
    head = store.query("""
SELECT trajectory_id, session_id, agent_id, task_id, group_id, reward, status, num_calls, min_version,
       max_version, tokens_in_calls, tokens_in_tree, drift_calls
FROM {db}.trajectories FINAL WHERE trajectory_id = {id:String} LIMIT 1""", {"id": trajectory_id}).dicts()
    if not head:
        return None
    ids = "SELECT arrayJoin(call_ids) FROM {db}.trajectories FINAL WHERE trajectory_id = {id:String}"
    calls = store.query(f"""
SELECT call_id, parent_call_id, turn, prompt_tokens, output_tokens, drift, finish_reason, min_version,
       max_version, latency_ms, resource_id
FROM {{db}}.llm_calls FINAL WHERE call_id IN ({ids}) ORDER BY request_ms, call_id""", {"id": trajectory_id})
    segments = store.query(f"""
SELECT call_id, start, num_tokens, version, resource_id
FROM {{db}}.llm_call_segments FINAL WHERE call_id IN ({ids}) ORDER BY call_id, segment_index""",
                           {"id": trajectory_id})
    return {**head[0], "calls": prefix_tree(calls.dicts(), segments.dicts())}


def prefix_tree(calls: list[dict[str, Any]], segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Calls in depth-first order of the prefix tree, each with its `depth`, the prompt tokens it adds to
    its parent's prompt + output (`new_prompt_tokens`: what the environment said back; all of the prompt
    for a root or a drifted call), and its `versions`: [start, num_tokens, version] runs over its output.
    A parent outside the trajectory makes a call a root."""
    by_id = {c["call_id"]: c for c in calls}
    children: dict[str, list[dict[str, Any]]] = {}
    roots: list[dict[str, Any]] = []
    for c in calls:
        parent = by_id.get(c["parent_call_id"])
        (children.setdefault(parent["call_id"], []) if parent else roots).append(c)
    runs: dict[str, list[list[int]]] = {}
    for s in segments:
        runs.setdefault(s["call_id"], []).append([s["start"], s["num_tokens"], s["version"]])
    ordered: list[dict[str, Any]] = []

    def visit(call: dict[str, Any], depth: int, parent: dict[str, Any] | None) -> None:
        context = parent["prompt_tokens"] + parent["output_tokens"] if parent else 0
        ordered.append({**call, "depth": depth, "versions": runs.get(call["call_id"], []),
                        "new_prompt_tokens": max(call["prompt_tokens"] - context, 0)})
        for child in children.get(call["call_id"], []):
            visit(child, depth + 1, call)

    for root in roots:
        visit(root, 0, None)
    return ordered
