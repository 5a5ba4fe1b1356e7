"""Analytics: every catalog topic as typed rows in ClickHouse, and canned queries over them.

- `tables`: the tables (ReplacingMergeTree, `ORDER BY (ts, event_id[, item])`) and event -> rows.
- `store`: `AnalyticsStore` with `ChdbStore` (in-process, default) and `ClickHouseServerStore` backends.
- `sink`: the consumer that writes rows, then its offset ledger, then commits Kafka offsets.
- `queries`: `CANNED` named queries and `render` (used by `sflow analytics <query>`).
- `python -m infra.analytics`: runs the sink (`config.AnalyticsConfig`).

Exactly once, as seen by queries: the sink commits Kafka offsets only after the rows are in the store,
so a crash never loses an event; a re-read event is skipped when the store's ledger (`sink_offsets`)
says it is stored, and otherwise written again with the same sorting key, which the ReplacingMergeTree
collapses. So read tables with FINAL:

    SELECT agent_id, countIf(drift) FROM sflow.llm_calls FINAL GROUP BY agent_id

(or `OPTIMIZE TABLE ... FINAL` / `AnalyticsStore.compact()` first, then plain SELECTs). Without FINAL a
count can exceed the events only for a sink killed between inserting rows and recording its ledger,
until the background merge of those parts.
"""
