"""Adaptive lending's decisions on hand-made situations: the estimates (from observed records) and
the two rules, lend and start, each with the case that takes the bet and the one that declines it."""

from __future__ import annotations

import pytest

from scheduler_svc.arrivals import arrival_s, arrivals_within
from scheduler_svc.decisions import (
    Assignment,
    LoadWeights,
    PauseRollout,
    ResumeRollout,
    SampleCompleted,
    TagTransition,
    TaskCompleted,
    TaskDispatched,
    TrainData,
    TrainStepCompleted,
    WeightsLoaded,
)
from scheduler_svc.estimates import Estimates, observe
from scheduler_svc.lending import (
    LEND_DECLINED,
    TRAIN_BOUND_HOLD_SHARE,
    Reprefill,
    lend_value_share,
    lend_verdict,
    reprefill_s,
    runs_no_faster,
    start_verdict,
    start_window_s,
    take_count,
    train_bound,
)
from scheduler_svc.policies import spatiotemporal
from scheduler_svc.tags import TRAIN

pytestmark = pytest.mark.unit


def observed(group_every_s: float, tokens_per_resource_s: float = 1000.0, return_s: float = 7.0) -> Estimates:
    """Estimates as the log would build them: groups of 10,000 tokens completing every
    `group_every_s`, a 100 s step on 2 resources, and one resource's return load."""
    est = Estimates()
    for i in range(10):
        observe(est, TaskCompleted("t", f"g{i}", 4, 0, 10_000), i * group_every_s, 0, 0)
    observe(est, Assignment("a1", "train", ("r0", "r1"), "train_step", 0, 0), 100.0, 0, 0)
    observe(est, TrainStepCompleted(200.0, "a1", 0, 1), 200.0, round(tokens_per_resource_s * 200), 2)
    observe(est, LoadWeights("r0", 1, "s1", "train_step_done"), 200.0, 0, 0)
    observe(est, WeightsLoaded(200.0 + return_s, "r0", 1), 200.0 + return_s, 0, 0)
    return est


def test_estimates_come_from_the_observed_records() -> None:
    est = observed(group_every_s=2.0)
    assert est.rate() == pytest.approx(0.5)
    assert est.tokens_per_resource_s == pytest.approx(1000.0)
    assert est.return_s == pytest.approx(7.0)
    assert est.train_s(4000, 2) == pytest.approx(2.0)


def test_lend_when_the_idle_window_exceeds_the_cost() -> None:
    # 30 groups missing at 0.5 groups/s: 60 s until the next step; the round trip costs 7 + 4 s
    v = lend_verdict(observed(2.0), missing_first=30, missing_all=30, ready=0, resources=2, switch_s=4.0)
    assert v.take and v.benefit_s is not None and v.cost_s == pytest.approx(11.0) and v.benefit_s > v.cost_s
    assert "lend" in v.reason and "cost 11.0s" in v.reason


def test_do_not_lend_when_the_window_is_shorter_than_the_cost() -> None:
    # 2 groups missing at 0.5 groups/s: 4 s until the next step, less than the 11 s round trip
    v = lend_verdict(observed(2.0), missing_first=2, missing_all=2, ready=0, resources=2, switch_s=4.0)
    assert not v.take and v.benefit_s is not None and v.benefit_s <= v.cost_s


def test_the_re_prefill_of_the_requests_it_would_hold_can_make_lending_not_pay() -> None:
    """A 20 s window beats the 11 s round trip alone, but the 20 requests of 2,500 tokens a lent
    resource would hold cost the others 20 * 2,500 / (3 * 1,000 tokens/s) = 16.7 s to prefill again."""
    est = observed(2.0)
    plain = lend_verdict(est, missing_first=10, missing_all=10, ready=0, resources=2, switch_s=4.0)
    held = Reprefill(sequences=20, sample_tokens=2500, peak_ratio=1.0, decode_ratio=1.0)
    v = lend_verdict(est, missing_first=10, missing_all=10, ready=0, resources=2, switch_s=4.0, held=held)
    assert plain.take and plain.cost_s == pytest.approx(11.0)
    assert not v.take and v.cost_s == pytest.approx(11.0 + 50_000 / 3000)
    assert "re-prefill 16.7s" in v.reason and "round trip 11.0s" in v.reason


