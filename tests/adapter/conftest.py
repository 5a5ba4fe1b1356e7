"""Fixtures of the capture-proxy tests: a tiny model, its codec, engines and proxies on 127.0.0.1.

Engines and proxies run under uvicorn in threads of the test process (or, for the "second engine
process", `python -m inference_svc` in a subprocess), on free ports; clients are the official `openai`
client and httpx.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from agents_adapter.proxy.chat_codec import ChatCodec
from inference_svc.default_model import DefaultModelSpec, create_default_model, write_perturbed_checkpoint
from tests.adapter.support import EngineProcess, free_port, serve

ADAPTER_TINY_SPEC = DefaultModelSpec(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=1024, seed=0,
)
AGENT_KEYS = {"agent-a": "key-a", "agent-b": "key-b"}
ADMIN_KEY = "admin-key"


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    """The machine has 2 shared cores; the tiny model does not need more than one."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_default_model(tmp_path_factory.mktemp("adapter-model"), ADAPTER_TINY_SPEC)


@pytest.fixture(scope="session")
def perturbed_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_perturbed_checkpoint(tiny_model_dir, tmp_path_factory.mktemp("adapter-model-v1"), noise_std=0.05)


@pytest.fixture(scope="session")
def codec(tiny_model_dir: Path) -> ChatCodec:
    return ChatCodec.from_model_dir(tiny_model_dir)


@pytest.fixture(scope="module")
def engine_a(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """The native engine in this process (its NativeEngine object lets tests watch it generate)."""
    from inference_svc.app import create_app
    from inference_svc.config import InferenceConfig

    config = InferenceConfig(model_path=tiny_model_dir, max_context=1024, port=free_port(), resource_id="rollout-a",
                             max_running_requests=16,
                             weights_root=tmp_path_factory.getbasetemp())  # the session's model dirs
    app = create_app(config)
    with serve(app, config.port) as url:
        yield url, app.state.engine


@pytest.fixture
def engine_process() -> Iterator[Callable[..., EngineProcess]]:
    """Starts engine subprocesses on demand; stops them (by their PID) after the test."""
    started: list[EngineProcess] = []

    def start(model_dir: Path, resource_id: str, weight_version: int = 0) -> EngineProcess:
        proc = EngineProcess(model_dir, resource_id, weight_version)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
