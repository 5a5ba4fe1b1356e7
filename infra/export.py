"""`sflow export`: a run's trained policy as a plain Hugging Face model directory.

The trainer's checkpoints (`trainer_svc.checkpoint`) are already `from_pretrained`-loadable: a run folder
holds them as `runs/<run>/weights/<run_id>/v<version>` beside its trainer state. Export picks one version
(default: the newest), checks its weights against the digest the trainer recorded for them
(`trainer_state.json`'s `weights_sha256`, the digest `WeightsPublished.sha256` carries and the engine
checks), and copies the model files only (config, safetensors, generation config, tokenizer, chat
template), leaving out the optimizer and trainer state. The copy is checked against the same digest, and
written into a hidden sibling that is renamed into place last, so an export directory that exists is whole.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from infra.errors import InfraError
from infra.run_inputs import RunPaths
from trainer_svc import checkpoint as ckpt
from trainer_svc.errors import CheckpointError

#: Files a Hugging Face causal-LM directory needs; the tokenizer's may come from the run's base model.
MODEL_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CHAT_TEMPLATE_FILE = "chat_template.jinja"
PROVENANCE_FILE = "seamlessflow_export.json"
_VERSION_DIR = re.compile(r"v(\d+)")


class ExportError(InfraError):
    """The run, version or checkpoint cannot be exported (the message names the bad value)."""


@dataclass(frozen=True)
class Export:
    """What `export_policy` wrote: the directory, and the checkpoint it came from."""

    out_dir: Path
    checkpoint: Path
    version: int
    step: int
    sha256: str
    files: tuple[str, ...]


def resolve_run(run: str, runs_root: Path) -> Path:
    """`--run`: a run folder, or a run name under `runs_root` (as `sflow analytics --run` resolves it)."""
    from infra.analytics.errors import AnalyticsError
    from infra.analytics.sql import run_folder

    try:
        return run_folder(run, runs_root)
    except AnalyticsError as e:
        raise ExportError(str(e)) from e


def trained_versions(run_root: Path) -> dict[int, Path]:
    """The committed checkpoints of a run folder by version (staging folders of a crash are not versions)."""
    weights = RunPaths(run_root).weights
    found: dict[int, Path] = {}
    for directory in sorted(weights.glob("*/v*")):
        match = _VERSION_DIR.fullmatch(directory.name)
        if not (match and (directory / ckpt.PROGRESS_FILE).is_file()):
            continue
        version = int(match.group(1))
        if version in found:
            raise ExportError(f"version {version} is in two checkpoints, {found[version]} and {directory}: "
                              f"pass the one to export as --run")
        found[version] = directory
    return found


def pick_checkpoint(run_root: Path, version: int | None) -> Path:
    versions = trained_versions(run_root)
    if not versions:
        raise ExportError(f"run {str(run_root)!r} has no trained version (no committed checkpoint under "
                          f"{str(RunPaths(run_root).weights)!r})")
    if version is None:
        return versions[max(versions)]
    if version not in versions:
        raise ExportError(f"--version {version}: run {str(run_root)!r} has no such version "
                          f"(trained versions: {sorted(versions)})")
    return versions[version]


def verified_progress(checkpoint: Path) -> ckpt.TrainerProgress:
    """The checkpoint's trainer state, after checking its weights against the digest recorded in it."""
    try:
        progress = ckpt.read_progress(checkpoint)
        if not progress.weights_sha256:
            raise ExportError(f"{checkpoint}: {ckpt.PROGRESS_FILE} records no weights_sha256, so its weights "
                              f"cannot be verified")
        actual = ckpt.weights_sha256(checkpoint)
    except CheckpointError as e:
        raise ExportError(str(e)) from e
    if actual != progress.weights_sha256:
        raise ExportError(f"{checkpoint} is corrupt: its *.safetensors files hash to sha256={actual}, the trainer "
                          f"recorded {progress.weights_sha256}")
    return progress


def _sources(checkpoint: Path, base_model: Path) -> dict[str, Path]:
    """Each file to export by name: the checkpoint's model files, and its tokenizer files (the base model's
    where the checkpoint lacks them)."""
    chosen = {p.name: p for p in sorted(checkpoint.glob("*.safetensors"))}
    missing = [name for name in MODEL_FILES if not (checkpoint / name).is_file()]
    if missing:
        raise ExportError(f"checkpoint {str(checkpoint)!r} is missing {missing}")
    chosen.update({name: checkpoint / name for name in MODEL_FILES})
    tokenizer_dir = checkpoint if (checkpoint / TOKENIZER_FILES[0]).is_file() else base_model
    side_files = [p for p in sorted(tokenizer_dir.iterdir()) if p.is_file()] if tokenizer_dir.is_dir() else []
    chosen.update({p.name: p for p in side_files if p.name not in chosen and not p.name.endswith(".safetensors")
                   and p.name not in (ckpt.PROGRESS_FILE, *MODEL_FILES)})
    missing = [name for name in TOKENIZER_FILES if name not in chosen]
    if missing:
        raise ExportError(f"no tokenizer: {missing} are neither in {str(checkpoint)!r} nor in the base model "
                          f"{str(base_model)!r}")
    if CHAT_TEMPLATE_FILE not in chosen and "chat_template" not in json.loads(
            chosen["tokenizer_config.json"].read_text()):
        raise ExportError(f"no chat template: {str(chosen['tokenizer_config.json'])!r} has no `chat_template` and "
                          f"there is no {CHAT_TEMPLATE_FILE} beside it")
    return chosen


def export_policy(run_root: Path, out_dir: Path, version: int | None = None) -> Export:
    """Writes version `version` (None: the newest) of the run at `run_root` to `out_dir` (new or empty)."""
    if not run_root.is_dir():
        raise ExportError(f"--run {str(run_root)!r}: no such run folder")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"--out {str(out_dir)!r} exists and is not an empty directory; refusing to overwrite it")
    checkpoint = pick_checkpoint(run_root, version)
    progress = verified_progress(checkpoint)
    sources = _sources(checkpoint, RunPaths(run_root).model)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        staging.mkdir()
        for name, source in sources.items():
            shutil.copyfile(source, staging / name)
        if ckpt.weights_sha256(staging) != progress.weights_sha256:
            raise ExportError(f"the copy of {checkpoint}'s weights in {staging} does not hash to "
                              f"{progress.weights_sha256}: the checkpoint changed while it was exported")
        provenance = {"run": str(run_root), "checkpoint": str(checkpoint), "version": progress.version,
                      "step": progress.step, "weights_sha256": progress.weights_sha256}
        (staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        staging.rename(out_dir)
    except OSError as e:
        raise ExportError(f"cannot write {str(out_dir)!r}: {e}") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Export(out_dir, checkpoint, progress.version, progress.step, progress.weights_sha256,
                  tuple(sorted([*sources, PROVENANCE_FILE])))