def test_re_prefill_weighs_more_when_the_lent_device_decodes_slower_or_the_others_compute_less() -> None:
    """The cost is in seconds of the lent device's decoding: a rollout device with twice its HBM
    bandwidth loses twice as much of the lent one's work per second of re-prefill; one with half the
    trainers' peak FLOP/s takes twice as long to prefill."""
    est = observed(2.0)
    base = reprefill_s(est, Reprefill(20, 2500, peak_ratio=1.0, decode_ratio=1.0))
    assert base == pytest.approx(50_000 / 3000)
    assert reprefill_s(est, Reprefill(20, 2500, peak_ratio=1.0, decode_ratio=2.0)) == pytest.approx(2 * base)
    assert reprefill_s(est, Reprefill(20, 2500, peak_ratio=2.0, decode_ratio=1.0)) == pytest.approx(2 * base)
    assert reprefill_s(Estimates(), Reprefill(20, 2500, 1.0, 1.0)) == 0.0  # no train speed observed yet


def test_train_as_the_bottleneck_keeps_the_resources_for_training() -> None:
    """When training the next batch takes longer than producing the rest of it, the window a lent
    resource would roll out in vanishes: train is the bottleneck, so the resources stay taken."""
    fast_rollout = observed(0.1, tokens_per_resource_s=100.0)  # 10 groups/s; training 50 tokens/s/res
    v = lend_verdict(fast_rollout, missing_first=0, missing_all=40, ready=0, resources=2, switch_s=4.0)
    assert not v.take
    slow_rollout = observed(20.0, tokens_per_resource_s=100_000.0)
    v = lend_verdict(slow_rollout, missing_first=0, missing_all=40, ready=0, resources=2, switch_s=4.0)
    assert v.take


def test_start_on_ready_groups_only_when_the_stragglers_will_be_done_in_time() -> None:
    est = observed(2.0)
    # ready: 100,000 tokens on 2 resources = 50 s of training; 10 missing groups need 20 s
    assert start_verdict(est, missing=10, ready_tokens=100_000, resources=2, switch_s=4.0).take
    # 100 missing groups need 200 s: the trainers would wait in the step, so they keep rolling out
    assert not start_verdict(est, missing=100, ready_tokens=100_000, resources=2, switch_s=4.0).take


def test_without_estimates_the_fixed_policy_is_kept() -> None:
    v = lend_verdict(Estimates(), missing_first=1, missing_all=1, ready=0, resources=1, switch_s=4.0)
    assert v.take and "no estimate" in v.reason
    assert start_verdict(Estimates(), missing=5, ready_tokens=1, resources=1, switch_s=4.0).take


def test_a_resource_taken_back_while_loading_to_lend_drops_the_requests_queued_at_it(world_factory) -> None:
    """The stall of a randomized draw: a train-capable resource lent after a step is still loading
    the new weights (the proxy already queues requests there) when the next batch is ready and the
    step takes it back. Those requests must be aborted (sent elsewhere): left queued at a trainer,
    their groups never complete, and a step waiting for its stragglers never ends."""
    world = world_factory(spatiotemporal(1), batch=1, samples=1, inflight_per_resource=2)
    world.register_all(["H800", "H800"])
    first, second = sorted(world.inflight)
    world.complete_group(first)
    lent = world.finish_train()
    assert any(isinstance(d, LoadWeights) and d.resource_id == "r0" and d.cause == "train_step_done" for d in lent)
    taken = world.complete_group(second)  # before r0 acknowledged its load
    train = [d for d in taken if isinstance(d, Assignment) and d.task_kind == TRAIN]
    assert [a.resource_ids for a in train] == [("r0",)]
    aborts = [i for i, d in enumerate(taken) if isinstance(d, PauseRollout) and d.resource_id == "r0"]
    assert [taken[i].mode for i in aborts] == ["abort"] and aborts[0] < taken.index(train[0])
    assert not any(isinstance(d, ResumeRollout) and d.resource_id == "r0" for d in world.ack_load("r0"))


