"""The scheduler service (`python -m scheduler_svc`) against a real broker.

Scripted inputs produce exactly the expected decision events (read back in decision order through the
journal); SIGKILL + restart rebuilds the same state from the topics and re-emits nothing; the loader
neither loses nor repeats tasks across a crash in mid-stream; a batch cut between its journal records
and its decisions is completed exactly once on restart; `sflow replay scheduler` agrees.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bus.config import BusConfig
from bus.consumer import EventConsumer, unique_group
from bus.producer import EventProducer
from scheduler_svc.canonical import decision_event_id
from scheduler_svc.config import SchedulerServiceConfig
from scheduler_svc.errors import ConfigError, ReplayError
from scheduler_svc.journal import Source
from scheduler_svc.rebuild import new_scheduler, rebuild
from scheduler_svc.service import read_journal
from schemas import events as ev
from schemas.packed import Float32s, Int32s, UInt8s
from tests.service_process import ServiceProcess

REPO = Path(__file__).resolve().parents[2]
RUN = "run-t"
INSTANCE = "scheduler-t"
DECISION_TOPICS = ("scheduler", "control", "resources", "tasks", "weights", "train")
JOURNAL_TYPES = (ev.SchedulerObserved, ev.SchedulerCheckpoint)
E = TypeVar("E", bound=ev.Event)


# --- helpers -----------------------------------------------------------------------------------


def write_dataset(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": f"question {i}"}) + "\n" for i in range(n)))
    return path


class Service(ServiceProcess):
    """`python -m scheduler_svc` with the test run's settings."""

    def __init__(self, bus: BusConfig, tmp: Path, dataset: Path, **options: object) -> None:
        self.state_file = tmp / "state.json"
        super().__init__("scheduler_svc", bus, tmp / "scheduler.log", {
            "dataset": dataset, "run-id": RUN, "instance-id": INSTANCE, "train-batch-groups": 2,
            "samples-per-task": 2, "max-inflight-samples-per-resource": 4, "heartbeat-timeout-s": 3600,
            "model": "m", "initial-weights-uri": "file:///w0", "snapshot-interval-s": 0,
            "state-file": self.state_file, "tick-interval-s": 0.2, **options,
        })

    def wait_consuming(self, timeout_s: float = 60.0) -> str:
        """Until this start rebuilt its state and started consuming; returns this start's log."""
        return self.wait_for_log("scheduler consuming", timeout_s)

    def dump_state(self) -> dict[str, Any]:
        out = subprocess.run([*self.command(), "--dump-state"], cwd=REPO, env=self.environment(), capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        state: dict[str, Any] = json.loads(out.stdout)
        return state

    def saved_state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.state_file.read_text())
        return state


def config_of(bus: BusConfig, dataset: Path) -> SchedulerServiceConfig:
    """The service config the subprocess runs with (for in-process rebuilds)."""
    return SchedulerServiceConfig.build(
        bus=bus, dataset=dataset, run_id=RUN, instance_id=INSTANCE, train_batch_groups=2, samples_per_task=2,
        max_inflight_samples_per_resource=4, heartbeat_timeout_s=3600, model="m", initial_weights_uri="file:///w0",
    )


