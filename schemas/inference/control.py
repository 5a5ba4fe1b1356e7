"""The engine-control interface: what a rollout resource's controller needs from the engine it drives.

`inference_svc.controller.InferenceController` turns the `control` topic's commands (PauseRollout,
ResumeRollout, LoadWeights, aborts) into these calls, and the bus shell reads `stats` for heartbeats and
`is_alive` to notice a dead engine loop. Two engines implement it: the in-process
`inference_svc.engine.NativeEngine`, and `schemas.inference.client.RemoteEngineControl`, the same calls
over HTTP for an engine in another process (SGLang, or a native engine behind its app).

The calls are synchronous and each returns once the engine has done it (a pause returns at a token
boundary), so the controller can time them for the acknowledgement events. Torch-free, like the rest of
the contract.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import SecretStr

from schemas.inference.types import EngineStats, WeightUpdateResult

CONTROL_KEY_ENV = "SFLOW_INFERENCE_KEY"


def control_key_from_env() -> SecretStr | None:
    """The control key of the environment (shared by the service and its clients), if any."""
    value = os.environ.get(CONTROL_KEY_ENV, "")
    return SecretStr(value) if value else None


@runtime_checkable
class EngineControl(Protocol):
    """Partial-rollout control of one engine (docs/architecture.md, "Partial rollout")."""

    def pause(self, mode: str = "in_place") -> int:
        """Stops generating at the next token boundary ("abort", "in_place" or "retract", `PAUSE_MODES`);
        returns how many requests were held or aborted, -1 where the engine does not say."""
        ...

    def resume(self) -> None:
        """Goes on generating after a pause (queued requests start)."""
        ...

    def update_weights_from_disk(
        self,
        model_path: Path | str,
        weight_version: int | None = None,
        *,
        abort_all_requests: bool = False,
        sha256: str | None = None,
    ) -> WeightUpdateResult:
        """Swaps in a checkpoint at a token boundary; running requests continue under the new version.

        A checkpoint that cannot be read, does not fit, or whose bytes do not hash to `sha256` raises
        `WeightLoadError` and leaves the old weights live.
        """
        ...

    def abort_all(self) -> int:
        """Finishes every request with its partial output (finish_reason abort); returns how many."""
        ...

    def stats(self) -> EngineStats:
        """What a Heartbeat reports."""
        ...

    @property
    def weight_version(self) -> int:
        """The version now served (-1 where a remote engine cannot tell)."""
        ...

    @property
    def is_alive(self) -> bool:
        """False once the engine can serve no more (its loop died, or it was shut down or closed)."""
        ...
