"""Fixtures of the trainer tests: a tiny Qwen3 model directory made once per session, one torch thread."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tests.factories import TINY_SPEC


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """The machine has 2 shared cores; the tiny model does not need more than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inference_svc.default_model import create_default_model

    return create_default_model(tmp_path_factory.mktemp("trainer-tiny-model"), TINY_SPEC)
