"""The main job (`make demo`, `sflow train --config FILE`): a short agentic RL run through every service.

It starts Kafka (unless one is running), makes the default model and warms it up on the example's
demonstrations, writes the example's tasks file (infra/run_inputs.py), launches the services —
analytics sink, trajectory processor, scheduler, N inference resources pinned to their cores,
trainer, capture proxy, rollout workers running the example's agent through the OpenAI client (the
config's `example`: the calculator in `infra/configs/demo.yaml`) — and follows the run on the bus
with progress bars. At the end it prints a summary, draws charts under the run folder, and stops everything.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bus.admin import ensure_topics
from bus.config import BusConfig
from bus.ports import free_port
from infra import stack
from infra.errors import InfraError
from infra.evaluator import evaluator_of
from infra.kafka.cluster import REPO_ROOT, KafkaCluster
from infra.launcher import Launcher, ServiceSpec, stop_on_sigterm
from infra.monitor import RunMonitor, RunProgress, RunState
from infra.phases import PhaseClock, setup_phases
from infra.prometheus import write_scrape_config
from infra.run_config import RunConfig, RunSection
from infra.run_inputs import RunPaths, prepare_model, write_eval_tasks, write_tasks
from infra.scalars import ScalarWriter
from infra.summary import StopReason, summarise

log = logging.getLogger("sflow.demo")
console = Console()
MODEL_NAME = "sflow-default"
ENGINE_PREFIX = "infer-"  # service names of the inference engines: infer-<resource id>


def _adapter_stats(specs: list[ServiceSpec], admin_key: str) -> dict[str, object]:
    """The proxy's own counters (calls served, recorded), read before it stops.

    The proxy is drained first: a call whose agent has gone may still be generating (or be paused for
    a train step), and it is recorded when it finishes; the counters are read once none is in flight.
    The sessions the stopped agents left open are then ended (aborted), so that every recorded call
    ends up in a trajectory.
    """
    import httpx

    adapter = next(s for s in specs if s.name == "adapter")
    base = (adapter.health_url or "").removesuffix("/health")
    auth = {"Authorization": f"Bearer {admin_key}"}
    try:
        drained = httpx.post(f"{base}/admin/drain", headers=auth, timeout=70,
                             json={"stop_accepting": True, "timeout_s": 60, "end_sessions": True})
        if drained.status_code != 200 or drained.json().get("inflight"):
            log.warning("proxy not drained", extra={"reply": drained.text[:200]})
        reply = httpx.get(f"{base}/admin/stats", headers=auth, timeout=10)
        return dict(reply.json()) if reply.status_code == 200 else {"error": reply.text}
    except httpx.HTTPError as e:
        return {"error": str(e)}


def _inference_specs(config: RunConfig, paths: RunPaths, env: dict[str, str]) -> dict[str, ServiceSpec]:
    """One inference service per resource (by resource id), pinned to its cores."""
    all_cpus = sorted(os.sched_getaffinity(0))
    specs = {}
    for i, r in enumerate(config.inference.resources):
        port = free_port()
        cpus = [c % len(all_cpus) for c in r.cpus] or all_cpus
        # Declared roofline numbers: the train-capable resource is the compute-rich one, so the
        # spatiotemporal policy places the train tag on it (the trainer is pinned to its cores).
        flops = "2e12" if "train" in r.capabilities else "1e12"
        args = ["--model-path", str(paths.model), "--weights-root", str(paths.weights), "--port", str(port),
                "--resource-id", r.id, "--join-bus",
                "--served-model-name", MODEL_NAME, "--peak-flops", flops, "--hbm-bandwidth", "2e10",
                "--max-running-requests", str(config.inference.max_running_requests), "--seed", str(config.seed + i),
                "--heartbeat-interval-s", "2"]
        for cap in r.capabilities:
            args += ["--capability", cap]
        specs[r.id] = ServiceSpec(f"{ENGINE_PREFIX}{r.id}", "inference_svc", tuple(args), env, cpus=cpus,
                                  health_url=f"http://127.0.0.1:{port}/health",
                                  metrics_url=f"http://127.0.0.1:{port}/metrics")
    return specs


def _trainer_spec(config: RunConfig, paths: RunPaths, env: dict[str, str],
                  inference: dict[str, ServiceSpec]) -> ServiceSpec:
    """The trainer, pinned to the first train-capable resource's cores."""
    train_ids = [r.id for r in config.inference.resources if "train" in r.capabilities]
    train_cpus = inference[train_ids[0]].cpus if train_ids else None
    recipe = paths.root / "trainer.yaml"  # the run config's trainer section, as the service reads it
    recipe.write_text(yaml.safe_dump(config.trainer.service_values(), sort_keys=False))
    trainer_args = ["--run-id", config.name, "--base-model-dir", str(paths.model), "--weights-root",
                    str(paths.weights), "--model-name", MODEL_NAME, "--config", str(recipe)]
    for rid in train_ids:
        trainer_args += ["--resource-id", rid]
    metrics_args, metrics_url = _metrics_port()
    return ServiceSpec("trainer", "trainer_svc", (*trainer_args, *metrics_args),
                       {**env, "DS_ACCELERATOR": "cpu",
                        "TORCH_EXTENSIONS_DIR": str(REPO_ROOT / ".cache" / "torch_extensions")},
                       cpus=train_cpus or None, metrics_url=metrics_url)