def stepped(data_span_s: float, tokens_per_resource_s: float = 1000.0) -> Estimates:
    """Estimates after one step on 4 resources whose batch (groups of 10,000 tokens) took
    `data_span_s` to arrive after the step started."""
    est = observed(2.0)
    observe(est, Assignment("a2", "train", ("r0", "r1", "r2", "r3"), "train_step", 1, 1), 300.0, 0, 0)
    observe(est, TrainData("a2", 1, ("g",), (0,), True, ((1, 10_000),)), 300.0 + data_span_s, 0, 0)
    end = 300.0 + data_span_s + 10_000 / (tokens_per_resource_s * 4)
    observe(est, TrainStepCompleted(end, "a2", 1, 2), end, 40_000, 4)
    return est


def test_rollout_bound_steps_take_fewer_train_resources() -> None:
    """The last batch took 100 s to arrive; 4 groups of 10,000 tokens train in 40,000 / 1000 = 40
    resource-seconds, so 1 resource trains them before the data is there, even with the headroom
    (twice the need, 0.8): 3 of 4 keep rolling out."""
    est = stepped(100.0)
    assert est.data_span_s == pytest.approx(100.0)
    assert est.tokens_per_resource_s == pytest.approx(1000.0)  # the tail, not the wait for data
    n, reason = take_count(est, capable=4, batch_groups=4)
    assert n == 1 and "rollout bound" in reason


def test_train_bound_steps_take_all_train_resources() -> None:
    # the whole batch was ready when the step started: training is the bottleneck, take all four
    n, reason = take_count(stepped(0.0), capable=4, batch_groups=4)
    assert n == 4 and "train bound" in reason
    # a batch arriving over 30 s: 40 resource-seconds need 4/3 resources, twice that (headroom): 3
    assert take_count(stepped(30.0), capable=4, batch_groups=4)[0] == 3
    assert take_count(Estimates(), capable=4, batch_groups=4)[0] == 4  # no estimate: the fixed policy


def test_a_step_takes_its_resources_by_train_priority(world_factory) -> None:
    """An adaptive step taking fewer than the train-capable set takes the best for training first
    (roofline train_priority: an H800 before an H20), and its reason says how many and why."""
    world = world_factory(spatiotemporal(2, adaptive=True), batch=1, samples=1, inflight_per_resource=2)
    world.register_all(["H20", "H800", "H20"])
    assert len(world.scheduler.rollout.trainers()) == 2
    world.scheduler.rollout.estimates = stepped(1e6)  # rollout bound: one resource is enough
    decisions = world.complete_group(sorted(world.inflight)[0])
    train = [d for d in decisions if isinstance(d, Assignment) and d.task_kind == TRAIN]
    assert [a.resource_ids for a in train] == [("r1",)]  # the H800
    assert train[0].reason.startswith("take 1 of 2 (rollout bound)")


def test_a_long_tail_stretches_the_stragglers_rest() -> None:
    """A step's first micro-batch (2 of 12 groups) predicts by the rate (0.5 groups/s) that the other
    10 arrive in 20 s; they took 40 s. The tail factor moves halfway there (1.5), so the next
    estimates of a batch's rest are 1.5 times the rate's; one absurd step is clamped."""
    est = observed(2.0)
    assert est.rest_s(10) == pytest.approx(20.0)
    observe(est, TrainData("a2", 1, ("g0", "g1"), (0, 0), False, ((1, 20_000),)), 300.0, 0, 0, 12)
    observe(est, TrainData("a2", 1, tuple(f"h{i}" for i in range(10)), (0,) * 10, True, ((1, 1),)), 340.0, 0, 0, 12)
    assert est.tail_bias == pytest.approx(1.5)
    assert est.rest_s(10) == pytest.approx(30.0)
    observe(est, TrainData("a3", 2, ("g2", "g3"), (1, 1), False, ((1, 20_000),)), 400.0, 0, 0, 12)
    observe(est, TrainData("a3", 2, ("h",), (1,), True, ((1, 1),)), 400.0 + 20.0 * 100, 0, 0, 12)
    assert est.tail_bias == pytest.approx(0.5 * 1.5 + 0.5 * 8.0)  # clamped at 8


