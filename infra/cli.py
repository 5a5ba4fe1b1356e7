"""`sflow`: the operator's command line (stack, events, replay, analytics, dashboard, simulator, export)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from bus.describe import describe, matches
from bus.errors import BusError
from infra.analytics.queries import CANNED, Query
from infra.analytics.sql import OutputFormat

if TYPE_CHECKING:
    from infra.analytics.config import AnalyticsConfig

app = typer.Typer(help="SeamlessFlow: event-sourced RL post-training for LLM agents.", no_args_is_help=True)
events_app = typer.Typer(help="Read events from the bus.", no_args_is_help=True)
app.add_typer(events_app, name="events")
# One command per service state that can be rebuilt from the bus (`replay scheduler`, ...).
replay_app = typer.Typer(
    help="Rebuild a service's state from its topics and check it against what was recorded.", no_args_is_help=True
)
app.add_typer(replay_app, name="replay")
console = Console()
err_console = Console(stderr=True)


@app.command()
def up(nodes: Annotated[int, typer.Option(help="1, or 3 for the fault-test cluster (RF 3, min ISR 2)")] = 1) -> None:
    """Start the local Kafka cluster (KRaft) and create the catalog topics."""
    from infra import stack

    config = stack.up(nodes)
    console.print(f"Kafka up at [bold]{config.bootstrap_servers}[/], topics prefixed '{config.topic_prefix}'")


@app.command()
def down() -> None:
    """Stop everything `sflow up` started."""
    from infra import stack

    stopped = stack.down()
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@app.command()
def status() -> None:
    """Brokers, topics with their end offsets, and consumer-group lag."""
    from confluent_kafka import Consumer, TopicPartition

    from bus.admin import admin_client
    from bus.topics import CATALOG
    from infra import stack

    c = stack.running_cluster()
    if c is None:
        console.print("Kafka is not running (start it with `sflow up` or `make up`)")
        raise typer.Exit(1)
    config = stack.bus_config()
    admin = admin_client(config)
    md = admin.list_topics(timeout=10)
    console.print(f"brokers: {', '.join(f'{b.id}@{b.host}:{b.port}' for b in md.brokers.values())}")
    table = Table("topic", "partitions", "events")
    probe = Consumer({"bootstrap.servers": config.bootstrap_servers, "group.id": "sflow-status"})
    for spec in CATALOG:
        name = config.topic(spec.name)
        meta = md.topics.get(name)
        if meta is None:
            table.add_row(name, "-", "missing")
            continue
        total = 0
        for p in meta.partitions:
            low, high = probe.get_watermark_offsets(TopicPartition(name, p), timeout=5)
            total += high - low
        table.add_row(name, str(len(meta.partitions)), str(total))
    probe.close()
    console.print(table)
    groups = admin.list_consumer_groups().result()
    for g in sorted(groups.valid, key=lambda g: g.group_id):
        console.print(f"consumer group {g.group_id} ({g.state})")


def _resolved(event: Any, prompts: Any) -> tuple[Any, dict[str, str]]:
    """The event to show, and a note: an LLMCall recorded by reference is shown whole when `prompts` (a
    `schemas.prompt_refs.PromptResolver`) can resolve it, else as recorded, with why it could not."""
    from schemas.events import LLMCall
    from schemas.prompt_refs import UnresolvedPromptError

    if not isinstance(event, LLMCall):
        return event, {}
    try:
        return prompts.resolve(event), {}
    except UnresolvedPromptError as e:
        return event, {"unresolved": str(e)}


@events_app.command("tail")
def tail(
    topic: Annotated[str, typer.Argument(help="catalog topic, e.g. llm.calls, scheduler, control")],
    from_beginning: Annotated[bool, typer.Option("--from-beginning", help="start at the oldest event")] = False,
    session: Annotated[str | None, typer.Option(help="only events of this session")] = None,
    resource: Annotated[str | None, typer.Option(help="only events about this resource")] = None,
    event_type: Annotated[str | None, typer.Option("--type", help="only this event type")] = None,
    limit: Annotated[int, typer.Option(help="stop after this many events (0: no limit)")] = 0,
    idle_exit: Annotated[float, typer.Option(help="stop after this many idle seconds (0: never)")] = 0.0,
) -> None:
    """Print decoded events of TOPIC as they arrive, one JSON object per line."""
    from bus.consumer import EventConsumer, Received, unique_group
    from bus.kit import run_until_signalled
    from bus.topics import spec
    from infra import stack
    from schemas.prompt_refs import PromptResolver

    spec(topic)
    config = stack.bus_config("sflow-tail")
    offset_reset = "earliest" if from_beginning else "latest"
    settings: dict[str, Any] = {"auto.offset.reset": offset_reset}
    consumer = EventConsumer(config, unique_group("sflow-tail"), [topic], **settings)
    prompts = PromptResolver()
    shown = 0
    last = time.monotonic()

    def follow(stop: threading.Event) -> None:
        def show(r: Received) -> None:
            nonlocal shown
            if limit and shown >= limit:
                return  # the rest of the batch that reached the limit
            event, note = _resolved(r.event, prompts)
            if matches(event, session, resource, event_type):
                print(json.dumps({"offset": f"{r.partition}:{r.offset}", **describe(event), **note}), flush=True)
                shown += 1
                if limit and shown >= limit:
                    stop.set()

        def idle_check(batch: list[Received]) -> None:
            nonlocal last
            # idle counts from the group's assignment: joining a fresh broker's group takes seconds
            if batch or not consumer.assigned():
                last = time.monotonic()
            if idle_exit and time.monotonic() - last > idle_exit:
                stop.set()

        # A throwaway group: nothing to commit; an error ends the command.
        consumer.run(show, stop, on_batch=idle_check, on_error="raise", commit=False)

    try:
        run_until_signalled(follow, signals=(signal.SIGINT,))
    except BusError as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    finally:
        consumer.close()


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def sim(ctx: typer.Context) -> None:
    """Run the cluster simulator: the scheduler core on a modelled cluster (`sflow sim --help` lists options)."""
    from scheduler_svc.sim import main as sim_main

    raise typer.Exit(sim_main(list(ctx.args)))


@replay_app.command("scheduler")
def replay_scheduler(
    run_id: Annotated[str, typer.Option(help="run whose journal to replay")] = "run-0",
    start: Annotated[
        int | None, typer.Option("--from", help="check recorded states from this `scheduler` offset (or ms, --time)")
    ] = None,
    end: Annotated[
        int | None, typer.Option("--to", help="rebuild up to this offset (or ms, --time), exclusive; default: the end")
    ] = None,
    by_time: Annotated[bool, typer.Option("--time", help="--from / --to are timestamps in ms since the epoch")] = False,
    dataset: Annotated[
        Path | None, typer.Option(help="the run's task dataset, if it moved since it was recorded")
    ] = None,
    show_state: Annotated[bool, typer.Option("--show-state", help="print the rebuilt state as JSON")] = False,
) -> None:
    """Rebuild the scheduler of a run from its journal and diff it with every recorded state in range."""
    from infra import stack
    from scheduler_svc.errors import SchedulerError
    from scheduler_svc.service import replay_scheduler as replay_journal

    try:
        report = replay_journal(stack.bus_config("sflow-replay"), run_id, start=start, end=end, by_time=by_time,
                                dataset=dataset)
    except (SchedulerError, BusError) as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    table = Table("offset", "records", "recorded state", "differences")
    shown = [c for c in report.checks if not c.matches][:20] or report.checks[-5:]  # mismatches, else the last
    for check in shown:
        table.add_row(str(check.offset), str(check.observed_seq), "matches" if check.matches else "[red]differs[/]",
                      "\n".join(check.differences[:10]))
    console.print(table)
    typer.echo(f"run {report.run_id}: {report.records} journal records replayed, {len(report.checks)} recorded "
               f"states checked, {'all match' if report.ok else 'MISMATCH'}")
    if show_state:
        print(json.dumps(report.state, indent=1, sort_keys=True))
    if not report.ok:
        raise typer.Exit(1)


@replay_app.command("trajectories")
def replay_trajectories(
    start: Annotated[int | None, typer.Option("--from", help="start of the range: offset (or ms with --time)")] = None,
    end: Annotated[int | None, typer.Option("--to", help="end of the range, exclusive: offset (or ms, --time)")] = None,
    by_time: Annotated[bool, typer.Option("--time", help="--from / --to are timestamps in ms since the epoch")] = False,
    producer: Annotated[str, typer.Option(help="producer id the processor stamps on trajectories")] = "",
) -> None:
    """Rebuild trajectories from `llm.calls` + `sessions` and diff them byte for byte with the recorded ones."""
    from agents_adapter.processor.config import ProcessorConfig
    from agents_adapter.processor.replay import replay_trajectories as rebuild
    from bus.replay import ReplayRange
    from infra import stack

    rng = ReplayRange(start_ms=start, end_ms=end) if by_time else ReplayRange(start_offset=start, end_offset=end)
    bus = stack.bus_config("sflow-replay")
    config = ProcessorConfig(bus=bus, producer=producer) if producer else ProcessorConfig(bus=bus)
    try:
        report = rebuild(config, rng)
    except BusError as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    typer.echo(report.render())
    if not report.ok:
        raise typer.Exit(1)


# `sflow analytics`: the canned queries (one subcommand each), `sql` for anything else, `tables` for the columns.
analytics_app = typer.Typer(help="Query a run's analytics store: canned questions, or your own read-only SQL.",
                            invoke_without_command=True)
app.add_typer(analytics_app, name="analytics")
RunOption = Annotated[
    str | None, typer.Option("--run", help="run folder, or a run name under runs/ (`demo`: the newest demo-<time>)")
]
DataDirOption = Annotated[
    Path | None, typer.Option(help="folder of the chdb store (default: SFLOW_ANALYTICS_DIR, else var/analytics)")
]


@contextmanager
def _analytics_errors() -> Iterator[None]:
    """Store and query failures as one line on stderr and exit status 2, not a traceback."""
    from pydantic import ValidationError

    from infra.analytics.errors import AnalyticsError

    try:
        yield
    except (AnalyticsError, ValidationError) as e:
        message = " ".join(str(e).split())
        err_console.print(f"[red]error:[/] {message[:600]}{'...' if len(message) > 600 else ''}", soft_wrap=True)
        raise typer.Exit(2) from e


def _analytics_config(run: str | None, data_dir: Path | None) -> AnalyticsConfig:
    from infra.analytics.sql import store_config
    from infra.kafka.cluster import REPO_ROOT

    return store_config(run, data_dir, REPO_ROOT / "runs")


@analytics_app.callback()
def analytics(ctx: typer.Context) -> None:
    """Answer a throughput/utilisation/staleness question from the analytics store (no subcommand: list them)."""
    from infra.analytics.queries import render_catalog

    if ctx.invoked_subcommand is None:
        console.print(render_catalog())
        console.print("and: sflow analytics sql \"SELECT ...\" (read-only), sflow analytics tables (their columns)")


def _canned_command(query: Query) -> Callable[..., None]:
    def run_canned(
        params: Annotated[list[str] | None, typer.Argument(help="query parameters as key=value")] = None,
        run: RunOption = None,
        data_dir: DataDirOption = None,
    ) -> None:
        from infra.analytics.config import open_store
        from infra.analytics.queries import parse_params, render

        with _analytics_errors():
            bound = parse_params(params or [])
            with open_store(_analytics_config(run, data_dir), read_only=True) as store:
                console.print(render(query.run(store, **bound)))

    return run_canned


for _query in CANNED.values():
    analytics_app.command(_query.name, help=f"{_query.title}. {_query.meaning}", short_help=_query.title)(
        _canned_command(_query))


@analytics_app.command("sql")
def analytics_sql(
    statement: Annotated[str, typer.Argument(help="one SELECT / WITH / SHOW / DESCRIBE / EXPLAIN statement")],
    run: RunOption = None,
    data_dir: DataDirOption = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="table (aligned text), csv, or json")] = (
        OutputFormat.TABLE
    ),
) -> None:
    """Run your own read-only SQL on the store; tables are in the store's database (`sflow analytics tables`)."""
    from infra.analytics.sql import RENDERERS, query_read_only

    with _analytics_errors():
        result = query_read_only(_analytics_config(run, data_dir), statement)
    typer.echo(RENDERERS[output](result), nl=False)


