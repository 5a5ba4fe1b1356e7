"""The trainer service (`python -m trainer_svc`, run as a subprocess) against a real broker.

Trajectories are built with the prefix-tree core from synthetic LLM calls and published the way the
trajectory processor does (uuid5 event ids, key = group, BatchReady from `GroupTracker`). The tests
read what the service published back with `replay` and check it against what was fed in: each step's
TrainStepCompleted.trajectory_ids, the checkpoint on disk, and — across SIGKILLs at every point of a
step — that every trajectory is trained exactly once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import signal
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from agents_adapter.processor.group_tracker import GroupTracker
from agents_adapter.processor.prefix_tree import PrefixTree
from agents_adapter.processor.session_records import trajectory_event_id
from bus.config import BusConfig
from bus.producer import Delivered, EventProducer
from bus.replay import replay
from schemas.errors import PayloadError
from schemas.events import (
    Assignment,
    BatchReady,
    Event,
    LLMCall,
    TaskCompleted,
    TrainData,
    TrainStepCompleted,
    TrainStepStarted,
    Trajectory,
    WeightsPublished,
)
from schemas.packed import Float32s, Int32s
from schemas.payloads import AssignmentPayload
from tests.factories import TINY_SPEC
from tests.service_process import ServiceProcess
from trainer_svc import checkpoint as ckpt
from trainer_svc import planner
from trainer_svc.buffer import Position
from trainer_svc.config import ServiceConfig
from trainer_svc.errors import ConfigError
from trainer_svc.ledger import Ledger
from trainer_svc.step_events import step_event_id

REPO = Path(__file__).resolve().parents[2]
FAULT_RUNNER = Path(__file__).with_name("trainer_fault_runner.py")
RUN = "run-test"
RESOURCE = "trainer-0"
PARTITIONS = 4  # of `trajectories` (bus.topics.CATALOG)


# --- building inputs ---------------------------------------------------------------------------


def session_trajectory(session_id: str, group_id: str, reward: float, seed: int, version: int = 0) -> Trajectory:
    """A two-turn session (the second prompt extends the first call) merged by the prefix-tree core."""
    rng = random.Random(seed)
    tree = PrefixTree()
    history = [1, 2, rng.randrange(3, 250)]
    for turn in range(2):
        output = [rng.randrange(3, 250) for _ in range(3)]
        tree.insert(LLMCall(
            correlation_id=session_id, call_id=f"{session_id}-c{turn}", session_id=session_id, agent_id="agent",
            task_id=f"task-{group_id}", group_id=group_id, model="tiny", turn=turn, finish_reason="stop",
            prompt_ids=Int32s(history), output_ids=Int32s(output),
            output_logprobs=Float32s([-rng.uniform(0.5, 4.0) for _ in output]), output_versions=Int32s([version] * 3),
            request_ms=0, completed_ms=1,
        ))
        history = [*history, *output, rng.randrange(3, 250)]
    return Trajectory(
        event_id=trajectory_event_id(session_id), correlation_id=session_id, producer="trajectory-processor",
        trajectory_id=session_id, session_id=session_id, agent_id="agent", task_id=f"task-{group_id}",
        group_id=group_id, reward=reward, status="completed", nodes=tree.nodes(), call_ids=tree.call_ids,
        min_version=tree.min_version, max_version=tree.max_version, tokens_in_calls=tree.tokens_in_calls,
        tokens_in_tree=tree.tokens_in_tree,
    )


def group(group_id: str, size: int = 2, version: int = 0,
          reward: float | None = None) -> tuple[list[Trajectory], BatchReady]:
    """`size` trajectories with distinct rewards (non-zero GRPO advantages), or all with `reward` (zero
    variance), and the group's BatchReady."""
    seed = zlib.crc32(group_id.encode())
    members = [session_trajectory(f"{group_id}-s{i}", group_id, float(i) if reward is None else reward, seed + i,
                                  version) for i in range(size)]
    tracker = GroupTracker(default_size=size)
    ready = [b for t in members if (b := tracker.add(t)) is not None]
    assert len(ready) == 1
    return members, ready[0]


