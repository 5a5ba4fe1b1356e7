"""Loading the served model directory for the native engine, and what it says about stopping.

Kept apart from the engine so that the one place that reaches into `transformers` (and can fail on a
bad directory) converts its errors at the boundary: every failure is a `WeightLoadError` naming the path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from schemas.inference.errors import WeightLoadError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(path: Path, device: str, dtype: str) -> Any:
    """The model at `path`, on `device`, in eval mode without gradients (the engine only runs forwards)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a service log is no place for progress bars
    if not (path / "config.json").is_file():
        raise WeightLoadError(f"model_path={str(path)!r} is not a Hugging Face model directory (no config.json)")
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype], local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise WeightLoadError(f"cannot load the model at {str(path)!r}: {e}") from e
    model.to(torch.device(device))
    model.eval()
    model.requires_grad_(False)
    return model


def eos_token_ids(model: Any) -> frozenset[int]:
    """Every end-of-sequence id the model declares: its generation config and its config may differ."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return frozenset(ids)
