"""What one train step did (`StepResult`), and its `TrainStepCompleted` (ids are set by `step_events`)."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.events import TrainStepCompleted
from trainer_svc.selection import describe_dropped


@dataclass(frozen=True)
class StepResult:
    """What one train step did. `kl` is the KL to the reference (`kl_estimator`) when kl_coef > 0,
    otherwise the k3 KL between the updated-from policy and the behaviour policies (how off-policy the
    data was). Token means (`entropy`, the clip fractions) are over the trained tokens; the response
    lengths are over the step's kept sessions, masked or not (what a runaway length shows in)."""

    step: int
    policy_version: int
    new_version: int
    loss: float
    policy_loss: float
    kl_loss: float
    value_loss: float
    reward_mean: float
    kl: float
    kl_behaviour: float
    clip_fraction: float
    iw_mean: float
    iw_max: float
    iw_capped_fraction: float
    clip_fraction_low: float  # ratio clipped at 1 - clip_eps (negative advantage)
    clip_fraction_high: float  # ratio clipped at 1 + clip_eps_high (positive advantage)
    entropy: float  # mean entropy of the policy at the trained tokens, before the update
    response_length_mean: float  # mean generated tokens per call output
    truncated_fraction: float  # sessions with a call output of max_response_tokens (0 when unknown)
    num_groups: int  # groups with a usable member
    zero_variance_groups: int  # of those, groups whose usable members all have one reward (no gradient)
    staleness_histogram: tuple[int, ...]
    stale_tokens: int
    num_tokens: int
    num_branch_tokens: int
    num_trainable_tokens: int
    num_micro_batches: int
    num_updates: int
    grad_norm: float
    duration_ms: float
    trajectory_ids: tuple[str, ...]
    skipped_trajectory_ids: tuple[str, ...] = ()
    dropped_groups: tuple[tuple[str, str], ...] = ()  # (group key, why it was not trained on)

    def to_event(self, *, run_id: str, producer: str = "") -> TrainStepCompleted:
        return TrainStepCompleted(
            producer=producer,
            correlation_id=run_id,
            run_id=run_id,
            step=self.step,
            new_version=self.new_version,
            loss=self.loss,
            reward_mean=self.reward_mean,
            kl=self.kl,
            clip_fraction=self.clip_fraction,
            staleness_histogram=self.staleness_histogram,
            num_tokens=self.num_tokens,
            trajectory_ids=self.trajectory_ids,
            duration_ms=self.duration_ms,
            reason=describe_dropped(self.dropped_groups),
            dropped_group_ids=tuple(g for g, _ in self.dropped_groups),
            entropy=self.entropy,
            response_length_mean=self.response_length_mean,
            clip_fraction_low=self.clip_fraction_low,
            clip_fraction_high=self.clip_fraction_high,
            truncated_fraction=self.truncated_fraction,
            zero_variance_fraction=self.zero_variance_groups / self.num_groups if self.num_groups else 0.0,
        )
