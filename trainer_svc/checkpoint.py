"""Checkpoint directories: a Hugging Face model directory plus the trainer's own state, committed at once.

Layout of `<dir>`:
    config.json, generation_config.json, model.safetensors   the policy, `from_pretrained`-loadable
    tokenizer.json, tokenizer_config.json, *.jinja, ...       copied from the base model directory
    engine_state/                                             DeepSpeed state: optimizer (ZeRO partitions,
                                                              fp32 master weights), module
    critic_state/                                             the same for the PPO critic, if any
    trainer_state.json                                        progress: step, version, consumed_offsets,
                                                              weights_sha256

Everything is written into a hidden sibling folder and renamed into place as the last act, so a
directory that exists is complete: the weights, the optimizer and the consumed offsets always
belong to the same step (a restart neither skips nor re-trains a trajectory).

`weights_sha256` is the SHA-256 of the concatenated bytes of the `*.safetensors` files in name order
(for the usual single file: the digest of `model.safetensors`). Saving the same weights twice gives
the same digest: safetensors writes tensors and metadata in a fixed order.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainer_svc.errors import CheckpointError

PROGRESS_FILE = "trainer_state.json"
ENGINE_STATE_DIR = "engine_state"
CRITIC_STATE_DIR = "critic_state"
FORMAT_VERSION = 1

# Files of a base model directory that are not carried into a checkpoint: weights and configs are
# written fresh, the rest belongs to the trainer.
_NOT_COPIED = (
    "*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.pt", "*.pth",
    "config.json", "generation_config.json", PROGRESS_FILE,
)


@dataclass(frozen=True)
class TrainerProgress:
    """What a restart needs besides weights and optimizer: where training stood."""

    step: int
    version: int
    consumed_offsets: dict[str, Any] = field(default_factory=dict)
    weights_sha256: str = ""
    format_version: int = FORMAT_VERSION


def weights_sha256(directory: Path) -> str:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory} holds no *.safetensors file")
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def copy_tokenizer_files(base_dir: Path, out_dir: Path) -> list[str]:
    """Copies the base directory's tokenizer, chat template and other small side files."""
    copied = []
    for path in sorted(base_dir.iterdir()):
        if path.is_file() and not any(fnmatch.fnmatch(path.name, pattern) for pattern in _NOT_COPIED):
            shutil.copy2(path, out_dir / path.name)
            copied.append(path.name)
    return copied


def write_progress(directory: Path, progress: TrainerProgress) -> None:
    try:
        text = json.dumps(asdict(progress), indent=2, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"consumed_offsets must be JSON-serialisable: {e}") from e
    _write_synced(directory / PROGRESS_FILE, text + "\n")


def read_progress(directory: Path) -> TrainerProgress:
    path = directory / PROGRESS_FILE
    try:
        data = json.loads(path.read_text())
        progress = TrainerProgress(**data)
    except FileNotFoundError as e:
        raise CheckpointError(f"{directory} is not a trainer checkpoint (no {PROGRESS_FILE})") from e
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path} is unreadable: {e}") from e
    if progress.format_version != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format_version={progress.format_version}, expected {FORMAT_VERSION}")
    return progress


def _write_synced(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def staging_dir(final: Path) -> Path:
    """A hidden sibling of `final` to write into; `commit` renames it into place."""
    if final.exists():
        raise CheckpointError(f"checkpoint directory {final} already exists; refusing to overwrite it")
    staging = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as e:
        raise CheckpointError(f"cannot create {staging}: {e}") from e
    return staging


def commit(staging: Path, final: Path) -> None:
    """Makes a fully written staging directory the checkpoint (atomic rename on one filesystem)."""
    for path in staging.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    os.replace(staging, final)
    dir_fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


def discard_staging(root: Path) -> None:
    """Half-written checkpoints of a crashed attempt under `root` (`commit` never renamed them into place)."""
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(".") and ".tmp-" in child.name and child.is_dir():
                discard(child)


def latest_checkpoint(root: Path) -> Path | None:
    """The committed checkpoint under `root` with the highest step (staging folders are ignored)."""
    best: tuple[int, Path] | None = None
    if not root.is_dir():
        return None
    for child in root.iterdir():
        if child.name.startswith(".") or not (child / PROGRESS_FILE).is_file():
            continue
        step = read_progress(child).step
        if best is None or step > best[0]:
            best = (step, child)
    return best[1] if best else None


def check_offsets(offsets: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON round trip: what gets saved is exactly what a restart reads back."""
    try:
        result: dict[str, Any] = json.loads(json.dumps(dict(offsets)))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"consumed_offsets must be JSON-serialisable: {e}") from e
    return result
