"""Canned analytics queries: `CANNED[name].run(store, **params)` -> rows with a title; `render` -> rich table.

Query pattern: every query reads its tables with `FINAL`, so rows an interrupted sink wrote twice count
once (see `infra.analytics`). `{db}` is the store's database; `{name:Type}` are parameters with the
defaults in `Query.params` (the CLI passes overrides as `name=value`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from rich.table import Table as RichTable

from infra.analytics.errors import AnalyticsError
from infra.analytics.store import AnalyticsStore, QueryResult
from infra.analytics.tables import EVENT_TABLES


@dataclass(frozen=True)
class Query:
    """A named query. `meaning` says what its rows are; `params` holds each parameter's default, whose
    Python type (int, float, str) is what an override given as text is converted to."""

    name: str
    title: str
    meaning: str
    sql: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def bind(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(overrides) - set(self.params))
        if unknown:
            raise AnalyticsError(f"query {self.name!r} has no parameter {unknown}; it takes {sorted(self.params)}")
        bound = dict(self.params)
        for key, value in overrides.items():
            kind = type(self.params[key])
            try:
                bound[key] = kind(value)
            except (TypeError, ValueError) as e:
                raise AnalyticsError(f"{self.name}: {key}={value!r} is not a {kind.__name__}") from e
        return bound

    def run(self, store: AnalyticsStore, **overrides: Any) -> QueryResult:
        result = store.query(self.sql, self.bind(overrides))
        return QueryResult(result.columns, result.rows, self.title, result.types)


def parse_params(pairs: Sequence[str]) -> dict[str, str]:
    """`["bucket_s=30", ...]` (CLI arguments) -> {"bucket_s": "30"}."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise AnalyticsError(f"query parameter must be name=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


# Activities that are not work: the bubble is time idle; weight_sync and offline are shown on their own.
_NOT_WORK: Final = "('idle', 'weight_sync', 'offline')"

_THROUGHPUT_COLUMNS: Final = """
    count() AS segments,
    sum(num_tokens) AS tokens,
    round((max(ended_ms) - min(started_ms)) / 1000, 3) AS span_s,
    round(sum(num_tokens) * 1000 / nullIf(max(ended_ms) - min(started_ms), 0), 2) AS tokens_per_s,
    round(sum(num_tokens) * 1000 / nullIf(sum(duration_ms), 0), 2) AS tokens_per_s_per_request"""

_EVENT_COUNTS_SQL: Final = "SELECT * FROM (\n" + "\nUNION ALL\n".join(
    f"SELECT '{t.name}' AS table, (SELECT count() FROM {{db}}.{t.name} FINAL) AS rows, "
    f"(SELECT count() FROM {{db}}.{t.name}) AS stored_rows"
    for t in EVENT_TABLES
) + "\n) ORDER BY table"

# Shared by `utilisation` and the dashboard's Gantt: the CTE `transitions` (resource, activity, start_ms,
# next_ms: -1 for the latest) and `horizon_ms`, where the latest activity is taken to end (until_ms, else
# the newest scheduler event or heartbeat). Put after WITH; takes the parameter until_ms.
ACTIVITY_TRANSITIONS_WITH: Final = """
  transitions AS (
    SELECT resource_id AS resource, to_tag AS activity, toUnixTimestamp64Milli(ts) AS start_ms,
           leadInFrame(toUnixTimestamp64Milli(ts), 1, toInt64(-1)) OVER (
             PARTITION BY resource_id ORDER BY ts, offset ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) AS next_ms
    FROM {db}.scheduler_events FINAL
    WHERE kind = 'tag' AND tag_kind = 'activity'
  ),
  toInt64(ifNull((SELECT if({until_ms:Int64} > 0, {until_ms:Int64}, greatest(
     (SELECT toInt64(max(toUnixTimestamp64Milli(ts))) FROM {db}.scheduler_events),
     (SELECT toInt64(max(toUnixTimestamp64Milli(ts))) FROM {db}.heartbeats)))), 0)) AS horizon_ms"""