def _metrics_port() -> tuple[tuple[str, ...], str]:
    """The flags and scrape url of a metrics port for a service without HTTP of its own."""
    port = free_port()
    return ("--metrics-port", str(port)), f"http://127.0.0.1:{port}/metrics"


def _adapter_spec(paths: RunPaths, env: dict[str, str], inference: dict[str, ServiceSpec], port: int,
                  api_key: str, admin_key: str) -> ServiceSpec:
    """The capture proxy, routing to every inference resource."""
    adapter_args = ["--model-path", str(paths.model), "--port", str(port),
                    "--served-model-name", MODEL_NAME,
                    # sessions (owners, call counts, ends) survive a restart of the proxy
                    "--session-store-path", str(paths.root / "adapter-sessions.sqlite")]
    for rid, spec in inference.items():
        adapter_args += ["--endpoint", f"{rid}={(spec.health_url or '').removesuffix('/health')}"]
    return ServiceSpec("adapter", "agents_adapter.proxy", tuple(adapter_args),
                       {**env, "SFLOW_ADAPTER_API_KEYS": f"demo-agent={api_key}",
                        "SFLOW_ADAPTER_ADMIN_KEY": admin_key},
                       health_url=f"http://127.0.0.1:{port}/health", metrics_url=f"http://127.0.0.1:{port}/metrics")


def _rollout_specs(config: RunConfig, paths: RunPaths, env: dict[str, str], adapter_port: int,
                   api_key: str) -> list[ServiceSpec]:
    """The rollout workers, running the config's example, and its evaluator when `eval.enabled`."""
    agent, example = config.agent, config.example
    specs = [ServiceSpec("rollout-workers", "infra.rollout_workers", (
        # `--api-key=KEY`: a random key may begin with "-", which argparse would take for an option
        "--base-url", f"http://127.0.0.1:{adapter_port}/v1", f"--api-key={api_key}", "--model", MODEL_NAME,
        "--concurrency", str(agent.concurrency), "--max-turns", str(agent.max_turns),
        "--max-tokens", str(agent.max_tokens), "--temperature", str(agent.temperature),
        *(["--ignore-eos"] if agent.ignore_eos else []),
        "--agent", example.agent, "--task", example.task or "", "--reward", example.reward), env)]
    if config.eval.enabled:
        specs.insert(0, evaluator_of(config, paths.eval_tasks, f"http://127.0.0.1:{adapter_port}/v1", api_key,
                                     MODEL_NAME, env))
    return specs


