"""Fixtures of the framework tests: the demo-size default model (32K context) behind a native engine, and
the capture proxy in front of it, as a new user points a stock agent framework at it."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from agents_adapter.proxy.chat_codec import ChatCodec
from bus.config import BusConfig
from inference_svc.default_model import DefaultModelSpec, create_default_model
from tests.adapter.support import free_port, serve
from tests.adapter.test_adapter_service import Proxy, start_proxy  # noqa: F401 (fixture)
from tests.frameworks.support import ThroughProxy, served_and_recorded


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Named as the adapter fixtures (`start_proxy`) expect; here the demo-size default model with its
    32K-token context, since stock agent prompts are long (smolagents' CodeAgent: ~8.7K tokens)."""
    return create_default_model(tmp_path_factory.mktemp("framework-model"), DefaultModelSpec())


@pytest.fixture(scope="session")
def codec(tiny_model_dir: Path) -> ChatCodec:
    return ChatCodec.from_model_dir(tiny_model_dir)


@pytest.fixture(scope="module")
def engine_a(tiny_model_dir: Path) -> Iterator[tuple[str, Any]]:
    """The native engine in this process; its prefix cache keeps an agent's long prompt between steps."""
    from inference_svc.app import create_app
    from inference_svc.config import InferenceConfig

    config = InferenceConfig(model_path=tiny_model_dir, port=free_port(), resource_id="rollout-a",
                             max_running_requests=4, prefix_cache_slots=4)
    app = create_app(config)
    with serve(app, config.port) as url:
        yield url, app.state.engine


@pytest.fixture
def through_proxy(bus_config: BusConfig, start_proxy: Callable[..., Proxy],  # noqa: F811
                  engine_a: tuple[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ThroughProxy:
    """Runs a stock agent through a fresh proxy and checks the proxy's guarantees (`support`)."""
    return functools.partial(served_and_recorded, bus_config, start_proxy, engine_a, monkeypatch, tmp_path)