@analytics_app.command("tables")
def analytics_tables() -> None:
    """The analytics tables and their columns (Markdown, as in docs/operations.md)."""
    from infra.analytics.sql import tables_reference

    typer.echo(tables_reference(), nl=False)


@app.command()
def dashboard(
    run: RunOption = None,
    data_dir: DataDirOption = None,
    port: Annotated[int, typer.Option(help="HTTP port (0: any free port)")] = 8765,
    host: Annotated[str, typer.Option(help="address to bind (0.0.0.0: reachable from other machines)")] = "127.0.0.1",
    refresh_s: Annotated[float, typer.Option(help="seconds between the page's refreshes")] = 3.0,
) -> None:
    """Serve a live web dashboard of a run's analytics store (finished, or still running: it refreshes)."""
    import uvicorn

    from infra.dashboard.app import create_app
    from infra.dashboard.config import DashboardConfig
    from infra.dashboard.errors import DashboardConfigError

    with _analytics_errors():
        store = _analytics_config(run, data_dir)
    title = store.data_dir.parent.name if run is not None else str(store.data_dir)
    try:
        config = DashboardConfig(store=store, title=title, host=host, port=port, refresh_s=refresh_s)
    except DashboardConfigError as e:
        err_console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    err_console.print(f"dashboard of {config.store.data_dir} at http://{host}:{port}/ (Ctrl-C stops it)")
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=config.log_level)