def test_train_is_the_bottleneck_when_a_batch_s_training_fills_the_step_period() -> None:
    """Steps end 202.5 s apart (`stepped(100)`); a batch of 40 groups of 10,000 tokens trains on 4
    resources in 100 s: slack, the start rule weighs stragglers. A batch of 80 trains in 200 s, past
    0.85 of the period: every second off training is lost, the step starts at once."""
    est = stepped(100.0)
    assert est.step_interval_s == pytest.approx(202.5)
    slack = train_bound(est, capable=4, batch_groups=40)
    assert not slack.take and slack.benefit_s == pytest.approx(100.0)
    bound = train_bound(est, capable=4, batch_groups=80)
    assert bound.take and bound.benefit_s == pytest.approx(200.0) and "train bound" in bound.reason
    assert not train_bound(Estimates(), capable=4, batch_groups=80).take  # no estimate: weigh as before


def test_resources_kept_for_training_stay_train_bound_down_to_the_hold_share() -> None:
    """Hysteresis: the period is 202.5 s (`stepped(100)`); a batch of 64 groups trains on 4
    resources in 160 s, 0.79 of it: below the 0.85 the start rule judges by, so it weighs the
    stragglers, but a free train-capable resource (kept for training, or freed by a step) stays train
    bound for the lend rule down to 0.7 (141.75 s): the estimates moving with each completed group do
    not lend it seconds before the start rule judges the step train bound and takes it back."""
    est = stepped(100.0)
    assert not train_bound(est, capable=4, batch_groups=64).take
    held = train_bound(est, capable=4, batch_groups=64, holding=True)
    assert held.take and held.cost_s == pytest.approx(TRAIN_BOUND_HOLD_SHARE * 202.5) and "held" in held.reason
    assert not train_bound(est, capable=4, batch_groups=56, holding=True).take  # 140 s < 141.75 s


def test_one_short_period_after_a_backlog_does_not_read_as_train_bound() -> None:
    """Periods alternate: a step started on a backlog ends 80 s after the one before, the next one
    300 s after (measured so on the simulator). A batch of 60 groups trains in 150 s on 4 resources:
    past 0.85 of the last period (80 s) alone, but the pipeline's period is the mean of the last ones
    (202.5, 80: 141.25 s, then 194.2 s with 300): training fills it only while the short periods dominate."""
    est = stepped(100.0)
    end = est.last_step_end
    assert end is not None
    observe(est, TrainStepCompleted(end + 80.0, "a3", 2, 3), end + 80.0, 40_000, 4)
    assert est.step_interval_s == pytest.approx(80.0) and est.period_s == pytest.approx(141.25)
    assert train_bound(est, capable=4, batch_groups=60).take  # 150 s >= 0.85 * 141.25
    observe(est, TrainStepCompleted(end + 380.0, "a4", 3, 4), end + 380.0, 40_000, 4)
    assert est.period_s == pytest.approx((202.5 + 80.0 + 300.0) / 3)
    assert not train_bound(est, capable=4, batch_groups=60).take  # 150 s < 0.85 * 194.2
    for i in range(5):  # the mean keeps only the last PERIOD_WINDOW periods
        observe(est, TrainStepCompleted(end + 480.0 + 100.0 * i, f"b{i}", 4 + i, 5 + i), end + 480.0 + 100.0 * i, 0, 4)
    assert est.period_s == pytest.approx(100.0)


def test_the_lend_window_is_the_stragglers_rest_less_the_ready_groups_training() -> None:
    """20 groups missing at 0.5 groups/s arrive in 40 s; the 10 ready ones (100,000 tokens) train on
    2 resources in 50 s: the step must start now to have trained them by then, no window to lend.
    With 2 ready (10 s of training) the step could start 26 s later (less the 4 s switch), but the
    groups completing meanwhile train 5 s each: the start rule starts it once 40 - t <= 4 + 5 (2 +
    t / 2), 26 / 3.5 s from now, less than the 11 s round trip: keep it. Ten times the train speed,
    the groups train 0.5 s each and the window is (40 - 4 - 1) / 1.25 = 28 s: lend."""
    est = observed(2.0)
    v = lend_verdict(est, missing_first=0, missing_all=20, ready=10, resources=2, switch_s=4.0)
    assert not v.take and v.benefit_s == pytest.approx(0.0)
    v = lend_verdict(est, missing_first=0, missing_all=20, ready=2, resources=2, switch_s=4.0)
    assert not v.take and v.benefit_s == pytest.approx(26.0 / 3.5, abs=1e-3)
    fast = observed(2.0, tokens_per_resource_s=10_000.0)
    v = lend_verdict(fast, missing_first=0, missing_all=20, ready=2, resources=2, switch_s=4.0)
    assert v.take and v.benefit_s == pytest.approx(35.0 / 1.25, abs=1e-3)


