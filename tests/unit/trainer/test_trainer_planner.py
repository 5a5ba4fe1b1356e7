"""The trainer's step planner and group buffer without a broker: which assignments open a step, when a
step runs, on which groups, and the ids of what a step publishes."""

from __future__ import annotations

import pytest

from schemas.errors import PayloadError
from schemas.events import Assignment, BatchReady, TrainData, Trajectory
from schemas.payloads import AssignmentPayload
from tests.unit.trainer.trainer_helpers import node, trajectory
from trainer_svc import planner
from trainer_svc.buffer import PendingStep, Position
from trainer_svc.ledger import Ledger
from trainer_svc.planner import Intake
from trainer_svc.step_events import StepOrigin, skipped_event, started_event, step_event_id

pytestmark = pytest.mark.unit

RUN, ME = "run-1", "trainer-0"
TRAJ, SCHED, TRAIN = "sf.trajectories", "sf.scheduler", "sf.train"


def member(tid: str, group_id: str, *, version: int = 0) -> Trajectory:
    return trajectory([node(0, -1, [1, 2, 3], [0, 1, 1], version=version)], trajectory_id=tid, group_id=group_id,
                      reward=float(len(tid)))


def ready(group_id: str, *members: Trajectory, version: int = 0) -> BatchReady:
    return BatchReady(correlation_id=group_id, group_id=group_id, task_id=f"task-{group_id}",
                      trajectory_ids=tuple(t.trajectory_id for t in members), num_samples=len(members),
                      min_version=version, max_version=version)


def assignment(aid: str, version: int, payload: str | None = None, *, kind: str = "train",
               resources: tuple[str, ...] = (ME,)) -> Assignment:
    text = AssignmentPayload(cause="train_step", run_id=RUN).to_json() if payload is None else payload
    return Assignment(correlation_id=aid, assignment_id=aid, task_kind=kind, resource_ids=resources,
                      step=version, policy_version=version, payload=text)


def take(ledger: Ledger, a: Assignment, offset: int = 0, version: int = 0, now: float = 0.0) -> Intake:
    return planner.take_assignment(ledger, a, Position(SCHED, 0, offset), run_id=RUN, resource_ids=(ME,),
                                   version=version, now=now)


def data(aid: str, step: int, groups: tuple[str, ...], final: bool, run_id: str = RUN) -> TrainData:
    return TrainData(correlation_id=aid, run_id=run_id, assignment_id=aid, step=step, group_ids=groups,
                     group_versions=(0,) * len(groups), final=final)


def buffer_group(ledger: Ledger, group_id: str, size: int, offset: int, *, complete: bool = True) -> list[Trajectory]:
    members = [member(f"{group_id}-s{i}", group_id) for i in range(size)]
    for i, t in enumerate(members[: size if complete else size - 1]):
        assert ledger.add_trajectory(t, Position(TRAJ, 0, offset + i)) == "buffered"
    ledger.add_batch_ready(ready(group_id, *members), Position(TRAJ, 0, offset + size))
    return members


def test_only_train_assignments_of_this_trainer_and_run_open_a_step() -> None:
    ledger = Ledger(dedupe_steps=0)
    assert take(ledger, assignment("roll", 0, kind="rollout")) is Intake.FOREIGN
    assert take(ledger, assignment("other-res", 0, resources=("trainer-9",))) is Intake.FOREIGN
    other_run = AssignmentPayload(cause="train_step", run_id="run-2").to_json()
    assert take(ledger, assignment("other-run", 0, other_run)) is Intake.OTHER_RUN
    assert take(ledger, assignment("old", 0), version=1) is Intake.OLD_VERSION
    assert ledger.foreign == {"roll", "other-res", "other-run"} and not ledger.pending
    with pytest.raises(PayloadError):
        take(ledger, assignment("garbled", 0, "not json"))
    assert "garbled" in ledger.foreign and "garbled" not in ledger.pending

    assert take(ledger, assignment("a1", 0)) is Intake.ACCEPTED
    assert take(ledger, assignment("a1", 0)) is Intake.COPY
    pending = ledger.pending["a1"]
    assert (pending.group_ids, pending.final, pending.position) == ([], False, Position(SCHED, 0, 0))
    # TrainData of an assignment that is not this trainer's is never buffered
    planner.take_train_data(ledger, data("other-res", 0, ("g",), True), Position(TRAIN, 0, 0), run_id=RUN,
                            version=0, now=0.0)
    assert "other-res" not in ledger.pending


