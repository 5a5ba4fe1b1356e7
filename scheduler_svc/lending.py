"""Cost-aware lending: the rules an adaptive spatiotemporal policy decides by.

A fixed spatiotemporal policy preempts its train-capable resources as soon as a batch (or its first
micro-batch) is ready and lends them back to rollout after every step, whatever that costs. Both are
bets: lending pays only if the rollout work a lent resource does before the next step outweighs what
the round trip costs (a weight load and a role switch back, a switch to training again, the re-prefill
of the requests it held), and starting a step on the ready groups pays only if the stragglers will be
done by the time those groups are trained (else the trainers wait in the step, neither training nor
rolling out). A policy that can decline either bet is at least as good as the fixed one that always
takes it, and at least as good as a fixed disaggregated split (which never lends).

The estimates they decide on are `scheduler_svc.estimates`'s.

Rules (each decision's numbers go into its `reason`):

* take: a step takes the fewest train-capable resources (best roofline `train_priority` first) whose
  estimated training of a batch, ``batch_tokens / (tokens_per_resource_s * n)``, fits
  (`TAKE_HEADROOM` times over) in the time the last step's batch took to arrive (its start to its
  final `TrainData`): when rollout is the bottleneck more training resources would only wait for
  data, so the rest keep rolling out (no round trip at all); when training is the bottleneck the
  batch is there at the start (span 0) and the step takes them all. (Not the group rate: rollout
  is throttled by the staleness budget while training lags, so a rate would read a train
  bottleneck as a slow rollout and take fewer still.)
* the stragglers' rest: when the missing groups (and, under the strict bound's wait rule, every
  group the batch must wait for) are expected done, read from the ages of the groups rolling out
  against the last `LATENCY_WINDOW` latencies (`scheduler_svc.arrivals`: a rate cannot tell a
  batch's long tail from a fresh start, ages can); before `scheduler_svc.arrivals.MIN_LATENCIES`
  completions, the rate times the tail factor (a step's first partial micro-batch predicts by the
  rate when its batch's last group arrives, the final one says when it did);
* start: a partial batch starts training when ``rest_s <= switch_s + train_s(ready)``: the groups still
  missing will be complete before the ready ones are trained; at once when training is the
  bottleneck (`train_bound`: a batch's training fills most of the step period, every second off it
  is lost; resources already kept for training stay so judged down to a lower share, hysteresis);
  idle trainers start unless lending them pays (the lend rule);
* lend: a train-capable resource free after a step goes back to rollout when the window until the next
  step need start exceeds the round trip plus the re-prefill of the requests it will hold when taken
  back, ``window_s > return_s + switch_s + reprefill_s``, the window being the time until the start rule
  will start the step: the stragglers' rest less the training of the groups ready by then, those that
  complete while the resource is lent included (`start_window_s`: the step can start that late and
  still have trained them when the rest arrives), or, when training is the bottleneck (the start rule
  then starts a step on its first micro-batch), the time until the first micro-batch is ready. A
  resource a step frees is judged train bound by the held share (`TRAIN_BOUND_HOLD_SHARE`), as a held
  one is: lent while the estimates sit between the two shares, it is taken back on the first
  micro-batch as soon as they move. The re-prefill is priced from the
  observed train speed (a prefilled token is a third of a trained one's FLOPs) on the rollout resources'
  peak FLOP/s, in seconds of the lent device's decoding (HBM bandwidth ratio): on a mixed pool a
  slow-decoding trainer (an A100 among H20s) brings less than the re-prefill it causes costs the others.
  The window counts at what the lent resource's rollout is worth (`lend_value_share`): a whole resource
  when it gets new work (slot bound); when the staleness budget bounds the running requests, only what
  spreading them over one more resource saves (the KV-cache share of a decode iteration, from the
  observed in-flight context and `SchedulerSettings.kv_balance_tokens`), which short contexts make
  small;
* the in-flight context: each completed sample held on average half its tokens over its latency
  (dispatch to `SampleCompleted`); summed over a step period and divided by it, the context the
  running requests held on average;
* trainers kept idle by the lend rule at a step's end start on the ready groups in the same round.
Without estimates (the first step) every rule takes the bet (all resources), i.e. behaves as the fixed policy,
but for one thing the device specs tell alone: a trainer on which requests would decode slower than on
the serving resources (`runs_no_faster`) is not lent into a budget-bound rollout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from scheduler_svc.arrivals import ARRIVAL_BISECTIONS
from scheduler_svc.estimates import Estimates

#: the take rule takes this many times the resources its one-step estimate needs: a step that takes
#: too few becomes the bottleneck of the next one (and the staleness budget then throttles rollout),
#: one that takes too many only loses their rollout; measured: 1.5 or 1 take too few on the
#: simulator's randomized draws, 2 keeps the fixed policy's results and still frees clear surpluses
TAKE_HEADROOM = 2.0
#: TagTransition cause of a resource kept for training instead of lent
LEND_DECLINED = "lend_declined"
#: training is the bottleneck when a batch's estimated training fills this share of the step period:
#: below it the trainers have slack to roll out (0.7 misreads rollout-bound math runs as train bound
#: on the simulator; 0.85 keeps them and the train-bound agentic ones)
TRAIN_BOUND_SHARE = 0.85
#: relative decode speeds closer than this are equal (a mean over equal devices is off by rounding)
SPEED_TOLERANCE = 1e-9
#: hysteresis of the train-bound test for resources already kept for training (`lend_declined`): they
#: stay judged train bound until training fills less than this share of the period. The estimates move
#: with every completed group, and at one threshold a resource kept because the next step would start
#: on its first micro-batch was lent seconds later on the rest's window, then taken back (a whole
#: round trip and re-prefill for nothing; randomized draw H800:16, lent 10 s after declining). A resource
#: freed by a step is judged by it too (agentic, 32 devices, 8 train: lent at a share just under 0.85
#: for a 172 s window, the next step started train bound 11 s later)
TRAIN_BOUND_HOLD_SHARE = 0.7


@dataclass(frozen=True, slots=True)
class Verdict:
    """One cost-aware decision: take the bet or not, and the estimates it was taken on."""

    take: bool
    benefit_s: float | None
    cost_s: float | None
    what: str

    @property
    def reason(self) -> str:
        if self.benefit_s is None or self.cost_s is None:
            return f"{self.what}: no estimate yet" + (", default" if self.take else "")
        verb = ">" if self.take else "<="
        return f"{self.what}: est {self.benefit_s:.1f}s {verb} cost {self.cost_s:.1f}s"


def start_verdict(
    est: Estimates, *, missing: int, ready_tokens: int, resources: int, switch_s: float, rest_s: float | None = None
) -> Verdict:
    """Start a step on the ready groups now? Pays when the `missing` groups will be complete by the
    time the ready ones are trained (benefit: the train time that hides the stragglers' rest;
    `rest_s`: read from the groups rolling out, else the rate's)."""
    rest = est.rest_s(missing) if rest_s is None else rest_s
    train = est.train_s(ready_tokens, resources)
    if rest is None or train is None:
        return Verdict(True, None, None, "start")
    hidden = switch_s + train
    return Verdict(rest <= hidden, hidden, rest, "start (train hides vs stragglers' rest)")


@dataclass(frozen=True, slots=True)
class Reprefill:
    """What taking a lent resource back costs the others: its running requests move to the rollout
    resources, which prefill their contexts again. Read from the pool (see `reprefill_s`)."""

    sequences: float  # requests a lent resource would hold when taken back
    sample_tokens: float  # tokens of a sample (a request's context when taken back, on average)
    peak_ratio: float  # trainers' peak FLOP/s over the rollout resources'
    decode_ratio: float  # the rollout resources' HBM bandwidth over the lent one's (decode speed)


def reprefill_s(est: Estimates, held: Reprefill | None) -> float:
    """The re-prefill of a lent resource's requests, in seconds of the lent resource's decoding.
    A prefilled token is a third of a trained one's FLOPs (forward only, vs forward and backward),
    so the observed train speed prices it: ``peak_ratio / (3 * tokens_per_resource_s)`` seconds per
    token on a rollout resource, whose seconds are worth `decode_ratio` of the lent one's."""
    if held is None or est.tokens_per_resource_s is None:
        return 0.0
    per_token = held.peak_ratio / (3.0 * est.tokens_per_resource_s)
    return held.sequences * held.sample_tokens * per_token * held.decode_ratio


def lend_verdict(
    est: Estimates,
    *,
    missing_first: int,
    missing_all: int,
    ready: int,
    resources: int,
    switch_s: float,
    held: Reprefill | None = None,
    value_share: float = 1.0,
    first_s: float | None = None,
    rest_s: float | None = None,
    starts_on_first: bool = False,
    arrived: Callable[[float], float] | None = None,
) -> Verdict:
    """Lend a free train-capable resource to rollout? Pays when the expected window until the next
    step starts exceeds the round trip (return load + switch into training again) plus the re-prefill
    of the requests it will hold when taken back (`held`). The next step starts once its first
    micro-batch is ready (`missing_first` groups away) and the rest of the batch (`missing_all`) will
    be done while the batch (those and the `ready` ones) trains (`first_s`, `rest_s`: read from the
    groups rolling out; None: the rate's); when training is the bottleneck (`starts_on_first`: the
    start rule starts a step as soon as it has data, see `train_bound`) the window ends with the first
    micro-batch. `value_share`: see `lend_value_share`. `arrived`: how many of the missing groups are
    expected complete within a horizon (`scheduler_svc.arrivals.arrivals_within`; None: the rate's),
    for the window the start rule will leave (`start_window_s`)."""
    first = est.seconds_for(missing_first) if first_s is None else first_s
    rest = est.rest_s(missing_all) if rest_s is None else rest_s
    trip = est.round_trip_s(switch_s)
    speed = None if est.tokens_per_resource_s is None else est.tokens_per_resource_s * resources
    if first is None or rest is None or speed is None or est.group_tokens is None or trip is None:
        return Verdict(True, None, None, "lend")
    if arrived is None:
        rate = est.rate() or 0.0
        arrived = lambda horizon: min(float(missing_all), horizon * rate)  # noqa: E731
    per_group = est.group_tokens / speed
    window = first if starts_on_first else max(first, start_window_s(rest, switch_s, per_group, ready, arrived))
    prefill = reprefill_s(est, held)
    cost = trip + prefill
    worth = window * value_share
    costs = f"round trip {trip:.1f}s + re-prefill {prefill:.1f}s"
    if value_share < 1.0:
        costs = f"budget bound: window {window:.1f}s x worth {value_share:.2f}; {costs}"
    return Verdict(worth > cost, worth, cost, f"lend ({costs})")


def start_window_s(
    rest_s: float, switch_s: float, per_group_s: float, ready: int, arrived: Callable[[float], float]
) -> float:
    """In how many seconds the start rule (`start_verdict`) will start the next step: the first `t`
    at which the stragglers' rest then left (``rest_s - t``) is hidden by the switch and the training
    of the groups ready by then (`ready` and those `arrived` within `t`, `per_group_s` each). Groups
    keep completing while a lent resource rolls out, and each one's training hides more of the rest,
    so the step starts sooner than the rest less the training of the groups ready now says (that
    window was lent on: randomized draw H200:6+H20:6, a window of 49.9 s priced, the step started 18 s
    later, the lend a loss). Bisected: the lateness falls as `t` and the arrivals grow."""
    hi = rest_s - switch_s - per_group_s * ready
    if hi <= 0:
        return 0.0
    lo = 0.0
    for _ in range(ARRIVAL_BISECTIONS):
        mid = (lo + hi) / 2
        late = rest_s - mid > switch_s + per_group_s * (ready + arrived(mid))
        lo, hi = (mid, hi) if late else (lo, mid)
    return hi


def lend_value_share(
    est: Estimates,
    *,
    slot_bound: bool,
    serving: int,
    alive: int,
    kv_balance_tokens: float | None,
    decode_ratio: float = 1.0,
) -> float:
    """The share of a whole resource's rollout that lending one more brings (1: all of it).

    Slot bound (the serving resources are full and the staleness budget would dispatch more), a lent
    resource takes its share of new requests: a whole resource. Budget bound (the staleness budget,
    not the slots, caps the running requests), it takes no new work, it only spreads the running
    requests: every decode iteration reads the weights once per resource and the KV caches of its
    requests, so spreading them over one more resource cuts each iteration by
    ``kv_share / (serving + 1)``, kv_share = context / (context + kv_balance_tokens) on a serving
    resource. Then the running requests set the period of the whole pipeline (the next batch waits
    for them), so that cut is worth as much on every `alive` resource: the share is
    ``kv_share * alive / (serving + 1)``, at most 1. Short contexts make it small (a lent resource
    adds little but its round trip), long ones large. A lent resource that decodes slower than the
    serving ones (`decode_ratio`: their HBM bandwidth over its own, > 1) runs the requests spread onto
    it that much slower, so it saves that much less (randomized draws with A100 trainers among H20s
    lent at a loss: 0.960x -> 0.988x, 0.945x -> 0.995x of the best other pipeline); and when it is so
    slow that a request there decodes no faster than on a serving resource, it saves nothing
    (`runs_no_faster`)."""
    if slot_bound or kv_balance_tokens is None or serving < 1 or est.inflight_context is None:
        return 1.0
    context = est.inflight_context / serving
    kv_share = context / (context + kv_balance_tokens)
    if runs_no_faster(decode_ratio, kv_share):
        return 0.0
    share = min(1.0, alive / (serving + 1) * kv_share)
    return share / max(1.0, decode_ratio)


def runs_no_faster(decode_ratio: float, kv_share: float) -> bool:
    """Would a request decode no faster on a lent resource than where it runs now? A serving
    resource's decode iteration reads the weights and its requests' KV caches (`kv_share` of the
    iteration); on the lent one, with (almost) no KV, the weights alone take `decode_ratio` times
    as long as on a serving one. So ``decode_ratio * (1 - kv_share) > 1``: the lent iteration is
    longer, and when the running requests set the pipeline's period (budget bound) the requests
    it takes become its stragglers. Homogeneous pools (ratio 1) never are. Measured: A100 trainers
    among H20s (ratio 2) lent after every step on randomized draws lost 2-3 % of the best other
    pipeline over 20 steps; declined, they match it."""
    return decode_ratio * (1.0 - kv_share) > 1.0 + SPEED_TOLERANCE


def train_bound(est: Estimates, *, capable: int, batch_groups: int, holding: bool = False) -> Verdict:
    """Is training the bottleneck? (`take`: yes.) Its estimated time for a batch on all `capable`
    train resources fills `TRAIN_BOUND_SHARE` of the pipeline's period (the mean of the last steps'
    ends): then every second the trainers spend not training stretches the period, so a step
    starts as soon as it has data, whatever the stragglers. `holding`: asked whether to lend a free
    train-capable resource (from a step or kept for training), which stays train bound down to
    `TRAIN_BOUND_HOLD_SHARE` (hysteresis); the start rule asks with the higher share."""
    period = est.period_s
    train = None if est.group_tokens is None else est.train_s(round(est.group_tokens * batch_groups), capable)
    if period is None or train is None:
        return Verdict(False, None, None, "train bound")
    share = TRAIN_BOUND_HOLD_SHARE if holding else TRAIN_BOUND_SHARE
    what = "train bound (held)" if holding else "train bound"
    return Verdict(train >= share * period, train, share * period, what)


def take_count(est: Estimates, *, capable: int, batch_groups: int) -> tuple[int, str]:
    """How many of the `capable` train-capable resources the next step takes (the best by
    `train_priority` first): the fewest that would have trained the last step's batch in the time
    its data took to arrive (see the module doc), all of them without estimates."""
    span = est.data_span_s
    if span is None or est.group_tokens is None or est.tokens_per_resource_s is None or capable <= 1:
        return capable, f"take {capable} of {capable}: no estimate yet, all"
    tokens = est.group_tokens * batch_groups
    need = TAKE_HEADROOM * tokens / (est.tokens_per_resource_s * max(span, 1e-9))
    n = min(capable, max(1, math.ceil(need)))
    bottleneck = "train" if n == capable else "rollout"
    return n, (
        f"take {n} of {capable} ({bottleneck} bound): train est {tokens / (est.tokens_per_resource_s * n):.1f}s "
        f"on {n} vs last batch arriving over {span:.1f}s"
    )