def test_the_start_window_ends_when_the_groups_arrived_by_then_hide_the_rest() -> None:
    """The start rule starts a step once the rest then left is hidden by the switch and the training
    of the groups ready by then. No arrivals: the rest less the switch and the ready groups' training;
    groups completing meanwhile bring it forward; a rest already hidden leaves no window."""
    assert start_window_s(60.0, 4.0, 2.0, 3, lambda t: 0.0) == pytest.approx(50.0, abs=1e-3)
    assert start_window_s(60.0, 4.0, 2.0, 3, lambda t: t / 2) == pytest.approx(25.0, abs=1e-3)
    assert start_window_s(60.0, 4.0, 2.0, 3, lambda t: min(10.0, t / 2)) == pytest.approx(30.0, abs=1e-3)
    assert start_window_s(60.0, 4.0, 2.0, 3, lambda t: 30.0 if t >= 5 else 0.0) == pytest.approx(5.0, abs=1e-3)
    assert start_window_s(10.0, 4.0, 2.0, 3, lambda t: 0.0) == 0.0


def test_when_training_is_the_bottleneck_the_lend_window_ends_with_the_first_micro_batch() -> None:
    """A train-bound step starts as soon as it has data (`train_bound`): the 8 groups of its first
    micro-batch, 16 s away at 0.5 groups/s, end the window whatever the rest of the batch needs."""
    est = observed(2.0)
    v = lend_verdict(est, missing_first=8, missing_all=60, ready=0, resources=2, switch_s=4.0, starts_on_first=True)
    assert v.take and v.benefit_s == pytest.approx(16.0)
    v = lend_verdict(est, missing_first=4, missing_all=60, ready=0, resources=2, switch_s=4.0, starts_on_first=True)
    assert not v.take and v.benefit_s == pytest.approx(8.0)  # less than the 11 s round trip
    slack = lend_verdict(est, missing_first=4, missing_all=60, ready=0, resources=2, switch_s=4.0)
    # not train bound: the rest's window, 120 s less the switch, brought forward by the groups arriving meanwhile
    assert slack.take and slack.benefit_s == pytest.approx((120.0 - 4.0) / 3.5, abs=1e-3)


def test_the_in_flight_context_is_measured_from_the_samples_latencies_and_lengths() -> None:
    """Steps end at 0 and 40 s; two samples dispatched at 0 finish at 10 s (1,000 tokens) and 20 s
    (2,000): each held on average half its context over its latency, so the period's running
    requests held (10 * 500 + 20 * 1000) / 40 = 625 context tokens on average."""
    est = Estimates()
    observe(est, TrainStepCompleted(0.0, "a0", 0, 1), 0.0, 0, 0)
    observe(est, TaskDispatched("t", "g", 2), 0.0, 0, 0)
    observe(est, SampleCompleted(10.0, "g", 0, 1000), 10.0, 0, 0)
    observe(est, SampleCompleted(20.0, "g", 1, 2000), 20.0, 0, 0)
    observe(est, TaskCompleted("t", "g", 2, 0, 3000), 20.0, 0, 0)
    assert est.inflight_context is None  # no full period seen yet
    observe(est, TrainStepCompleted(40.0, "a1", 1, 2), 40.0, 0, 0)
    assert est.inflight_context == pytest.approx(625.0)
    assert "g" not in est.dispatched_at and est.context_area == 0.0


def with_context(tokens: float) -> Estimates:
    est = observed(2.0)
    est.inflight_context = tokens
    return est