@app.command()
def train(
    config: Annotated[Path, typer.Option("--config", help="run config (YAML), e.g. infra/configs/demo.yaml")],
) -> None:
    """Run a training job described by a YAML file through every service, then stop them."""
    from infra.demo import run
    from infra.errors import InfraError
    from infra.launcher import stop_on_sigterm
    from infra.run_config import RunConfig

    stop_on_sigterm()  # a job stopped by `kill` or `timeout` stops its services and broker too
    try:
        run(RunConfig.load(config))
    except InfraError as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e


@app.command()
def export(
    run: Annotated[str, typer.Option("--run", help="run folder, or a run name under runs/ (as analytics --run)")],
    out: Annotated[Path, typer.Option("--out", help="directory to write (new, or empty)")],
    version: Annotated[int | None, typer.Option(help="trained version to export (default: the newest)")] = None,
) -> None:
    """Write a run's trained policy as a Hugging Face model directory (docs/export.md)."""
    from infra.export import ExportError, export_policy, resolve_run
    from infra.kafka.cluster import REPO_ROOT

    try:  # a refusal: one line on stderr, exit status 2
        written = export_policy(resolve_run(run, REPO_ROOT / "runs"), out, version)
    except ExportError as e:
        err_console.print(f"[red]error:[/] {e}", soft_wrap=True)
        raise typer.Exit(2) from e
    console.print(f"version {written.version} (step {written.step}, sha256 {written.sha256[:12]}) written to "
                  f"{written.out_dir}: {', '.join(written.files)}", soft_wrap=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