def test_groups_come_from_the_payload_and_from_train_data_chunks() -> None:
    ledger = Ledger(dedupe_steps=0)
    named = AssignmentPayload(cause="train_step", run_id=RUN, group_ids=("g1", "g2"), final=False).to_json()
    assert take(ledger, assignment("a1", 0, named), now=1.0) is Intake.ACCEPTED
    pending = ledger.pending["a1"]
    assert (pending.group_ids, pending.final) == (["g1", "g2"], False)
    for offset, chunk in enumerate([data("a1", 0, ("g2", "g3"), False), data("a1", 0, ("g9",), True, run_id="x"),
                                    data("a1", 0, ("g4",), True)]):
        planner.take_train_data(ledger, chunk, Position(TRAIN, 0, offset), run_id=RUN, version=0, now=5.0)
    assert (pending.group_ids, pending.final, pending.final_since) == (["g1", "g2", "g3", "g4"], True, 5.0)
    assert pending.positions() == [Position(SCHED, 0, 0), Position(TRAIN, 0, 0), Position(TRAIN, 0, 2)]
    # data for a step already trained is ignored; data before its assignment waits for it
    planner.take_train_data(ledger, data("a0", 0, ("g0",), True), Position(TRAIN, 0, 3), run_id=RUN, version=1,
                            now=5.0)
    planner.take_train_data(ledger, data("a2", 1, ("g5",), True), Position(TRAIN, 0, 4), run_id=RUN, version=1,
                            now=5.0)
    assert "a0" not in ledger.pending and ledger.pending["a2"].assignment is None
    assert take(ledger, assignment("a2", 1), offset=1, version=1) is Intake.ACCEPTED
    assert ledger.pending["a2"].group_ids == ["g5"]


def test_a_final_step_runs_once_its_groups_are_here_or_it_waited_long_enough() -> None:
    ledger = Ledger(dedupe_steps=0)
    take(ledger, assignment("a1", 0))
    pending = ledger.pending["a1"]
    buffer_group(ledger, "g1", 2, offset=0)
    buffer_group(ledger, "g2", 2, offset=10, complete=False)
    planner.take_train_data(ledger, data("a1", 0, ("g1",), False), Position(TRAIN, 0, 0), run_id=RUN, version=0,
                            now=0.0)
    assert not planner.ready_to_run(ledger, pending, group_wait_s=5.0, now=100.0)  # not final yet
    planner.take_train_data(ledger, data("a1", 0, ("g2",), True), Position(TRAIN, 0, 1), run_id=RUN, version=0,
                            now=10.0)
    assert not planner.ready_to_run(ledger, pending, group_wait_s=5.0, now=14.0)  # g2 incomplete
    assert planner.ready_to_run(ledger, pending, group_wait_s=5.0, now=15.0)  # waited group_wait_s
    ledger.add_trajectory(member("g2-s1", "g2"), Position(TRAJ, 0, 20))
    assert planner.ready_to_run(ledger, pending, group_wait_s=5.0, now=10.0)  # everything here


def test_the_oldest_assignment_of_the_current_version_runs_others_are_dropped() -> None:
    ledger = Ledger(dedupe_steps=0)
    for offset, (aid, version) in enumerate([("new", 2), ("b", 1), ("a", 1), ("old", 0)]):
        take(ledger, assignment(aid, version), offset=offset)
    ledger.pending["data-only"] = PendingStep("data-only")  # TrainData, no Assignment
    chosen, dropped = planner.next_assignment(ledger, version=1)
    assert chosen is not None and chosen.assignment_id == "b"  # read before "a"
    assert [p.assignment_id for p in dropped] == ["old"]
    assert set(ledger.pending) == {"new", "b", "a", "data-only"}
    ledger.pending.pop("b")
    ledger.pending.pop("a")
    chosen, dropped = planner.next_assignment(ledger, version=1)
    assert chosen is None and [p.assignment_id for p in dropped] == ["new"]


