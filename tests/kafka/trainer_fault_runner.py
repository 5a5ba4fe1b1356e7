"""`python tests/kafka/trainer_fault_runner.py POINT@STEP [python -m trainer_svc flags...]`: the trainer
service, SIGKILLed at one point of one step. Test-only: production code has no fault hook.

The point is injected from here, around the real `Trainer.save_checkpoint` of this process, before
`python -m trainer_svc` runs unchanged:
    kill-before-checkpoint@N  step N was trained (its TrainStepStarted is on the bus), its checkpoint is
                              about to be written: nothing of the step is on disk or published after that;
    kill-after-checkpoint@N   step N's checkpoint was committed (renamed into place), its TrainStepCompleted
                              and WeightsPublished are not published yet.
"""

from __future__ import annotations

import logging
import os
import runpy
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer_svc.trainer import Trainer

POINTS = ("kill-before-checkpoint", "kill-after-checkpoint")


def _die(point: str, step: int) -> None:
    logging.getLogger("trainer_fault_runner").warning("fault injection: killing the process at %s@%d", point, step)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str, step: int) -> None:
    """Wraps `Trainer.save_checkpoint` so the process dies at `point` of train step `step`."""
    if point not in POINTS:
        raise SystemExit(f"fault {point!r}: must be one of {POINTS}")
    save = Trainer.save_checkpoint

    def save_checkpoint(self: Trainer, directory: str | Path, *,
                        consumed_offsets: Mapping[str, Any] | None = None) -> tuple[str, str]:
        if point == "kill-before-checkpoint" and self.step == step:
            _die(point, step)
        saved = save(self, directory, consumed_offsets=consumed_offsets)
        if point == "kill-after-checkpoint" and self.step == step:
            _die(point, step)
        return saved

    Trainer.save_checkpoint = save_checkpoint  # type: ignore[method-assign]


if __name__ == "__main__":
    fault, *flags = sys.argv[1:]
    name, _, at = fault.partition("@")
    install(name, int(at))
    sys.argv = ["trainer_svc", *flags]
    runpy.run_module("trainer_svc", run_name="__main__", alter_sys=True)