def assignment(aid: str, version: int, group_ids: tuple[str, ...] | None = None, kind: str = "train",
               resources: tuple[str, ...] = (RESOURCE,)) -> Assignment:
    """An Assignment with the scheduler's payload (`AssignmentPayload`); `group_ids` names its groups in
    the payload (None, as the scheduler writes it: they come as TrainData)."""
    payload = AssignmentPayload(cause="train_step", run_id=RUN, group_ids=group_ids)
    return Assignment(correlation_id=aid, assignment_id=aid, task_kind=kind, resource_ids=resources,
                      step=version, policy_version=version, payload=payload.to_json())


def partition_of(key: str) -> int:
    """librdkafka's default partitioner (consistent_random): CRC32 of the key."""
    return zlib.crc32(key.encode()) % PARTITIONS


def groups_on_one_partition(prefix: str, count: int) -> list[str]:
    names = [f"{prefix}{i}" for i in range(200)]
    wanted = partition_of(names[0])
    chosen = [n for n in names if partition_of(n) == wanted][:count]
    assert len(chosen) == count
    return chosen


class Bus:
    """Publishes inputs (acknowledged) and reads the service's outputs back."""

    def __init__(self, config: BusConfig) -> None:
        self.config = config
        self.producer = EventProducer(config, producer_id="test-feeder")

    def publish(self, *events: Event) -> list[Delivered]:
        return [self.producer.publish_sync(e) for e in events]

    def outputs(self) -> list[Event]:
        return [r.event for r in replay(self.config, ["train", "weights"]).events]

    def completed(self) -> dict[int, TrainStepCompleted]:
        """TrainStepCompleted by step; copies of one step must be the same event (same id, same fact)."""
        out: dict[int, TrainStepCompleted] = {}
        for e in self.outputs():
            if isinstance(e, TrainStepCompleted):
                first = out.setdefault(e.step, e)
                assert first.event_id == e.event_id and first.trajectory_ids == e.trajectory_ids, (first, e)
        return out

    def weights(self) -> dict[int, WeightsPublished]:
        out: dict[int, WeightsPublished] = {}
        for e in self.outputs():
            if isinstance(e, WeightsPublished):
                first = out.setdefault(e.version, e)
                assert first == e, (first, e)
        return out

    def close(self) -> None:
        self.producer.close()