def service_specs(
    config: RunConfig, paths: RunPaths, bus: BusConfig, api_key: str, admin_key: str
) -> list[ServiceSpec]:
    env = {
        "SFLOW_BOOTSTRAP": bus.bootstrap_servers,
        "SFLOW_TOPIC_PREFIX": bus.topic_prefix,
        "SFLOW_REPLICATION": str(bus.replication_factor),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    sched = config.scheduler
    inference = _inference_specs(config, paths, env)
    (processor_flags, processor_url), (scheduler_flags, scheduler_url) = _metrics_port(), _metrics_port()
    specs = [
        # A consumer group of its own per run: the sink's static membership would otherwise get back
        # the previous run's assignment (its topics) and never see this run's events.
        # Inserts every 5 s, not every second: on the demo's two cores the sink's CPU went from 7-8 % of the
        # machine to 2-3 % (bench/pipeline_e2e.py's CPU table), and nothing reads its rows mid-run.
        ServiceSpec("analytics", "infra.analytics", ("--data-dir", str(paths.analytics), "--flush-interval-s", "5",
                                                     "--group-id", f"sflow-analytics.{paths.root.name}"), env),
        ServiceSpec("trajectories", "agents_adapter.processor",
                    ("--data-dir", str(paths.root / "faust"), "--group-size", str(sched.samples_per_task),
                     "--tick-interval-s", "1", "--group-instance-id", "trajectories-0", *processor_flags),
                    env, metrics_url=processor_url),
        *inference.values(),
    ]
    specs.append(ServiceSpec("scheduler", "scheduler_svc", (
        "--dataset", str(paths.tasks), "--policy", sched.policy, "--train-resources", str(sched.train_resources),
        "--train-batch-groups", str(sched.train_batch_groups), "--samples-per-task", str(sched.samples_per_task),
        "--max-staleness", str(sched.max_staleness), "--run-id", config.name, "--model", MODEL_NAME, "--instance-id",
        "scheduler-0", "--dynamic-sampling-extra-groups", str(sched.dynamic_sampling_extra_groups),
        "--initial-weights-uri", f"file://{paths.model}", "--state-file", str(paths.root / "scheduler-state.json"),
        *scheduler_flags), env, metrics_url=scheduler_url))
    adapter_port = free_port()
    specs += [_trainer_spec(config, paths, env, inference),
              _adapter_spec(paths, env, inference, adapter_port, api_key, admin_key),
              *_rollout_specs(config, paths, env, adapter_port, api_key)]
    return specs


def start_groups(specs: Sequence[ServiceSpec]) -> list[list[ServiceSpec]]:
    """The services in start order, consecutive inference engines in one group: they need nothing of each
    other and load their models at once (one engine's start was ~7 s of the job's start-up)."""
    groups: list[list[ServiceSpec]] = []
    for spec in specs:
        if groups and spec.name.startswith(ENGINE_PREFIX) and groups[-1][-1].name.startswith(ENGINE_PREFIX):
            groups[-1].append(spec)
        else:
            groups.append([spec])
    return groups


@dataclass(frozen=True)
class RunResult:
    """Where a run left its files and events, and what the capture proxy counted."""

    root: Path
    bus: BusConfig
    adapter_stats: dict[str, object]
    state: RunState


def run(
    config: RunConfig,
    runs_root: Path | None = None,
    cluster: KafkaCluster | None = None,
    faults: Sequence[Fault] = (),
    on_started: Callable[[Path], None] | None = None,
) -> RunResult:
    """Runs one job end to end. Kafka: `cluster` if given (left running), else the local stack's
    (started and stopped here unless it was already up). `on_started(run folder)` runs once every
    service is up, while the job runs (the folder has `prometheus.yml`, the run's scrape config)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    paths = RunPaths((runs_root or REPO_ROOT / "runs") / f"{config.name}-{stamp}")
    paths.root.mkdir(parents=True, exist_ok=True)
    cluster = cluster or stack.cluster(config.kafka.nodes)
    started_kafka = not cluster.running()
    launcher = Launcher(paths.root)
    monitor: RunMonitor | None = None
    clock = PhaseClock(setup_phases(os.environ))
    try:
        with clock.phase("Kafka start"):
            if started_kafka:
                with console.status("starting Kafka (KRaft)"):
                    cluster.start()
            bus = BusConfig(bootstrap_servers=cluster.bootstrap_servers, topic_prefix=f"{config.name}-{stamp}.",
                            client_id="demo", replication_factor=cluster.replication_factor)
            ensure_topics(bus)
        with clock.phase("model + warm-up"):
            prepare_model(config, paths)
        write_tasks(config, paths)
        write_eval_tasks(config, paths)
        api_key, admin_key = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
        scalars = ScalarWriter(paths.root / "tensorboard", paths.root.name, config.run.wandb_project
                               ) if config.run.tensorboard else None
        monitor = RunMonitor(bus, config.name, scalars)
        monitor.start()
        specs = service_specs(config, paths, bus, api_key, admin_key)
        write_scrape_config(paths.root / "prometheus.yml", specs)
        with clock.phase("services start + start eval"):
            for group in start_groups(specs):
                with console.status(f"starting {', '.join(s.name for s in group)}"):
                    if group[0].name == "rollout-workers" and config.eval.enabled:  # after the start eval (v0)
                        monitor.wait_eval(0, config.eval.start_timeout_s)
                    launcher.start_together(group)
        if on_started is not None:
            on_started(paths.root)
        with clock.phase("RL (train steps)"):
            ended_by = follow(config, monitor, launcher, cluster, faults)
        with clock.phase("end eval + drain + stop"):
            adapter_stats = wind_down(config, launcher, monitor, specs, admin_key)
        summarise(config, paths, monitor, ended_by, clock)
        return RunResult(paths.root, bus, adapter_stats, monitor.snapshot())
    finally:
        launcher.stop_all()
        if monitor is not None:
            monitor.stop()
        if started_kafka:
            cluster.stop()


def wind_down(config: RunConfig, launcher: Launcher, monitor: RunMonitor, specs: list[ServiceSpec],
              admin_key: str) -> dict[str, object]:
    """The end of a run: agents stopped, the end evaluation, the proxy drained (its counters returned), every
    recorded call in a trajectory, the services stopped and the monitor's last events read."""
    launcher.stop("rollout-workers")
    if config.eval.enabled and monitor.progress().steps >= config.run.max_steps:  # the end evaluation
        monitor.wait_eval(config.run.max_steps, config.eval.end_timeout_s)
    adapter_stats = _adapter_stats(specs, admin_key)
    if unassembled := monitor.wait_assembled(60.0):
        log.warning("calls in no trajectory at shutdown", extra={"calls": unassembled})
    launcher.stop_all()
    monitor.drain(5.0)
    return adapter_stats


@dataclass(frozen=True)
class Fault:
    """Fault injection for tests: once the run has `at_step` train steps, SIGKILL `target` (a service
    name, restarted at once, or "kafka-node-N", left down)."""

    at_step: int
    target: str


def inject(fault: Fault, launcher: Launcher, cluster: KafkaCluster) -> None:
    if fault.target.startswith("kafka-node-"):
        node = cluster.nodes[int(fault.target.rsplit("-", 1)[1]) - 1]
        cluster.stop_node(node, kill=True)
    else:
        launcher.kill(fault.target)
        launcher.restart(fault.target)
    log.warning("fault injected", extra={"target": fault.target, "at_step": fault.at_step})


def stop_reason(state: RunState | RunProgress, run: RunSection, now_ms: int, since_ms: int) -> StopReason | None:
    """Why a run that `follow` has watched since `since_ms` ends now, or None while it goes on."""
    if state.steps >= run.max_steps:
        return StopReason.MAX_STEPS
    if now_ms - since_ms >= run.max_minutes * 60_000:
        return StopReason.MAX_MINUTES
    if now_ms - max(state.progress_ms, since_ms) >= run.stall_minutes * 60_000:
        return StopReason.STALLED
    return None


def follow(config: RunConfig, monitor: RunMonitor, launcher: Launcher, cluster: KafkaCluster,
           faults: Sequence[Fault] = ()) -> StopReason:
    """Progress bars until the run has done its steps, its time is up or it stalled; returns which."""
    since_ms = int(time.time() * 1000)
    pending = sorted(faults, key=lambda f: f.at_step)
    restarts: Counter[str] = Counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), console=console) as progress:
        steps = progress.add_task("train steps", total=config.run.max_steps, info="")
        rollout = progress.add_task("rollout", total=None, info="")
        while True:
            s = monitor.progress()
            progress.update(steps, completed=min(s.steps, config.run.max_steps),
                            info=f"policy v{s.version}  reward {s.last_reward:.2f}")
            progress.update(rollout, info=f"{s.tokens_per_s:,.0f} tok/s  calls {s.calls}  sessions {s.trajectories}"
                                          f"  ready groups {s.ready_groups}")
            restart_exited(launcher, restarts, config.run.max_restarts)
            while pending and s.steps >= pending[0].at_step:
                inject(pending.pop(0), launcher, cluster)
            if reason := stop_reason(s, config.run, int(time.time() * 1000), since_ms):
                break
            time.sleep(1.0)
    if reason == StopReason.STALLED:
        log.warning("run stalled: nothing completed, stopping it", extra={
            "steps": s.steps, "stall_minutes": config.run.stall_minutes})
    return reason


def restart_exited(launcher: Launcher, restarts: Counter[str], max_restarts: int) -> None:
    """Supervision: a service that exited (a fatal Kafka client error, a crash) is started again, as an
    orchestrator would; every service recovers its state on a restart (the fault tests kill each one)."""
    for name in [n for n in launcher.specs if n not in launcher.running()]:
        if restarts[name] >= max_restarts:
            # the log's tail in the message: a CI run keeps the test's output, not the run directory
            proc = launcher.procs[name]
            raise InfraError(f"service {name} exited {restarts[name] + 1} times, last with status {proc.returncode}; "
                             f"see {proc.log}, which ends:\n{proc.tail(25)}")
        restarts[name] += 1
        log.warning("service exited: restarting it", extra={"target": name, "restarts": restarts[name]})
        launcher.restart(name)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m infra.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path(__file__).with_name("configs") / "demo.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level="WARNING")
    stop_on_sigterm()
    run(RunConfig.load(args.config))


if __name__ == "__main__":
    main()