def test_a_lent_resource_is_worth_what_spreading_the_running_requests_saves_when_the_budget_binds() -> None:
    """4 serving resources of 12 alive hold 40,000 context tokens: 10,000 each, a KV read of
    10,000 / (10,000 + 110,000) of a decode iteration (the weights weigh as much as 110,000 tokens);
    one more resource cuts each iteration by that / 5, on all 12 resources: worth 12 / 5 / 12 = 0.2
    of a resource. Long contexts make it a whole one; with free work for it (slot bound) it is one."""
    share = lend_value_share(with_context(40_000), slot_bound=False, serving=4, alive=12, kv_balance_tokens=110_000)
    assert share == pytest.approx(12 / 5 * 10_000 / 120_000)
    long = lend_value_share(with_context(4_000_000), slot_bound=False, serving=4, alive=12, kv_balance_tokens=110_000)
    assert long == 1.0  # capped: 12 / 5 * 0.9
    assert lend_value_share(with_context(40_000), slot_bound=True, serving=4, alive=12, kv_balance_tokens=110_000) == 1
    # nothing known about the model or the context yet: a whole resource, as before
    assert lend_value_share(with_context(40_000), slot_bound=False, serving=4, alive=12, kv_balance_tokens=None) == 1
    assert lend_value_share(observed(2.0), slot_bound=False, serving=4, alive=12, kv_balance_tokens=110_000) == 1


def test_a_slow_decoding_lent_resource_spreading_the_running_requests_is_worth_its_decode_speed() -> None:
    """An A100 (2.0 TB/s) lent among H20s (4.0 TB/s) on long contexts (150,000 tokens per serving
    resource, 150 / 260 of its decode iteration is KV): the requests moved onto it decode at half the
    others' speed, so spreading them there saves half as much. A faster decoder is not counted above
    the even share, and slot bound it is a whole resource of its own kind (the window and the round
    trip are both in its seconds)."""
    est = with_context(600_000)
    even = lend_value_share(est, slot_bound=False, serving=4, alive=4, kv_balance_tokens=110_000)
    slow = lend_value_share(est, slot_bound=False, serving=4, alive=4, kv_balance_tokens=110_000, decode_ratio=2.0)
    fast = lend_value_share(est, slot_bound=False, serving=4, alive=4, kv_balance_tokens=110_000, decode_ratio=0.5)
    assert even == pytest.approx(4 / 5 * 150 / 260)
    assert slow == pytest.approx(even / 2) and fast == pytest.approx(even)
    assert lend_value_share(est, slot_bound=True, serving=4, alive=4, kv_balance_tokens=110_000, decode_ratio=2.0) == 1


def test_a_lent_resource_on_which_requests_decode_slower_than_where_they_are_is_worth_nothing() -> None:
    """Short contexts (10,000 tokens per serving resource, 1/12 of an iteration): on the A100 the
    weights alone take 2 x 11/12 of an H20's iteration, so what it takes runs slower than it would
    have: no share at all, and a 60 s window does not pay the round trip. Homogeneous pools never are
    in this case, an H200 (faster) never is, and slot bound (new work of its own) it is a whole one."""
    est = with_context(40_000)
    assert runs_no_faster(2.0, 10_000 / 120_000) and not runs_no_faster(2.0, 0.6)
    assert not runs_no_faster(1.0, 0.0) and not runs_no_faster(4.0 / 4.8, 0.0)
    # a mean over equal devices is off by rounding (12 x 3.35 / 12 over 4 x 3.35 / 4 = 1.0000000000000002)
    assert not runs_no_faster(sum([3.35] * 12) / 12 / (sum([3.35] * 4) / 4), 0.0)
    assert runs_no_faster(4.0 / 3.35, 0.1)  # an H800 among H20s, short contexts
    slow = lend_value_share(est, slot_bound=False, serving=4, alive=12, kv_balance_tokens=110_000, decode_ratio=2.0)
    assert slow == 0.0
    v = lend_verdict(observed(2.0), missing_first=30, missing_all=30, ready=0, resources=2, switch_s=4.0,
                     value_share=slow)
    assert not v.take and v.benefit_s == 0.0
    assert lend_value_share(est, slot_bound=True, serving=4, alive=12, kv_balance_tokens=110_000, decode_ratio=2.0) == 1


