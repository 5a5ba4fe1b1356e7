"""Reading a safetensors checkpoint for a hot swap, validated before any served weight is touched.

The read happens outside the engine loop (decoding goes on meanwhile); only `apply_state` runs at a
token boundary. Any failure raises `WeightLoadError` and leaves the live weights as they were.

Where weights may come from: a load names a path, and a path is a way into the host's file system.
The service therefore loads only from its weights roots (`InferenceConfig.weights_roots`: the
start-up model directory and `weights_root`): `resolve_inside` resolves the path (`..` and every
symlink followed) and refuses one that ends up outside them with `WeightsAccessError` (403), and each
checkpoint file is checked the same way, so a symlinked shard cannot escape either.

The checkpoint digest (`LoadWeights.sha256` / `WeightsPublished.sha256`) is the SHA-256 of the
concatenated bytes of the checkpoint's `*.safetensors` files in name order (for the usual single file,
the digest of `model.safetensors`); the trainer computes the same (`trainer_svc.checkpoint.
weights_sha256`). `read_checkpoint` hashes the very bytes it parses, so what is verified is exactly
what is swapped in: a file replaced between a check and the read cannot slip through.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from schemas.inference.errors import WeightLoadError, WeightsAccessError


def resolve_inside(requested: Path | str, roots: Sequence[Path]) -> Path:
    """The real path of `requested`, which must lie inside one of `roots` (after resolving symlinks).

    Containment is checked before existence, so the answer says nothing about files outside the roots.
    """
    try:
        path = Path(requested).resolve()
        inside = any(path.is_relative_to(root.resolve()) for root in roots)
        exists = inside and path.exists()
    except (OSError, ValueError, RuntimeError) as e:  # name too long, NUL byte, symlink loop, ...
        raise WeightLoadError(f"model_path={str(requested)[:200]!r} cannot be resolved: {e.__class__.__name__}") from e
    if exists:
        return path
    if inside:
        raise WeightLoadError(f"model_path={str(requested)!r} does not exist")
    allowed = ", ".join(repr(str(r)) for r in roots) or "none configured"
    raise WeightsAccessError(
        f"model_path={str(requested)[:200]!r} resolves to {str(path)[:200]!r}, outside the weights roots "
        f"({allowed}; set --weights-root)"
    )


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a model directory (sharded or not), or the file itself."""
    try:
        if path.is_file() and path.suffix == ".safetensors":
            return [path]
        if not path.exists():
            raise WeightLoadError(f"model_path={str(path)!r} does not exist")
        if not path.is_dir():
            raise WeightLoadError(f"model_path={str(path)!r} is neither a directory nor a .safetensors file")
        files = sorted(path.glob("*.safetensors"))
    except (OSError, ValueError) as e:
        raise WeightLoadError(f"model_path={str(path)[:200]!r} cannot be read: {e.__class__.__name__}") from e
    if not files:
        raise WeightLoadError(f"model_path={str(path)!r} holds no *.safetensors file")
    return files


def checkpoint_sha256(path: Path) -> str:
    """The digest a LoadWeights for this checkpoint carries (see the module doc)."""
    digest = hashlib.sha256()
    for file in checkpoint_files(path):
        digest.update(_read(file))
    return digest.hexdigest()


def read_checkpoint(
    path: Path, model: nn.Module, *, sha256: str | None = None, roots: Sequence[Path] | None = None
) -> dict[str, torch.Tensor]:
    """Loads every tensor of the checkpoint on the CPU and checks digest, names and shapes against `model`.

    `sha256` given: the files' digest must equal it. `roots` given: every file must lie inside them.
    Tied parameters (lm_head = embed_tokens) may be missing from the file; every other parameter must
    be there with the served shape. Unknown names are refused, so a checkpoint of another model fails.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load

    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    required = {name for name, _ in model.named_parameters()}  # shared (tied) tensors listed once
    state: dict[str, torch.Tensor] = {}
    digest = hashlib.sha256()
    for file in checkpoint_files(path):
        if roots is not None:
            resolve_inside(file, roots)
        data = _read(file)
        digest.update(data)
        try:
            state.update(load(data))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise WeightLoadError(f"cannot read {file}: {e}") from e
    if sha256 is not None and digest.hexdigest() != sha256.strip().lower():
        raise WeightLoadError(
            f"checkpoint {str(path)!r} has sha256 {digest.hexdigest()}, expected {sha256[:64]!r}: not loaded"
        )
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise WeightLoadError(f"checkpoint {str(path)!r} has tensors the served model lacks: {unknown[:5]}")
    missing = sorted(required - set(state))
    if missing:
        raise WeightLoadError(f"checkpoint {str(path)!r} lacks tensors: {missing[:5]}")
    wrong = [f"{n}: {tuple(t.shape)} != {expected[n]}" for n, t in state.items() if tuple(t.shape) != expected[n]]
    if wrong:
        raise WeightLoadError(f"checkpoint {str(path)!r} has wrong shapes: {wrong[:5]}")
    bad = [n for n, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise WeightLoadError(f"checkpoint {str(path)!r} has non-finite values in {bad[:5]}")
    return state


def _read(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as e:
        raise WeightLoadError(f"cannot read {file}: {e.strerror}") from e


@torch.no_grad()
def apply_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copies the tensors into the live model in place (dtype/device converted), keeping ties intact."""
    live = model.state_dict()
    for name, tensor in state.items():
        live[name].copy_(tensor)
