"""A local Hugging Face causal-LM directory as a run's base model (`model.path`): what it must hold to be
served, trained and recorded, checked when the run config loads, and its content digest for the warm-up
cache key."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from inference_svc.model_runner import SUPPORTED_MODEL_TYPES


def model_dir_problem(path: Path) -> str | None:
    """Why `path` cannot be a run's model (None: it can): the engine needs a config of a supported
    architecture and safetensors weights, the capture proxy a tokenizer with a chat template."""
    if not path.is_dir():
        return "is not a directory"
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"has no readable config.json ({e.__class__.__name__})"
    if config.get("model_type") not in SUPPORTED_MODEL_TYPES:
        return f"has model_type={config.get('model_type')!r}; supported: {list(SUPPORTED_MODEL_TYPES)}"
    if not any(path.glob("*.safetensors")):
        return "holds no *.safetensors weights"
    try:
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"has no readable tokenizer_config.json ({e.__class__.__name__})"
    if not (path / "tokenizer.json").is_file():
        return "has no tokenizer.json"
    if not (tokenizer_config.get("chat_template") or (path / "chat_template.jinja").is_file()):
        return "has no chat template (tokenizer_config.json's chat_template, or chat_template.jinja)"
    return None


def directory_digest(path: Path) -> str:
    """SHA-256 over every file of the directory (names and contents, in name order), wherever it lies."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