@pytest.mark.parametrize(("trainer", "lent"), [("A100", False), ("H200", True)])
def test_before_any_estimate_a_slower_decoding_trainer_is_not_lent_into_a_budget_bound_rollout(
    world_factory, trainer: str, lent: bool
) -> None:
    """An H20 serves all the staleness budget lets out (4 one-sample groups, 4 slots) when the
    trainer joins: lent, it would only take requests off the H20. An A100 (2.0 TB/s) would decode
    them at half speed, the batch's stragglers: kept for training, with the reason. An H200 (4.8
    TB/s) decodes faster: lent, as the fixed policy does. The kept one trains the first step."""
    policy = spatiotemporal(1, adaptive=True)
    world = world_factory(policy, batch=2, samples=1, inflight_per_resource=4)
    world.register("r0", "H20")
    decisions = world.register("r1", trainer)
    kept = [d for d in decisions if isinstance(d, TagTransition) and d.cause == LEND_DECLINED]
    resumed = [d for d in decisions if isinstance(d, ResumeRollout | LoadWeights) and d.resource_id == "r1"]
    if lent:
        assert resumed and not kept
        return
    assert [d.resource_id for d in kept] == ["r1"] and not resumed
    assert "decodes 1.96x slower" in kept[0].reason and "no estimate yet" in kept[0].reason
    first, second = sorted(world.inflight)[:2]
    world.complete_group(first)
    decisions = world.complete_group(second)
    train = [d for d in decisions if isinstance(d, Assignment) and d.task_kind == TRAIN]
    assert [a.resource_ids for a in train] == [("r1",)]


def test_do_not_lend_into_a_budget_bound_rollout_of_short_contexts() -> None:
    """A 60 s window beats the 11 s round trip when the lent resource rolls out as a whole one; when
    the staleness budget bounds the running requests and it is worth 0.1 of one, 6 s do not."""
    whole = lend_verdict(observed(2.0), missing_first=30, missing_all=30, ready=0, resources=2, switch_s=4.0)
    assert whole.take
    v = lend_verdict(
        observed(2.0), missing_first=30, missing_all=30, ready=0, resources=2, switch_s=4.0, value_share=0.1
    )
    assert not v.take and v.benefit_s == pytest.approx(6.0) and v.cost_s == pytest.approx(11.0)
    assert "budget bound: window 60.0s x worth 0.10" in v.reason
    worth = lend_verdict(
        observed(2.0), missing_first=30, missing_all=30, ready=0, resources=2, switch_s=4.0, value_share=0.5
    )
    assert worth.take  # long contexts: 30 s of a resource's rollout outweigh the round trip


def test_trainers_kept_idle_at_a_step_end_start_the_next_step_at_once(world_factory) -> None:
    """At a step's end the start rule keeps rolling-out trainers off a partial batch (the straggler
    needs 10 s, more than the 4 s switch) and the lend rule keeps them from rollout (no window): kept
    idle, they start on the ready micro-batch in the same decision round, not at the next record."""
    policy = spatiotemporal(1, adaptive=True, train_microbatches=2)
    world = world_factory(policy, batch=2, samples=1, inflight_per_resource=4)
    world.register_all(["H800", "H800"])
    first, second, third = sorted(world.inflight)[:3]
    world.complete_group(first)  # the first micro-batch: step 0 starts (no estimates yet)
    world.complete_group(second)  # its final one
    world.complete_group(third)  # ready for step 1: half its batch
    world.scheduler.rollout.estimates = observed(10.0)  # a group every 10 s, 10 s to train one
    decisions = world.finish_train()
    kept = [d for d in decisions if isinstance(d, TagTransition) and d.cause == LEND_DECLINED]
    assert [d.resource_id for d in kept] == ["r0"] and "lend" in kept[0].reason
    train = [d for d in decisions if isinstance(d, Assignment) and d.task_kind == TRAIN]
    assert [a.resource_ids for a in train] == [("r0",)] and decisions.index(kept[0]) < decisions.index(train[0])
    assert "start idle trainers" in train[0].reason