_QUERIES: Final[tuple[Query, ...]] = (
    Query(
        "rollout-throughput",
        "Rollout tokens/s per resource",
        "Per resource, over its LLM-call segments (engine runs): generated tokens, the wall span from the "
        "first segment's start to the last one's end, tokens/s over that span, and tokens/s per request "
        "(tokens over the summed segment durations: concurrent requests overlap).",
        f"SELECT resource_id AS resource,{_THROUGHPUT_COLUMNS}\n"
        "FROM {db}.llm_call_segments FINAL GROUP BY resource ORDER BY resource",
    ),
    Query(
        "rollout-throughput-by-version",
        "Rollout tokens/s per policy version",
        "As rollout-throughput, grouped by the weight version the segment ran with.",
        f"SELECT version AS policy_version,{_THROUGHPUT_COLUMNS}\n"
        "FROM {db}.llm_call_segments FINAL GROUP BY policy_version ORDER BY policy_version",
    ),
    Query(
        "utilisation",
        "Utilisation and bubble per resource over time",
        "From activity TagTransitions: each resource holds an activity from one transition to its next "
        "(the last until until_ms, default the newest scheduler event or heartbeat). Per bucket_s time bucket "
        "and resource: observed seconds and the share of them in work (rollout, train, reference, critic) = "
        "utilisation, idle = bubble, and the rollout, train, weight_sync, offline shares. Time before a "
        "resource's first transition is not observed.",
        f"""
WITH
{ACTIVITY_TRANSITIONS_WITH},
  toInt64({{bucket_s:UInt32}}) * 1000 AS bucket_ms_len,
  pieces AS (
    SELECT resource, activity, bucket_ms,
           least(end_ms, bucket_ms + bucket_ms_len) - greatest(start_ms, bucket_ms) AS ms
    FROM (SELECT resource, activity, start_ms, if(next_ms < 0, horizon_ms, next_ms) AS end_ms FROM transitions)
    ARRAY JOIN range(intDiv(start_ms, bucket_ms_len) * bucket_ms_len, greatest(end_ms, start_ms), bucket_ms_len)
      AS bucket_ms
  )
SELECT fromUnixTimestamp64Milli(bucket_ms, 'UTC') AS bucket, resource,
       round(sum(ms) / 1000, 3) AS observed_s,
       round(sumIf(ms, activity NOT IN {_NOT_WORK}) / sum(ms), 4) AS utilisation,
       round(sumIf(ms, activity = 'idle') / sum(ms), 4) AS bubble,
       round(sumIf(ms, activity = 'rollout') / sum(ms), 4) AS rollout,
       round(sumIf(ms, activity = 'train') / sum(ms), 4) AS train,
       round(sumIf(ms, activity = 'weight_sync') / sum(ms), 4) AS weight_sync,
       round(sumIf(ms, activity = 'offline') / sum(ms), 4) AS offline
FROM pieces
WHERE ms > 0
GROUP BY bucket_ms, resource
ORDER BY bucket_ms, resource""",
        {"bucket_s": 60, "until_ms": 0},
    ),
    Query(
        "weight-sync",
        "Weight-sync pauses per version",
        "Per model and weight version: when it was published, how many resources loaded it, their rollout "
        "pause (mean, median, max ms) and load time (mean ms), the span from publish to the last load, and "
        "the scheduler's sync duration (WeightSyncStarted to WeightSyncCompleted).",
        """
SELECT model, version,
       if(countIf(published) > 0, minIf(ts, published), NULL) AS published_at,
       countIf(loaded) AS loads,
       if(loads > 0, round(avgIf(pause_ms, loaded), 1), NULL) AS mean_pause_ms,
       if(loads > 0, round(quantileExactInclusiveIf(0.5)(pause_ms, loaded), 1), NULL) AS p50_pause_ms,
       if(loads > 0, round(maxIf(pause_ms, loaded), 1), NULL) AS max_pause_ms,
       if(loads > 0, round(avgIf(load_ms, loaded), 1), NULL) AS mean_load_ms,
       if(countIf(published) > 0 AND loads > 0, maxIf(ms, loaded) - minIf(ms, published), NULL)
         AS publish_to_last_load_ms,
       if(countIf(sync_started) > 0 AND countIf(sync_done) > 0, maxIf(ms, sync_done) - minIf(ms, sync_started), NULL)
         AS sync_ms
FROM (
  SELECT model, version, ts, toUnixTimestamp64Milli(ts) AS ms, pause_ms, load_ms,
         event_type = 'WeightsPublished' AS published, event_type = 'WeightsLoaded' AS loaded,
         event_type = 'WeightSyncStarted' AS sync_started, event_type = 'WeightSyncCompleted' AS sync_done
  FROM {db}.weights FINAL
)
GROUP BY model, version
ORDER BY model, version""",
    ),
    Query(
        "staleness",
        "Token staleness in training (trainer histograms)",
        "The element-wise sum of every TrainStepCompleted staleness histogram: generated tokens trained "
        "per staleness (policy version trained from minus the token's version); with a staleness bound "
        "the last entry counts the tokens beyond it (masked out).",
        """
SELECT idx - 1 AS staleness, tokens, round(tokens / sum(tokens) OVER (), 4) AS fraction
FROM (
  SELECT sumForEach(staleness_histogram) AS h
  FROM {db}.train_steps FINAL
  WHERE event_type = 'TrainStepCompleted'
)
ARRAY JOIN h AS tokens, arrayEnumerate(h) AS idx
ORDER BY staleness""",
    ),
    Query(
        "trajectory-staleness",
        "Trajectory staleness at consumption",
        "Each trajectory a TrainStepCompleted consumed, joined to its Trajectory row: staleness = the "
        "version the step trained from (new_version - 1) minus the trajectory's oldest token version; count "
        "and share of trajectories per staleness, and the mean staleness of their newest token.",
        """
SELECT c.consumed_version - t.min_version AS staleness,
       count() AS trajectories,
       round(count() / sum(count()) OVER (), 4) AS fraction,
       round(avg(c.consumed_version - t.max_version), 2) AS mean_newest_staleness
FROM (
  SELECT arrayJoin(trajectory_ids) AS trajectory_id, new_version - 1 AS consumed_version
  FROM {db}.train_steps FINAL
  WHERE event_type = 'TrainStepCompleted'
) AS c
INNER JOIN (SELECT trajectory_id, min_version, max_version FROM {db}.trajectories FINAL) AS t
  USING (trajectory_id)
GROUP BY staleness
ORDER BY staleness""",
    ),
    Query(
        "drift",
        "Token drift per agent",
        "Per agent: LLM calls, calls whose prompt could not be built from the session's earlier tokens "
        "(drift: the agent edited history, the tree forks), drift rate, sessions, sessions with a drift.",
        """
SELECT agent_id AS agent, count() AS calls, countIf(drift) AS drift_calls,
       round(countIf(drift) / count(), 4) AS drift_rate,
       uniqExact(session_id) AS sessions, uniqExactIf(session_id, drift) AS sessions_with_drift
FROM {db}.llm_calls FINAL
GROUP BY agent
ORDER BY drift_calls DESC, agent""",
    ),
    Query(
        "reward",
        "Reward and loss per train step",
        "Per run and step (TrainStepCompleted): the new policy version, mean reward, loss, KL, clip "
        "fraction, tokens and trajectories trained on, and the step's duration.",
        """
SELECT run_id AS run, step, new_version, round(reward_mean, 4) AS reward, round(loss, 4) AS loss,
       round(kl, 5) AS kl, round(clip_fraction, 4) AS clip_fraction, num_tokens AS tokens,
       num_trajectories AS trajectories, round(duration_ms, 1) AS duration_ms
FROM {db}.train_steps FINAL
WHERE event_type = 'TrainStepCompleted'
ORDER BY run, step""",
    ),
    Query(
        "health",
        "Is the run collapsing: the collapse guard's metrics per train step",
        "Per run and step (TrainStepCompleted): token entropy, mean response length, the shares of truncated "
        "sessions and of zero-variance groups, the clip fraction per side, the groups dynamic sampling "
        "filtered and what the collapse guard said (docs/training.md, 'The collapse guard').",
        """
SELECT run_id AS run, step, round(reward_mean, 4) AS reward, round(entropy, 4) AS entropy,
       round(response_length_mean, 1) AS response_length, round(truncated_fraction, 3) AS truncated,
       round(zero_variance_fraction, 3) AS zero_variance, round(clip_fraction_low, 4) AS clip_low,
       round(clip_fraction_high, 4) AS clip_high, round(kl, 5) AS kl, length(filtered_group_ids) AS filtered,
       arrayStringConcat(collapse_signals, '; ') AS collapse
FROM {db}.train_steps FINAL
WHERE event_type = 'TrainStepCompleted' AND status != 'skipped'
ORDER BY run, step""",
    ),
    Query(
        "eval",
        "Held-out accuracy per evaluation, with the weight versions it measured",
        "Per run and evaluation (EvalCompleted): the train steps done, why it ran (start / every / end), "
        "accuracy and reward on the held-out tasks (greedy), the weight versions of its tokens (pinned: "
        "one version) and the sessions that failed.",
        """
SELECT run_id AS run, step, trigger, round(accuracy, 4) AS accuracy, round(reward_mean, 4) AS reward,
       arrayStringConcat(arrayMap(v -> toString(v), versions), ', ') AS versions, pinned,
       num_tasks AS tasks, failed, round(duration_ms / 1000, 1) AS seconds
FROM {db}.evals FINAL
ORDER BY run, step""",
    ),
    Query(
        "scheduler",
        "Scheduler decisions per resource",
        "Per resource: preemptions it suffered, SPMD assignments it took part in, activity and capability "
        "tag transitions.",
        """
SELECT resource, countIf(kind = 'preemption') AS preemptions, countIf(kind = 'assignment') AS assignments,
       countIf(kind = 'tag' AND tag_kind = 'activity') AS activity_transitions,
       countIf(kind = 'tag' AND tag_kind = 'capability') AS capability_transitions
FROM {db}.scheduler_events FINAL
ARRAY JOIN if(kind = 'assignment' AND notEmpty(resource_ids), resource_ids, [resource_id]) AS resource
GROUP BY resource
ORDER BY resource""",
    ),
    Query(
        "event-counts",
        "Rows per analytics table",
        "Per event table: rows as queries see them (FINAL: duplicates collapsed) and rows physically "
        "stored (more only after a sink crash, until the next merge).",
        _EVENT_COUNTS_SQL,
    ),
)

