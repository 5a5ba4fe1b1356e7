"""TrainEngine: DeepSpeed on the CPU (gloo, one rank) for ZeRO 0/1/2, caller-owned accumulation."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from trainer_svc.config import EngineConfig
from trainer_svc.engine import TrainEngine, build_cpu_ops, deepspeed_config, prepare_environment
from trainer_svc.errors import EngineError

pytestmark = pytest.mark.unit


def _regression_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _micro_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)) for n in (3, 5)]


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, total: int) -> torch.Tensor:
    return ((model(x.to(next(model.parameters()).dtype)).float() - y) ** 2).sum() / total


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_accumulated_update_equals_plain_adamw(zero_stage: int) -> None:
    """Two micro-batches of different sizes, one update: the same as torch AdamW on the whole batch."""
    config = EngineConfig(zero_stage=zero_stage, learning_rate=1e-2, grad_clip=0.0, device="cpu")
    reference = _regression_model()
    engine = TrainEngine(copy.deepcopy(reference), config)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.0)
    data = _micro_batches()
    total = sum(len(x) for x, _ in data)
    for _ in range(3):
        for x, y in data:
            engine.backward(_loss(engine.engine, x, y, total))
        grad_norm = engine.step()
        optimizer.zero_grad()
        sum(_loss(reference, x, y, total) for x, y in data).backward()  # type: ignore[union-attr]
        optimizer.step()
        assert grad_norm > 0 and grad_norm == grad_norm
    for mine, theirs in zip(engine.module.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6)
    assert engine.updates == 3


def test_bf16_keeps_fp32_master_weights_and_learns() -> None:
    config = EngineConfig(zero_stage=1, precision="bf16", learning_rate=1e-2, device="cpu")
    engine = TrainEngine(_regression_model(), config)
    assert engine.dtype == torch.bfloat16
    data = _micro_batches()
    total = sum(len(x) for x, _ in data)
    losses = []
    for _ in range(20):
        losses.append(sum(float(_loss(engine.engine, x, y, total).detach()) for x, y in data))
        for x, y in data:
            engine.backward(_loss(engine.engine, x, y, total))
        engine.step()
    assert losses[-1] < 0.8 * losses[0]


def test_deepspeed_config_owns_the_boundary() -> None:
    config = deepspeed_config(EngineConfig(zero_stage=2, precision="bf16", grad_clip=0.5))
    assert config["managed_gradient_accumulation"] is False
    assert config["zero_optimization"] == {"stage": 2}
    assert config["bf16"] == {"enabled": True} and config["gradient_clipping"] == 0.5


def test_environment_conflict_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with pytest.raises(EngineError, match="DS_ACCELERATOR"):
        prepare_environment("cpu")


def test_environment_defaults_for_one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in ("MASTER_PORT", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    prepare_environment("cpu")
    assert os.environ["WORLD_SIZE"] == "1" and int(os.environ["MASTER_PORT"]) > 0
    assert os.environ["TORCH_EXTENSIONS_DIR"]


def test_cpu_ops_are_built_ahead_of_the_first_step() -> None:
    """`make install` builds the shared-memory collective op the gloo process group loads, so the first
    train step of a fresh clone does not spend a minute compiling it (issue 15's fresh-clone run)."""
    import os
    from pathlib import Path

    build_cpu_ops()
    for op in ("deepspeed_shm_comm", "cpu_adam"):
        assert list(Path(os.environ["TORCH_EXTENSIONS_DIR"]).glob(f"{op}/*.so")), op


@pytest.mark.slow
def test_deepspeed_cpu_adam_builds_and_steps() -> None:
    """DeepSpeed's C++ CPU Adam (built by `make install` into .cache/, else JIT-built on first use) steps
    exactly like torch's AdamW."""
    config = EngineConfig(zero_stage=0, optimizer="cpu_adam", learning_rate=1e-2, grad_clip=0.0, device="cpu")
    reference = _regression_model()
    engine = TrainEngine(copy.deepcopy(reference), config)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.0)
    x, y = _micro_batches()[0]
    engine.backward(_loss(engine.engine, x, y, len(x)))
    engine.step()
    _loss(reference, x, y, len(x)).backward()
    optimizer.step()
    for mine, theirs in zip(engine.module.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5)