class Service(ServiceProcess):
    """`python -m trainer_svc` on the test's topics; a start with a fault runs it under `trainer_fault_runner`,
    which SIGKILLs it at that point (production code has no fault hook)."""

    def __init__(self, bus: BusConfig, model_dir: Path, weights_root: Path, log: Path, **options: object) -> None:
        self.config = bus
        super().__init__("trainer_svc", bus, log, {
            "run-id": RUN, "base-model-dir": model_dir, "weights-root": weights_root, "resource-id": RESOURCE,
            "model-name": "tiny", "poll-timeout-s": 0.2, "log-level": "info", **options,
        }, env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
        self.stop_timeout_s = 60.0
        self.fault = ""

    def command(self) -> list[str]:
        command = super().command()  # python -m trainer_svc --flag value ...
        head = [sys.executable, str(FAULT_RUNNER), self.fault] if self.fault else command[:3]
        return [*head, "--set", "engine.device=cpu", "--set", "engine.learning_rate=0.01", *command[3:]]

    def start(self, fault: str = "") -> Service:
        self.fault = fault
        super().start(note=f"fault: {fault or 'none'}")
        return self

def wait_until(check: Callable[[], Any], service: Service, what: str, timeout_s: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if not service.running():
            raise AssertionError(f"service exited while waiting for {what}:\n{service.tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout_s}s:\n{service.tail()}")
        time.sleep(0.5)


def ids_of(*groups: tuple[list[Trajectory], BatchReady]) -> set[str]:
    return {t.trajectory_id for members, _ in groups for t in members}


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inference_svc.default_model import create_default_model

    return create_default_model(tmp_path_factory.mktemp("trainer-svc-model"), TINY_SPEC)


@pytest.fixture
def bus(bus_config: BusConfig) -> Iterator[Bus]:
    b = Bus(bus_config)
    yield b
    b.close()


@pytest.fixture
def service_factory(bus_config: BusConfig, tiny_model_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Service]]:
    made: list[Service] = []

    def make(**options: object) -> Service:
        s = Service(bus_config, tiny_model_dir, tmp_path / "weights", tmp_path / f"trainer{len(made)}.log", **options)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


# --- tests -------------------------------------------------------------------------------------


@pytest.mark.kafka
def test_standalone_step_publishes_a_loadable_checkpoint(
    bus: Bus, service_factory: Callable[..., Service], tiny_model_dir: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    g1, g2 = group("alpha"), group("beta")
    (m1, b1), (m2, b2) = g1, g2
    # an at-least-once processor may publish copies: same ids, trained once
    bus.publish(*m1, m1[0], b1, *m2, b2, b2)
    service = service_factory(mode="standalone", **{"groups-per-step": 2, "max-staleness": 0}).start()

    weights = wait_until(lambda: bus.weights().get(1), service, "WeightsPublished v1")
    completed = bus.completed()[1]
    started = [e for e in bus.outputs() if isinstance(e, TrainStepStarted)]
    assert [(s.step, s.policy_version, s.event_id) for s in started] == [
        (1, 0, step_event_id(RUN, 1, "TrainStepStarted"))]
    assert started[0].resource_ids == (RESOURCE,) and started[0].num_trajectories == 4
    assert completed.event_id == step_event_id(RUN, 1, "TrainStepCompleted")
    assert (completed.run_id, completed.new_version, completed.correlation_id) == (RUN, 1, RUN)
    assert sorted(completed.trajectory_ids) == sorted(ids_of(g1, g2))
    assert completed.num_tokens > 0 and completed.loss == completed.loss  # not NaN

    directory = Path(urlparse(weights.uri).path)
    assert directory == (tmp_path / "weights" / RUN / "v000001").resolve()
    assert (weights.model, weights.version, weights.step) == ("tiny", 1, 1)
    assert weights.event_id == step_event_id(RUN, 1, "WeightsPublished")
    data = (directory / "model.safetensors").read_bytes()
    assert weights.sha256 == hashlib.sha256(data).hexdigest() and weights.num_bytes == len(data)
    trained = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert trained.keys() == base.keys() and any(not torch.equal(trained[k], base[k]) for k in base)
    progress = ckpt.read_progress(directory)
    assert (progress.step, progress.version, progress.weights_sha256) == (1, 1, weights.sha256)

    # step 2: a group generated by version 0 is beyond max_staleness 0 now: dropped, never trained
    stale, fresh1, fresh2 = group("gamma", version=0), group("delta", version=1), group("epsilon", version=1)
    bus.publish(*stale[0], stale[1], *fresh1[0], fresh1[1], *fresh2[0], fresh2[1])
    wait_until(lambda: bus.weights().get(2), service, "WeightsPublished v2")
    assert sorted(bus.completed()[2].trajectory_ids) == sorted(ids_of(fresh1, fresh2))
    assert service.stop() == 0  # SIGTERM: a clean stop
    assert set(bus.completed()) == {1, 2}
    assert "gamma" in service.log.read_text()  # the drop is logged


@pytest.mark.kafka
def test_dynamic_sampling_filters_zero_variance_groups_and_reports_the_step_metrics(
    bus: Bus, service_factory: Callable[..., Service], tmp_path: Path
) -> None:
    flat_name, mixed1_name, mixed2_name = groups_on_one_partition("ds-", 3)  # read in publishing order
    flat, mixed1, mixed2 = group(flat_name, reward=1.0), group(mixed1_name), group(mixed2_name)
    for members, ready in (flat, mixed1, mixed2):
        bus.publish(*members, ready)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("algorithm: {dynamic_sampling: true, dynamic_sampling_max_filtered: 4}\n")
    service = service_factory(mode="standalone", **{"groups-per-step": 2, "config": recipe}).start()
    wait_until(lambda: bus.weights().get(1), service, "step 1")
    step = bus.completed()[1]
    assert sorted(step.trajectory_ids) == sorted(ids_of(mixed1, mixed2))  # the flat group is not one of the two
    assert step.filtered_group_ids == (flat_name,) and step.added_group_ids == ()
    assert step.zero_variance_fraction == pytest.approx(1 / 3)
    assert step.entropy > 0 and step.response_length_mean == 3.0 and step.truncated_fraction == 0.0
    assert step.collapse_signals == ()
    assert service.stop() == 0


@pytest.mark.kafka
def test_scheduled_steps_follow_assignments_and_train_data(
    bus: Bus, service_factory: Callable[..., Service]
) -> None:
    g1, g2, g3, g4 = (group(f"sched-{i}") for i in range(1, 5))
    for members, ready in (g1, g2, g3):
        bus.publish(*members, ready)

    service = service_factory(mode="scheduled", **{"group-wait-s": 5}).start()
    # not this trainer's: a rollout assignment, and a train assignment for another resource
    bus.publish(assignment("other-kind", 0, ("sched-1",), kind="rollout"),
                assignment("other-res", 0, ("sched-2",), resources=("trainer-9",)))
    # step 1: groups listed in the payload
    first = assignment("a1", 0, ("sched-1",))
    bus.publish(first)
    wait_until(lambda: bus.weights().get(1), service, "step 1")
    # step 2: the scheduler's format: groups streamed as TrainData chunks, the last one final; the
    # first assignment again (a duplicate) is skipped
    bus.publish(first, assignment("a2", 1))
    bus.publish(TrainData(correlation_id="a2", run_id=RUN, assignment_id="a2", step=1, group_ids=("sched-2",),
                          group_versions=(0,), final=False))
    time.sleep(1.0)
    assert 2 not in bus.completed()  # not final yet
    bus.publish(TrainData(correlation_id="a2", run_id=RUN, assignment_id="a2", step=1, group_ids=("sched-3",),
                          group_versions=(0,), final=True))
    wait_until(lambda: bus.weights().get(2), service, "step 2")
    # step 3: groups named in the payload; one never arrives: trained on what is there after group_wait_s
    bus.publish(assignment("a3", 2, ("sched-4", "sched-never")))
    time.sleep(0.5)
    bus.publish(*g4[0], g4[1])
    wait_until(lambda: bus.weights().get(3), service, "step 3")

    completed = bus.completed()
    assert set(completed) == {1, 2, 3}
    assert [completed[s].correlation_id for s in (1, 2, 3)] == ["a1", "a2", "a3"]
    assert sorted(completed[1].trajectory_ids) == sorted(ids_of(g1))
    assert sorted(completed[2].trajectory_ids) == sorted(ids_of(g2, g3))
    assert sorted(completed[3].trajectory_ids) == sorted(ids_of(g4))
    assert [completed[s].new_version for s in (1, 2, 3)] == [1, 2, 3]
    assert "sched-never" in service.log.read_text()
    assert service.stop() == 0


@pytest.mark.kafka
def test_untrainable_steps_are_reported_as_skipped_and_never_publish_weights(
    bus: Bus, service_factory: Callable[..., Service]
) -> None:
    """A NaN reward, a huge one, and a group whose sessions all ended with no call: each step is skipped
    with a TrainStepCompleted(status skipped) naming its groups and why, no weights are published, and
    the next good step still trains version 0 -> 1. A group the scheduler aborted leaves the buffer."""
    nan_group, huge_group, good = group("nan-0"), group("huge-0"), group("good-0")
    nan_members = [nan_group[0][0], dataclasses.replace(nan_group[0][1], reward=float("nan"))]
    huge_members = [dataclasses.replace(huge_group[0][0], reward=1e300), huge_group[0][1]]
    empty_members, empty_ready = group("empty-0")
    empty_members = [dataclasses.replace(t, nodes=(), call_ids=(), tokens_in_tree=0, tokens_in_calls=0)
                     for t in empty_members]
    abandoned_members, _ = group("abandoned-0")
    bus.publish(*nan_members, nan_group[1], *huge_members, huge_group[1], *empty_members, empty_ready,
                abandoned_members[0])
    service = service_factory(mode="scheduled", **{"group-wait-s": 5}).start()
    bus.publish(assignment("a-nan", 0, ("nan-0",)), assignment("a-huge", 0, ("huge-0",)),
                assignment("a-empty", 0, ("empty-0",)))

    def three_skipped() -> dict[str, TrainStepCompleted] | None:
        found = {e.correlation_id: e for e in bus.outputs()
                 if isinstance(e, TrainStepCompleted) and e.status == "skipped"}
        return found if len(found) == 3 else None

    found = wait_until(three_skipped, service, "three skipped steps")
    assert found["a-nan"].dropped_group_ids == ("nan-0",) and "not finite" in found["a-nan"].reason
    assert found["a-huge"].dropped_group_ids == ("huge-0",) and "max_abs_reward" in found["a-huge"].reason
    assert found["a-empty"].dropped_group_ids == ("empty-0",) and "no usable member" in found["a-empty"].reason
    assert {e.new_version for e in found.values()} == {0} and not bus.weights()
    dead = [r.event for r in replay(bus.config, ["dlq"]).events]
    assert not dead, dead  # empty trajectories are members, not poison
    bus.publish(TaskCompleted(correlation_id="abandoned-0", task_id="task-abandoned-0", group_id="abandoned-0",
                              num_samples=2, mean_reward=0.0, status="aborted"))
    bus.publish(*good[0], good[1], assignment("a-good", 0, ("good-0",)))
    weights = wait_until(lambda: bus.weights().get(1), service, "step 1 after the skipped ones")
    assert weights.step == 1
    completed = [e for e in bus.outputs() if isinstance(e, TrainStepCompleted) and e.status == "completed"]
    assert [(e.correlation_id, e.new_version) for e in completed] == [("a-good", 1)]
    assert sorted(completed[0].trajectory_ids) == sorted(ids_of(good))
    wait_until(lambda: "group aborted by the scheduler" in service.log.read_text(), service, "the aborted group")
    assert service.stop() == 0


@pytest.mark.kafka
def test_restarts_train_every_trajectory_exactly_once(
    bus: Bus, service_factory: Callable[..., Service], tmp_path: Path
) -> None:
    """SIGKILL after a checkpoint, inside a step before its checkpoint, and after a checkpoint before
    its events: each trajectory is in exactly one TrainStepCompleted, each step is published once."""
    early, a, b = groups_on_one_partition("restart-", 3)  # one partition: trained messages after an untrained one
    g_early, g_a, g_b = group(early), group(a), group(b)
    g_d, g_e, g_f = group("later-d"), group("later-e"), group("later-f")
    root = tmp_path / "weights" / RUN
    # dedupe-steps 0: only the ids a restart reads again are kept, so the offsets alone must be exact
    service = service_factory(mode="standalone", **{"groups-per-step": 2, "dedupe-steps": 0})

    # run 1: the early group's first sample arrives before two complete groups; step 1 trains those two
    delivered = bus.publish(g_early[0][0], *g_a[0], g_a[1], *g_b[0], g_b[1])
    assert len({d.partition for d in delivered}) == 1
    service.start()
    wait_until(lambda: bus.weights().get(1), service, "step 1")
    service.kill()
    state = ckpt.read_progress(root / "v000001").consumed_offsets
    partition = {str(delivered[0].partition): delivered[0].offset}  # resume at the untrained early sample
    assert state["offsets"][bus.config.topic("trajectories")].items() >= partition.items()
    assert ids_of(g_a, g_b) <= set(state["done_trajectories"])  # they will be read again: remembered
    assert {a, b} <= set(state["done_groups"])

    # run 2: the rest arrives; step 2 computes, then the process dies before its checkpoint
    bus.publish(g_early[0][1], g_early[1], *g_d[0], g_d[1])
    service.start(fault="kill-before-checkpoint@2")
    assert service.wait_exit(180) == -signal.SIGKILL
    assert not (root / "v000002").exists() and 2 not in bus.completed()
    started = [e for e in bus.outputs() if isinstance(e, TrainStepStarted) and e.step == 2]
    assert len(started) == 1

    # run 3: step 2 is redone from checkpoint 1; step 3 is checkpointed, then the process dies before
    # publishing it
    service.start(fault="kill-after-checkpoint@3")
    wait_until(lambda: bus.weights().get(2), service, "step 2 (redone)")
    state = ckpt.read_progress(root / "v000002").consumed_offsets
    assert not ids_of(g_early, g_a, g_b) & set(state["done_trajectories"])  # behind the offsets now: forgotten
    bus.publish(*g_e[0], g_e[1], *g_f[0], g_f[1])
    assert service.wait_exit(180) == -signal.SIGKILL
    assert (root / "v000003").is_dir() and 3 not in bus.completed()

    # run 4: finds step 3 done and publishes its events (from the checkpoint), trains nothing again
    service.start()
    wait_until(lambda: bus.weights().get(3), service, "step 3's events")
    time.sleep(2.0)  # a wrongly re-read group would make a step 4 now
    assert service.stop() == 0

    completed = bus.completed()
    assert set(completed) == {1, 2, 3}
    expected = {1: ids_of(g_a, g_b), 2: ids_of(g_early, g_d), 3: ids_of(g_e, g_f)}
    assert {s: set(c.trajectory_ids) for s, c in completed.items()} == expected
    trained = [tid for c in completed.values() for tid in c.trajectory_ids]
    assert len(trained) == len(set(trained)) == len(ids_of(g_early, g_a, g_b, g_d, g_e, g_f))
    restarted = [e for e in bus.outputs() if isinstance(e, TrainStepStarted) and e.step == 2]
    assert len(restarted) == 2 and len({e.event_id for e in restarted}) == 1  # a detectable duplicate
    weights = bus.weights()
    assert [weights[v].step for v in (1, 2, 3)] == [1, 2, 3]
    for v in (1, 2, 3):
        progress = ckpt.read_progress(root / f"v{v:06d}")
        assert (progress.step, progress.version, progress.weights_sha256) == (v, v, weights[v].sha256)


# --- the parts without a broker ----------------------------------------------------------------


@pytest.mark.unit
def test_ledger_resumes_at_the_oldest_untrained_message_and_remembers_what_it_reread() -> None:
    ledger = Ledger(dedupe_steps=0)
    (early, _), (m_a, ready_a) = group("u-early"), group("u-a")
    topic = "sf.trajectories"
    ledger.next_offsets = {(topic, 0): None, (topic, 1): None}
    ledger.read(Position(topic, 0, 0))
    assert ledger.add_trajectory(early[0], Position(topic, 0, 0)) == "buffered"
    for offset, t in enumerate(m_a, start=1):
        ledger.read(Position(topic, 0, offset))
        assert ledger.add_trajectory(t, Position(topic, 0, offset)) == "buffered"
    ledger.read(Position(topic, 0, 3))
    assert ledger.add_batch_ready(ready_a, Position(topic, 0, 3)) == "buffered"
    assert [g.group_id for g in ledger.complete_groups()] == ["u-a"]
    ledger.finish(["u-a"], step=1)
    state = json.loads(json.dumps(ledger.to_state(current_step=1)))
    assert state["offsets"] == {topic: {"0": 0, "1": None}}  # the untrained early sample; nothing read on 1
    assert set(state["done_trajectories"]) == {t.trajectory_id for t in m_a} and set(state["done_groups"]) == {"u-a"}

    restarted = Ledger.from_state(state, dedupe_steps=0)
    assert restarted.resume_offsets() == {(topic, 0): 0, (topic, 1): None}
    assert restarted.add_trajectory(early[0], Position(topic, 0, 0)) == "buffered"
    assert restarted.add_trajectory(m_a[0], Position(topic, 0, 1)) == "duplicate"  # trained before the crash
    assert restarted.add_batch_ready(ready_a, Position(topic, 0, 3)) == "late"
    restarted.read(Position(topic, 0, 3))
    restarted.finish(["u-early"], step=2)
    assert restarted.to_state(current_step=2)["done_trajectories"] == {}  # behind the offsets: forgotten
    assert restarted.resume_offsets()[(topic, 0)] == 4


@pytest.mark.unit
@pytest.mark.parametrize(("payload", "expected"), [
    (AssignmentPayload(group_ids=("g1", "g2")).to_json(), (["g1", "g2"], True)),
    (AssignmentPayload(group_ids=("g1", "g2"), final=False).to_json(), (["g1", "g2"], False)),
    (AssignmentPayload(group_ids=("g1",)).to_json(), (["g1"], True)),
    ('{"cause": "train_step", "work": [], "run_id": "r"}', ([], False)),  # groups to come as TrainData
    ("not json", None),  # refused (the service dead-letters it)
])
def test_assignment_payload_formats(payload: str, expected: tuple[list[str], bool] | None) -> None:
    ledger = Ledger(dedupe_steps=0)
    a = Assignment(correlation_id="a", assignment_id="a", task_kind="train", resource_ids=(RESOURCE,), step=0,
                   policy_version=0, payload=payload)
    try:
        planner.take_assignment(ledger, a, Position("sf.scheduler", 0, 0), run_id="r", resource_ids=(RESOURCE,),
                                version=0, now=0.0)
    except PayloadError:
        assert expected is None and "a" not in ledger.pending
        return
    assert (ledger.pending["a"].group_ids, ledger.pending["a"].final) == expected


@pytest.mark.unit
def test_cli_builds_a_validated_config(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer_svc.__main__ import parse_config

    monkeypatch.setenv("SFLOW_BOOTSTRAP", "127.0.0.1:1234")
    monkeypatch.setenv("SFLOW_TOPIC_PREFIX", "x.")
    file = tmp_path / "trainer.yaml"
    file.write_text(f"run_id: r1\nbase_model_dir: {tiny_model_dir}\nweights_root: {tmp_path}\n"
                    "mode: standalone\nengine: {micro_batch_tokens: 64}\n")
    config = parse_config(["--config", str(file), "--groups-per-step", "3", "--max-staleness", "none",
                           "--resource-id", "t0", "--resource-id", "t1", "--set", "algorithm.clip_eps=0.1"])
    assert (config.run_id, config.mode, config.groups_per_step, config.max_staleness) == ("r1", "standalone", 3, None)
    assert config.resource_ids == ("t0", "t1") and config.engine.micro_batch_tokens == 64
    assert config.algorithm.clip_eps == 0.1 and config.checkpoint_root == tmp_path / "r1"
    assert (config.bus.bootstrap_servers, config.bus.topic_prefix) == ("127.0.0.1:1234", "x.")
    assert config.model == tiny_model_dir.resolve().name
    assert config.trainer_config().algorithm.max_staleness == config.algorithm.max_staleness


@pytest.mark.unit
@pytest.mark.parametrize(("field", "value"), [
    ("run_id", "has space"), ("mode", "sometimes"), ("groups_per_step", 0), ("max_staleness", -1),
    ("resource_ids", ()), ("group_wait_s", -1.0), ("base_model_dir", "/nonexistent"),
])
def test_service_config_names_the_bad_field(tiny_model_dir: Path, tmp_path: Path, field: str, value: object) -> None:
    values: dict[str, object] = {"run_id": "r", "base_model_dir": str(tiny_model_dir), "weights_root": str(tmp_path)}
    values[field] = value
    with pytest.raises(ConfigError, match=f"^{field}="):
        ServiceConfig.from_mapping(values)
    with pytest.raises(ConfigError, match="unknown field"):
        ServiceConfig.from_mapping({**values, "typo": 1})
