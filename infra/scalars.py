"""Train metrics as TensorBoard event files (and W&B when installed and configured), written while a
run runs, from the `train` and `weights` events the run monitor follows.

Where: `runs/<run>/tensorboard/`, so `tensorboard --logdir runs/` shows every run side by side. The
writer is torch's `torch.utils.tensorboard.SummaryWriter` (needs the `tensorboard` package), else
`tensorboardX`'s, both imported only when a run writes. W&B: `run.wandb_project` set and `wandb`
importable; never required (missing, it is skipped with a log line).

The scalars (tag: value, x = the train step): `train/loss`, `train/reward_mean`, `train/kl`,
`train/clip_fraction`, `train/num_tokens`, `train/step_seconds`, `train/stale_tokens_fraction` (tokens
one version or more behind), and `rollout/weight_sync_pause_ms/<resource>` per WeightsLoaded (x = its
version).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from schemas import events as ev

log = logging.getLogger("sflow.scalars")


def step_scalars(event: ev.TrainStepCompleted) -> dict[str, float]:
    """The scalars of one completed step (a skipped step trained nothing: none)."""
    if event.status == "skipped":
        return {}
    tokens = sum(event.staleness_histogram)
    return {
        "train/loss": event.loss,
        "train/reward_mean": event.reward_mean,
        "train/kl": event.kl,
        "train/clip_fraction": event.clip_fraction,
        "train/num_tokens": float(event.num_tokens),
        "train/step_seconds": event.duration_ms / 1000,
        "train/stale_tokens_fraction": (tokens - event.staleness_histogram[0]) / tokens if tokens else 0.0,
    }


def _summary_writer(log_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        from tensorboardX import SummaryWriter  # type: ignore[no-redef]  # the fallback, without tensorboard
    return SummaryWriter(log_dir=str(log_dir), flush_secs=5)


class ScalarWriter:
    """Writes each step's scalars once (a re-published step, same step number, is skipped)."""

    def __init__(self, log_dir: Path, run_name: str, wandb_project: str | None = None) -> None:
        self.log_dir = log_dir
        self._writer = _summary_writer(log_dir)
        self._steps: set[int] = set()
        self._wandb: Any = None
        if wandb_project is not None:
            try:
                import wandb
            except ImportError:
                log.warning("run.wandb_project=%r but wandb is not installed: not logging to W&B", wandb_project)
            else:
                self._wandb = wandb.init(project=wandb_project, name=run_name, dir=str(log_dir))

    def write(self, event: ev.Event) -> None:
        if isinstance(event, ev.TrainStepCompleted) and event.step not in self._steps:
            scalars = step_scalars(event)
            if scalars:
                self._steps.add(event.step)
                self._emit(scalars, event.step)
        elif isinstance(event, ev.WeightsLoaded):
            self._emit({f"rollout/weight_sync_pause_ms/{event.resource_id}": event.pause_ms}, event.version)
        elif isinstance(event, ev.EvalCompleted):  # held-out accuracy at the train step it was due
            self._emit({"eval/accuracy": event.accuracy, "eval/reward": event.reward_mean}, event.step)

    def _emit(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        self._writer.close()
        if self._wandb is not None:
            self._wandb.finish()