def with_latencies(*latencies: float) -> Estimates:
    """Estimates whose groups, each dispatched at 0, took these latencies to complete."""
    est = Estimates()
    for i, latency in enumerate(latencies):
        observe(est, TaskDispatched("t", f"l{i}", 4), 0.0, 0, 0)
        observe(est, TaskCompleted("t", f"l{i}", 4, 0, 10_000), latency, 0, 0)
    return est


TEN_TO_HUNDRED = tuple(10.0 * i for i in range(1, 11))


def test_the_stragglers_rest_is_read_from_the_ages_of_the_groups_rolling_out() -> None:
    """Latencies 10, 20, ..., 100 s observed. A group 55 s into its rollout is one of the five that
    take 60 to 100 s: it is even odds to be done by 80 s, 25 s from now. The latencies, not the
    ages, are what a fresh group needs: 50 s for even odds. Too few latencies: the rate decides."""
    est = with_latencies(*TEN_TO_HUNDRED)
    assert list(est.latencies) == list(TEN_TO_HUNDRED) and not est.dispatched_at
    assert arrival_s(est.latencies, [55.0], 1) == pytest.approx(25.0, abs=1e-3)
    assert arrival_s(est.latencies, [], 1) == pytest.approx(50.0, abs=1e-3)  # not dispatched yet: age 0
    assert arrival_s(est.latencies, [55.0, 95.0], 0) == 0.0
    assert arrival_s(with_latencies(10.0, 20.0).latencies, [5.0], 1) is None


def test_the_arrivals_within_a_horizon_are_read_from_the_same_ages() -> None:
    """Latencies 10, 20, ..., 100 s. A group 55 s in is done within 25 s at even odds, within 45 s
    surely (three of the five latencies over 55 s end by 80 s, all by 100 s); two more not dispatched
    yet (age 0) are each done within 50 s at even odds; the count is capped at the groups missing."""
    lats = with_latencies(*TEN_TO_HUNDRED).latencies
    one = arrivals_within(lats, [55.0], 1)
    assert one is not None and one(25.0) == pytest.approx(0.6) and one(45.0) == pytest.approx(1.0)
    three = arrivals_within(lats, [55.0], 3)
    assert three is not None and three(50.0) == pytest.approx(1.0 + 2 * 0.5)
    assert three(1000.0) == 3.0
    assert arrivals_within(lats, [55.0], 0) is None
    assert arrivals_within(with_latencies(10.0, 20.0).latencies, [5.0], 1) is None


def test_the_batch_waits_for_its_barrier_of_old_stragglers_whatever_else_is_ready() -> None:
    """One more group from four rolling out (three 5 s in, one 15 s in) is expected within 15 s; but
    when the strict bound makes the batch wait for the old one (this step is the last it may train
    in), the batch's rest is that group's: one of the nine latencies of 20 s or more, even odds by
    60 s, 45 s from now."""
    est = with_latencies(*TEN_TO_HUNDRED)
    ages = [5.0, 5.0, 5.0, 15.0]
    assert arrival_s(est.latencies, ages, 1) == pytest.approx(15.0, abs=1e-3)  # three chances in ten each by 20 s
    assert arrival_s(est.latencies, ages, 1, barrier=[15.0]) == pytest.approx(45.0, abs=1e-3)


def test_a_group_older_than_every_latency_seen_is_due_now() -> None:
    assert arrival_s(with_latencies(*TEN_TO_HUNDRED).latencies, [150.0], 1) == pytest.approx(0.0, abs=1e-3)


def test_the_start_rule_weighs_the_rest_read_from_the_ages() -> None:
    """50 s of training on the ready groups hide a straggler 55 s in (25 s left), not a fresh
    group's 50 s plus the switch when it must come from a group just dispatched."""
    est = observed(2.0)
    kw = {"missing": 1, "ready_tokens": 100_000, "resources": 2, "switch_s": 4.0}
    assert start_verdict(est, rest_s=25.0, **kw).take
    v = start_verdict(est, rest_s=60.0, **kw)
    assert not v.take and v.cost_s == pytest.approx(60.0) and v.benefit_s == pytest.approx(54.0)