CANNED: Final[dict[str, Query]] = {q.name: q for q in _QUERIES}


def canned(name: str) -> Query:
    try:
        return CANNED[name]
    except KeyError:
        raise AnalyticsError(f"no canned query {name!r}; known: {', '.join(CANNED)}") from None


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.4f}".rstrip("0").rstrip(".") if not value.is_integer() else f"{value:,.0f}"
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    return str(value)


def render_catalog() -> RichTable:
    """The canned queries with their titles and parameters (for `sflow analytics --list`)."""
    table = RichTable("query", "title", "parameters (defaults)", title="Canned analytics queries")
    for q in CANNED.values():
        table.add_row(q.name, q.title, ", ".join(f"{k}={v}" for k, v in q.params.items()) or "-")
    return table


def render(result: QueryResult) -> RichTable:
    """A rich table of a query's rows (numbers right-aligned, None as '-')."""
    table = RichTable(title=result.title or None)
    numeric = [
        bool(result.rows) and all(isinstance(r[i], (int, float)) or r[i] is None for r in result.rows)
        for i in range(len(result.columns))
    ]
    for name, is_number in zip(result.columns, numeric, strict=True):
        table.add_column(name, justify="right" if is_number else "left")
    for row in result.rows:
        table.add_row(*(_cell(v) for v in row))
    if not result.rows:
        table.caption = "no rows"
    return table
