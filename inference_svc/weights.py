"""Reading a safetensors checkpoint for a hot swap, validated before any served weight is touched.

The read happens outside the engine loop (decoding goes on meanwhile); only `apply_state` runs at a
token boundary. Any failure raises `WeightLoadError` and leaves the live weights as they were.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from inference_svc.errors import WeightLoadError


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a model directory (sharded or not), or the file itself."""
    if path.is_file() and path.suffix == ".safetensors":
        return [path]
    if not path.exists():
        raise WeightLoadError(f"model_path={str(path)!r} does not exist")
    if not path.is_dir():
        raise WeightLoadError(f"model_path={str(path)!r} is neither a directory nor a .safetensors file")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"model_path={str(path)!r} holds no *.safetensors file")
    return files


def read_checkpoint(path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """Loads every tensor of the checkpoint on the CPU and checks names and shapes against `model`.

    Tied parameters (lm_head = embed_tokens) may be missing from the file; every other parameter must
    be there with the served shape. Unknown names are refused, so a checkpoint of another model fails.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    required = {name for name, _ in model.named_parameters()}  # shared (tied) tensors listed once
    state: dict[str, torch.Tensor] = {}
    for file in checkpoint_files(path):
        try:
            state.update(load_file(str(file), device="cpu"))
        except (SafetensorError, OSError, ValueError) as e:
            raise WeightLoadError(f"cannot read {file}: {e}") from e
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


@torch.no_grad()
def apply_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copies the tensors into the live model in place (dtype/device converted), keeping ties intact."""
    live = model.state_dict()
    for name, tensor in state.items():
        live[name].copy_(tensor)
