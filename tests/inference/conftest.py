"""Fixtures of the inference tests: a tiny Qwen3 model (and a perturbed copy) made once per session."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from inference_svc.default_model import create_default_model, write_perturbed_checkpoint
from inference_svc.engine import NativeEngine
from tests.factories import TINY_SPEC


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    """The machine has 2 shared cores; the tiny model does not need more than one."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_default_model(tmp_path_factory.mktemp("tiny-model"), TINY_SPEC)


@pytest.fixture(scope="session")
def perturbed_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model after a pretend trainer step (noise of the size of the init)."""
    return write_perturbed_checkpoint(tiny_model_dir, tmp_path_factory.mktemp("tiny-model-v1"), noise_std=0.05)


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[NativeEngine]:
    with NativeEngine(tiny_model_dir, max_running_requests=16, max_context=1024, seed=0) as running:
        yield running


@pytest.fixture(scope="session")
def reference_models(tiny_model_dir: Path, perturbed_model_dir: Path) -> dict[int, torch.nn.Module]:
    """Fresh transformers models of version 0 and 1, for full-forward comparisons."""
    from transformers import AutoModelForCausalLM

    return {
        0: AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval(),
        1: AutoModelForCausalLM.from_pretrained(str(perturbed_model_dir)).eval(),
    }


def _full_forward_logprobs(model: torch.nn.Module, prompt: list[int], output: list[int]) -> list[float]:
    """Logprob of each output token under a single full forward of prompt + output."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return [logp[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(output)]


@pytest.fixture(scope="session")
def full_forward_logprobs() -> Callable[[torch.nn.Module, list[int], list[int]], list[float]]:
    return _full_forward_logprobs