def wait_observed(bus: BusConfig, records: int, service: Service, timeout_s: float = 60.0) -> list[ev.Event]:
    """The journal once a checkpoint confirms `records` journal records (their decisions are out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        journal = [r.event for r in read_journal(bus, RUN)]
        done = [e.observed_seq for e in journal if isinstance(e, ev.SchedulerCheckpoint)]
        if done and done[-1] >= records:
            assert done[-1] == records, f"{done[-1]} records journaled, expected {records}"
            return journal
        assert service.proc is not None and service.proc.poll() is None, f"service exited:\n{service.tail()}"
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint of {records} records after {timeout_s}s:\n{service.tail()}")


class Decisions:
    """The scheduler's decision events (journal records excluded), collected from the decision topics
    as they are published; duplicates are kept, so a re-emitted decision shows."""

    def __init__(self, bus: BusConfig) -> None:
        self.consumer = EventConsumer(bus, unique_group("decisions"), DECISION_TOPICS)
        self.events: list[ev.Event] = []

    def collect(self, seconds: float) -> list[ev.Event]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._poll()
        return self.events

    def until(self, ids: Iterable[str], timeout_s: float = 30.0) -> list[ev.Event]:
        wanted = set(ids)
        deadline = time.monotonic() + timeout_s
        while not wanted <= {e.event_id for e in self.events} and time.monotonic() < deadline:
            self._poll()
        return self.events

    def _poll(self) -> None:
        for r in self.consumer.poll(0.2):
            if r.event.producer == INSTANCE and not isinstance(r.event, JOURNAL_TYPES):
                self.events.append(r.event)

    def of_type(self, cls: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, cls)]

    def close(self) -> None:
        self.consumer.close()


def in_decision_order(decisions: Decisions, journal: list[ev.Event]) -> list[ev.Event]:
    """The decision events the journal accounts for, in decision order; each must be published once."""
    ids = [decision_event_id(RUN, e.event_seq + i) for e in journal if isinstance(e, ev.SchedulerObserved)
           for i in range(e.num_events)]
    published = decisions.until(ids)
    copies = Counter(e.event_id for e in published)
    by_id = {e.event_id: e for e in published}
    assert [i for i in ids if copies[i] != 1] == [], "decision events missing or published twice"
    assert len(published) == len(ids), "published decision events the journal does not account for"
    return [by_id[i] for i in ids]


def brief(e: ev.Event) -> tuple[str, str, str, str]:
    """(type, resource(s), cause, detail) of a decision event."""
    if isinstance(e, ev.TagTransition):
        return ("TagTransition", e.resource_id, e.cause,
                f"{e.tag_kind}:{','.join(e.from_tags)}>{','.join(e.to_tags)}")
    if isinstance(e, ev.Assignment):
        return ("Assignment", ",".join(e.resource_ids), json.loads(e.payload)["cause"], e.task_kind)
    if isinstance(e, ev.Preemption):
        return ("Preemption", e.resource_id, e.reason, f"{e.preempted_task}>{e.by_task}")
    if isinstance(e, ev.PauseRollout):
        return ("PauseRollout", e.resource_id, e.reason, str(e.mode))
    if isinstance(e, ev.ResumeRollout):
        return ("ResumeRollout", e.resource_id, e.reason, "")
    if isinstance(e, ev.ResourceLost):
        return ("ResourceLost", e.resource_id, e.reason, "")
    if isinstance(e, ev.LoadWeights):
        return ("LoadWeights", e.resource_id, "", f"v{e.version} {e.uri}")
    if isinstance(e, ev.WeightSyncStarted | ev.WeightSyncCompleted):
        return (e.event_type, ",".join(e.resource_ids), "", f"v{e.version}")
    if isinstance(e, ev.TaskDispatched | ev.TaskCompleted):
        return (e.event_type, "", "", e.group_id)
    if isinstance(e, ev.TrainData):
        return ("TrainData", "", "", ",".join(e.group_ids) + (" final" if e.final else ""))
    raise AssertionError(f"unexpected decision event {e}")


def registered(rid: str) -> ev.ResourceRegistered:
    # no declared numbers: the scheduler takes the H800 preset
    return ev.ResourceRegistered(resource_id=rid, endpoint=f"http://{rid}", device_kind="H800", memory_bytes=0,
                                 hbm_bandwidth=0.0, peak_flops=0.0, correlation_id=rid)


def trajectory(group: str, k: int, reward: float, version: int = 0) -> ev.Trajectory:
    node = ev.TrajectoryNode(node_id=0, parent=-1, token_ids=Int32s([1, 2, 3, 4, 5]), loss_mask=UInt8s([0, 0, 1, 1, 1]),
                             logprobs=Float32s([0.0] * 5), versions=Int32s([-1, -1, version, version, version]))
    return ev.Trajectory(trajectory_id=f"{group}/{k}", session_id=f"{group}/s{k}", agent_id="a", task_id=group[:2],
                         group_id=group, reward=reward, status="completed", nodes=(node,), min_version=version,
                         max_version=version, tokens_in_calls=5, tokens_in_tree=5, correlation_id=group)


def batch_ready(group: str, n: int = 2) -> ev.BatchReady:
    return ev.BatchReady(group_id=group, task_id=group.split("@")[0], trajectory_ids=tuple(f"{group}/{k}" for k in
                         range(n)), num_samples=n, min_version=0, max_version=0, correlation_id=group)


def step_done(step: int, version: int) -> ev.TrainStepCompleted:
    return ev.TrainStepCompleted(run_id=RUN, step=step, new_version=version, loss=0.1, reward_mean=0.5, kl=0.0,
                                 clip_fraction=0.0, num_tokens=12, duration_ms=5.0, correlation_id=RUN)


def published(version: int, step: int) -> ev.WeightsPublished:
    return ev.WeightsPublished(model="m", version=version, uri=f"file:///w{version}", sha256=f"sha{version}",
                               step=step, correlation_id="m")


def loaded(rid: str, version: int) -> ev.WeightsLoaded:
    return ev.WeightsLoaded(model="m", resource_id=rid, version=version, pause_ms=1.0, load_ms=2.0,
                            correlation_id=rid)


def rollout_on(rid: str, cause: str) -> list[tuple[str, str, str, str]]:
    return [("TagTransition", rid, cause, "activity:idle>rollout"), ("Assignment", rid, cause, "rollout"),
            ("ResumeRollout", rid, cause, "")]


def dispatched(*groups: str) -> list[tuple[str, str, str, str]]:
    return [("TaskDispatched", "", "", g) for g in groups]


# --- the scripted run ----------------------------------------------------------------------------


@pytest.mark.kafka
def test_scripted_inputs_give_the_expected_decisions_and_a_sigkilled_service_resumes_exactly(
    bus_config: BusConfig, tmp_path: Path
) -> None:
    dataset = write_dataset(tmp_path / "tasks.jsonl", 12)
    service = Service(bus_config, tmp_path, dataset).start()
    producer = EventProducer(bus_config, producer_id="pytest")
    decisions = Decisions(bus_config)
    records = 0
    shown = 0

    def send(*events: ev.Event) -> list[tuple[str, str, str, str]]:
        """Publishes inputs (each one journal record) and returns the decisions they caused, in order."""
        nonlocal records, shown
        for e in events:
            producer.publish_sync(e)
        records += len(events)
        ordered = in_decision_order(decisions, wait_observed(bus_config, records, service))
        new, shown = ordered[shown:], len(ordered)
        return [brief(e) for e in new]

    try:
        service.wait_consuming()
        # three rollout resources join; spatiotemporal k=1 puts {rollout, train} on the first
        assert send(registered("r0"), registered("r1"), registered("r2")) == [
            ("TagTransition", "r0", "placement", "capability:>reference,rollout,train"),
            *rollout_on("r0", "resource_added"), *dispatched("t0@0", "t1@0"),
            ("TagTransition", "r1", "placement", "capability:>rollout"),
            *rollout_on("r1", "resource_added"), *dispatched("t2@0", "t3@0"),
            ("TagTransition", "r2", "placement", "capability:>rollout"),
            *rollout_on("r2", "resource_added"),
        ]
        # group t0@0 completes through its trajectories, t1@0 through its BatchReady: B=2 -> a train step
        assert send(trajectory("t0@0", 0, 1.0), trajectory("t0@0", 1, 0.0)) == [("TaskCompleted", "", "", "t0@0")]
        assert send(batch_ready("t1@0")) == [
            ("TaskCompleted", "", "", "t1@0"),
            ("Preemption", "r0", "train_step", "rollout>train"),
            ("PauseRollout", "r0", "train_step", "abort"),
            ("TagTransition", "r0", "train_step", "activity:rollout>train"),
            ("Assignment", "r0", "train_step", "train"),
            ("TrainData", "", "", "t0@0,t1@0 final"),
        ]
        # the trainer finishes step 0 and publishes version 1: every rollout resource loads it
        assert send(step_done(0, 1), published(1, 0)) == [
            ("WeightSyncStarted", "r1,r2", "", "v1"),
            ("PauseRollout", "r1", "weight_sync", "in_place"),
            ("TagTransition", "r1", "weight_sync", "activity:rollout>weight_sync"),
            ("LoadWeights", "r1", "", "v1 file:///w1"),
            ("PauseRollout", "r2", "weight_sync", "in_place"),
            ("TagTransition", "r2", "weight_sync", "activity:rollout>weight_sync"),
            ("LoadWeights", "r2", "", "v1 file:///w1"),
            ("WeightSyncStarted", "r0", "", "v1"),
            ("TagTransition", "r0", "train_step_done", "activity:train>weight_sync"),
            ("LoadWeights", "r0", "", "v1 file:///w1"),
            *dispatched("t4@0", "t5@0"),
        ]
        # r0 and r1 report WeightsLoaded, r2 acknowledges its LoadWeights command
        load_r2 = next(e for e in decisions.of_type(ev.LoadWeights) if e.resource_id == "r2")
        ack = ev.ControlAck(resource_id="r2", command_id=load_r2.event_id, command="LoadWeights", ok=True,
                            correlation_id="r2")
        assert send(loaded("r0", 1), loaded("r1", 1), ack) == [
            ("WeightSyncCompleted", "r0", "", "v1"),
            ("TagTransition", "r0", "weights_loaded", "activity:weight_sync>rollout"),
            ("Assignment", "r0", "weights_loaded", "rollout"),
            ("ResumeRollout", "r0", "weights_loaded", ""),
            ("WeightSyncCompleted", "r1,r2", "", "v1"),
            ("TagTransition", "r1", "weights_loaded", "activity:weight_sync>rollout"),
            ("ResumeRollout", "r1", "weights_loaded", ""),
            ("TagTransition", "r2", "weights_loaded", "activity:weight_sync>rollout"),
            ("ResumeRollout", "r2", "weights_loaded", ""),
        ]
        # an orchestrator reports r1 gone
        lost = ev.ResourceLost(resource_id="r1", reason="node_failure", producer="orchestrator", correlation_id="r1")
        assert send(lost) == [
            ("ResourceLost", "r1", "node_failure", ""),
            ("Preemption", "r1", "node_failure", "rollout>"),
            ("TagTransition", "r1", "node_failure", "capability:rollout>"),
            ("TagTransition", "r1", "node_failure", "activity:rollout>offline"),
        ]
        completed = {e.group_id: e for e in decisions.of_type(ev.TaskCompleted)}
        assert completed["t0@0"].mean_reward == pytest.approx(0.5)
        train_data = decisions.of_type(ev.TrainData)[0]
        assert train_data.staleness_histogram == (6,)  # t0@0: 3 generated tokens x 2 samples, lag 0

        before = service.saved_state()
        assert before == service.dump_state()  # the journal rebuilds what the running service holds
        core = before["core"]
        assert core["rollout"]["version"] == 1 and not core["pool"]["resources"]["r1"]["alive"]
        published_before = len(decisions.events)

        service.kill()
        os.utime(service.state_file, (0, 0))
        service.start()
        log = service.wait_consuming()
        assert "republished=0" in log and "unconfirmed_records=0" in log
        assert os.stat(service.state_file).st_mtime > 0  # rewritten by the restarted service
        assert service.saved_state() == before
        assert service.dump_state() == before
        time.sleep(1.0)
        assert len(decisions.collect(1.0)) == published_before  # nothing re-emitted

        # the restarted service carries on: r1 comes back and loads the current weights
        assert send(registered("r1")) == [
            ("TagTransition", "r1", "placement", "capability:>rollout"),
            ("WeightSyncStarted", "r1", "", "v1"),
            ("TagTransition", "r1", "resource_added", "activity:idle>weight_sync"),
            ("LoadWeights", "r1", "", "v1 file:///w1"),
        ]
        # groups dispatched before the kill complete after it: train step 1
        assert send(batch_ready("t2@0")) == [("TaskCompleted", "", "", "t2@0")]
        assert send(batch_ready("t3@0")) == [
            ("TaskCompleted", "", "", "t3@0"),
            ("Preemption", "r0", "train_step", "rollout>train"),
            ("PauseRollout", "r0", "train_step", "abort"),
            ("TagTransition", "r0", "train_step", "activity:rollout>train"),
            ("Assignment", "r0", "train_step", "train"),
            ("TrainData", "", "", "t2@0,t3@0 final"),
        ]

        replayed = subprocess.run([sys.executable, "-m", "infra.cli", "replay", "scheduler", "--run-id", RUN,
                                   "--show-state"], cwd=REPO, env=service.environment(), capture_output=True, text=True,
                                  timeout=120)
        assert replayed.returncode == 0, replayed.stdout[-3000:] + replayed.stderr[-3000:]
        assert "all match" in replayed.stdout
        checked = int(replayed.stdout.split("replayed, ")[1].split(" recorded")[0])
        assert checked >= 8  # one recorded state per batch (snapshot interval 0)
        assert json.loads(replayed.stdout[replayed.stdout.index("\n{") :]) == service.saved_state()
    finally:
        decisions.close()
        producer.close()
        service.stop()
    assert service.proc is not None and service.proc.returncode == 0, service.tail()


@pytest.mark.kafka
def test_loader_neither_loses_nor_repeats_tasks_across_a_crash_mid_stream(
    bus_config: BusConfig, tmp_path: Path
) -> None:
    """Trajectories stream in while the service is SIGKILLed; after the restart every dispatched group
    completes exactly once, dispatch resumes where it stopped, and no decision is lost or doubled."""
    dataset = write_dataset(tmp_path / "tasks.jsonl", 40)
    service = Service(bus_config, tmp_path, dataset, **{"max-staleness": 3}).start()
    producer = EventProducer(bus_config, producer_id="pytest")
    decisions = Decisions(bus_config)
    try:
        service.wait_consuming()
        for rid in ("r0", "r1"):
            producer.publish_sync(registered(rid))
        journal = wait_observed(bus_config, 2, service)
        dispatched_groups = [e.group_id for e in in_decision_order(decisions, journal)
                             if isinstance(e, ev.TaskDispatched)]
        assert dispatched_groups == ["t0@0", "t1@0", "t2@0", "t3@0"]
        # a stream of trajectories for the four groups; SIGKILL lands in the middle of it
        stream = [trajectory(g, k, 1.0) for g in dispatched_groups for k in range(2)]
        for i, e in enumerate(stream):
            producer.publish(e)
            if i == 4:
                producer.flush()
                time.sleep(0.05)  # the service is busy with the first five
                service.kill()
        producer.flush()
        service.start()
        service.wait_consuming()
        # every trajectory is one journal record, whichever process handled it
        journal = wait_observed(bus_config, 2 + len(stream), service)
        ordered = in_decision_order(decisions, journal)
        done = [e.group_id for e in ordered if isinstance(e, ev.TaskCompleted)]
        assert sorted(done) == dispatched_groups  # none lost, none twice
        dispatches = [e for e in ordered if isinstance(e, ev.TaskDispatched)]
        assert [d.seq for d in dispatches] == list(range(len(dispatches)))
        assert [d.group_id for d in dispatches] == [f"t{i}@0" for i in range(len(dispatches))]
        assert len(dispatches) > 4  # dispatch went on after the restart
        observed = [e for e in journal if isinstance(e, ev.SchedulerObserved)]
        sources = [(e.source_topic, e.source_partition, e.source_offset) for e in observed]
        assert len(set(sources)) == len(sources)  # no input journaled twice
        assert service.dump_state() == service.saved_state()
    finally:
        decisions.close()
        producer.close()
        service.stop()


@pytest.mark.kafka
def test_a_batch_cut_between_journal_and_decisions_is_completed_once_on_restart(
    bus_config: BusConfig, tmp_path: Path
) -> None:
    """The crash window of the write-ahead journal: records acknowledged, decisions partly published."""
    dataset = write_dataset(tmp_path / "tasks.jsonl", 12)
    service = Service(bus_config, tmp_path, dataset).start()
    producer = EventProducer(bus_config, producer_id="pytest")
    decisions = Decisions(bus_config)
    try:
        service.wait_consuming()
        producer.publish_sync(registered("r0"))
        wait_observed(bus_config, 1, service)
        service.kill()
        # what a crashed batch leaves behind: the input, its journal record, the first two of its decisions
        config = config_of(bus_config, dataset)
        rebuilt = rebuild(config, read_journal(bus_config, RUN))
        join = registered("r1")
        delivered = producer.publish_sync(join)
        facts = rebuilt.scheduler.input_of(join)
        assert facts is not None
        step = rebuilt.scheduler.observe(facts, Source("resources", delivered.partition, delivered.offset), join.ts_ms)
        assert step is not None and len(step.events) == 6
        crashed = EventProducer(bus_config, producer_id=INSTANCE)
        crashed.publish_sync(step.record)
        for e in step.events[:2]:
            crashed.publish_sync(e)
        crashed.close()

        service.start()
        log = service.wait_consuming()
        assert "unconfirmed_records=1" in log and "republished=4" in log
        journal = wait_observed(bus_config, 2, service)
        ordered = in_decision_order(decisions, journal)  # every decision exactly once
        assert [brief(e) for e in ordered[-6:]] == [
            ("TagTransition", "r1", "placement", "capability:>rollout"),
            *rollout_on("r1", "resource_added"), *dispatched("t2@0", "t3@0"),
        ]
        assert [e.event_id for e in ordered[-6:]] == [e.event_id for e in step.events]
        # the input is in the journal: the restarted consumer skipped it instead of handling it again
        time.sleep(1.0)
        assert len([e for e in read_journal(bus_config, RUN) if isinstance(e.event, ev.SchedulerObserved)]) == 2
        assert service.dump_state() == rebuilt.scheduler.state()

        # `sflow replay scheduler` reports a recorded state that the journal does not rebuild
        last = [r for r in read_journal(bus_config, RUN) if isinstance(r.event, ev.SchedulerCheckpoint)][-1]
        assert isinstance(last.event, ev.SchedulerCheckpoint) and last.event.state
        tampered = json.loads(last.event.state)
        tampered["core"]["loader"]["cursor"] += 1
        forged = dataclasses.replace(last.event, event_id="forged", state=json.dumps(tampered))
        at = producer.publish_sync(forged).offset
        out = subprocess.run([sys.executable, "-m", "infra.cli", "replay", "scheduler", "--run-id", RUN, "--from",
                              str(at)], cwd=REPO, env=service.environment(), capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
        assert "1 recorded states checked, MISMATCH" in out.stdout
        assert "core.loader.cursor" in out.stdout and "differs" in out.stdout
    finally:
        decisions.close()
        producer.close()
        service.stop()


# --- config ------------------------------------------------------------------------------------


@pytest.mark.unit
def test_config_errors_name_the_field_and_the_value(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "tasks.jsonl", 3)
    bus = BusConfig()
    with pytest.raises(ConfigError, match=r"train_batch_groups=0"):
        SchedulerServiceConfig.build(bus=bus, dataset=dataset, train_batch_groups=0)
    with pytest.raises(ConfigError, match=r"policy='fancy'"):
        SchedulerServiceConfig.build(bus=bus, dataset=dataset, policy="fancy")
    with pytest.raises(ConfigError, match=r"dataset='.*nope.jsonl' is not a file"):
        SchedulerServiceConfig.build(bus=bus, dataset=tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match=r"run_id='a b'"):
        SchedulerServiceConfig.build(bus=bus, dataset=dataset, run_id="a b")
    with pytest.raises(ConfigError, match=r"heartbeat_coalesce_s=40.0 must be < heartbeat_timeout_s=30.0"):
        SchedulerServiceConfig.build(bus=bus, dataset=dataset, heartbeat_coalesce_s=40.0)
    config = SchedulerServiceConfig.build(bus=bus, dataset=dataset, policy="disaggregated", train_resources=2)
    assert config.tag_policy().name == "disaggregated" and config.settings().train_batch_groups == 8
    recorded = config.decision_config()
    assert SchedulerServiceConfig.from_decision_config(recorded, bus=bus).decision_config() == recorded
    other = SchedulerServiceConfig.build(bus=bus, dataset=dataset, policy="disaggregated", train_resources=3)
    assert other.decision_differences(recorded) == ["train_resources: recorded 2, now 3"]


@pytest.mark.unit
def test_journal_replays_to_byte_identical_events_and_filters_what_is_no_input(tmp_path: Path) -> None:
    config = config_of(BusConfig(), write_dataset(tmp_path / "tasks.jsonl", 12))
    live = new_scheduler(config)
    inputs: list[ev.Event] = [registered("r0"), registered("r1")]
    inputs += [trajectory("t0@0", 0, 1.0), trajectory("t0@0", 0, 1.0)]  # the second is a redelivery
    inputs += [trajectory("t0@0", 1, 0.0), batch_ready("t0@0"), batch_ready("t1@0")]
    inputs += [step_done(0, 1), published(1, 0), loaded("r0", 1), loaded("r0", 1)]  # a duplicate load report
    inputs += [ev.ResourceLost(resource_id="r1", reason="x", producer=INSTANCE)]  # its own decision: no input
    steps = []
    for offset, e in enumerate(inputs):
        facts = live.input_of(e)
        step = None if facts is None else live.observe(facts, Source("t", 0, offset), e.ts_ms)
        steps.append(step)
    kept = [s for s in steps if s is not None]
    assert [s is None for s in steps] == [False, False, False, True, False, True, False,
                                          False, False, False, True, True]
    assert live.seen(Source("t", 0, 9)) and not live.seen(Source("t", 0, 12)) and not live.seen(Source("t", 1, 0))
    rebuilt = new_scheduler(config)
    again = rebuilt.replay_all([s.record for s in kept])
    assert rebuilt.state() == live.state()
    assert [[ev.encode_event(e) for e in s.events] for s in again] == [[ev.encode_event(e) for e in s.events]
                                                                       for s in kept]
    ids = [e.event_id for s in kept for e in s.events]
    assert ids == [decision_event_id(RUN, i) for i in range(len(ids))]
    with pytest.raises(ReplayError, match="replayed after"):
        rebuilt.replay(kept[0].record)


@pytest.mark.unit
def test_sflow_sim_forwards_its_arguments_to_the_simulator() -> None:
    from typer.testing import CliRunner

    from infra.cli import app

    runner = CliRunner()
    shown = runner.invoke(app, ["sim", "--help"])
    assert shown.exit_code == 0 and "--pipeline" in shown.output and "sflow sim" in shown.output
    refused = runner.invoke(app, ["sim", "--no-such-flag"])
    assert refused.exit_code == 2 and "unrecognized arguments: --no-such-flag" in refused.output