def test_plan_step_sorts_the_groups_by_what_is_here() -> None:
    ledger = Ledger(dedupe_steps=0)
    full = buffer_group(ledger, "full", 2, offset=0)
    part = buffer_group(ledger, "part", 3, offset=10, complete=False)
    dead = member("dead-s0", "dead")
    ledger.add_batch_ready(ready("dead", dead), Position(TRAJ, 0, 20))
    ledger.drop_trajectory(dead, Position(TRAJ, 0, 21), step=0)
    ledger.finish(["done"], step=0)
    plan = planner.plan_step(ledger, ["part", "full", "never", "done", "dead"])
    assert plan.trained == ("part", "full") and plan.partial == ("part",)
    assert (plan.missing, plan.already, plan.empty) == (("never",), ("done",), ("dead",))
    assert [t.trajectory_id for t in plan.trajectories] == [t.trajectory_id for t in part[:2] + full]
    assert plan.untrained_if_skipped == ("part", "full", "never", "dead")
    assert "1 group(s) missing, 1 with every member dead-lettered, 1 already trained" in plan.nothing_reason()
    assert "full" in ledger.groups  # planning changes nothing


def test_standalone_steps_take_the_oldest_complete_groups_once_there_are_enough() -> None:
    ledger = Ledger(dedupe_steps=0)
    buffer_group(ledger, "late", 2, offset=0, complete=False)
    buffer_group(ledger, "first", 2, offset=10)
    assert planner.standalone_groups(ledger, groups_per_step=2) == []
    solo = trajectory([node(0, -1, [1, 2], [0, 1])], trajectory_id="solo", group_id="", reward=1.0)
    ledger.add_trajectory(solo, Position(TRAJ, 0, 20))  # no group id: a group of its own, complete
    assert planner.standalone_groups(ledger, groups_per_step=2) == ["first", "solo"]
    assert planner.standalone_groups(ledger, groups_per_step=1) == ["first"]


def test_an_abandoned_group_leaves_the_buffer_unless_a_step_holds_it() -> None:
    ledger = Ledger(dedupe_steps=0)
    buffer_group(ledger, "gone", 2, offset=0, complete=False)
    buffer_group(ledger, "held", 2, offset=10, complete=False)
    take(ledger, assignment("a1", 0, AssignmentPayload(run_id=RUN, group_ids=("held",)).to_json()))
    assert planner.abandon_group(ledger, "held", step=0) is None and "held" in ledger.groups
    assert planner.abandon_group(ledger, "gone", step=0) == 1
    assert "gone" in ledger.done_groups and "gone" not in ledger.groups
    assert planner.abandon_group(ledger, "gone", step=0) is None  # already done
    assert ledger.add_trajectory(member("gone-s1", "gone"), Position(TRAJ, 0, 30)) == "late"


def test_step_events_are_functions_of_the_step() -> None:
    origin = StepOrigin(RUN, "trainer:run-1:trainer-0", "a1")
    members = [member("t1", "g"), member("t2", "g")]
    started = started_event(origin, 3, 2, (ME,), members)
    assert started.event_id == step_event_id(RUN, 3, "TrainStepStarted") != step_event_id(RUN, 4, "TrainStepStarted")
    assert (started.num_trajectories, started.num_tokens, started.correlation_id) == (2, 6, "a1")
    skipped = skipped_event(origin, 3, 2, ["g2", "g1", "g2"], "why")
    again = skipped_event(origin, 3, 2, ["g1", "g2"], "why, said again")
    assert skipped.event_id == again.event_id and skipped.dropped_group_ids == ("g1", "g2")
    assert (skipped.status, skipped.new_version, skipped.reason) == ("skipped", 2, "why")
    assert skipped_event(origin, 3, 2, ["g1"], "why").event_id != skipped.event_id
