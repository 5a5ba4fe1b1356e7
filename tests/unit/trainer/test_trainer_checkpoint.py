"""Checkpoints: a loadable HF directory, bit-equal round trip with optimizer state, atomic commit."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch

from tests.unit.trainer.trainer_helpers import random_batch, trainer_config
from trainer_svc import checkpoint as ckpt
from trainer_svc.config import AlgorithmConfig
from trainer_svc.errors import CheckpointError
from trainer_svc.trainer import Trainer

pytestmark = pytest.mark.unit


def _state(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_round_trip_restores_weights_optimizer_and_progress(
    tiny_model_dir: Path, tmp_path: Path, zero_stage: int
) -> None:
    config = trainer_config(tiny_model_dir, zero_stage=zero_stage, micro_batch_tokens=32)
    original = Trainer(config)
    original.train_step(random_batch(seed=1), 0)
    uri, digest = original.save_checkpoint(tmp_path / "step-1", consumed_offsets={"sf.trajectories:0": 41})
    directory = Path(urlparse(uri).path)
    assert uri.startswith("file://") and directory == (tmp_path / "step-1").resolve()
    assert digest == ckpt.weights_sha256(directory)

    resumed = Trainer(config)
    progress = resumed.load_checkpoint(directory)
    assert (progress.step, progress.version, progress.consumed_offsets) == (1, 1, {"sf.trajectories:0": 41})
    assert (resumed.step, resumed.version, resumed.consumed_offsets) == (1, 1, {"sf.trajectories:0": 41})
    assert _bit_equal(_state(resumed), _state(original))

    _, digest_again = resumed.save_checkpoint(tmp_path / "again")
    assert digest_again == digest  # same weights, same bytes

    # the optimizer state came back too: the next step is the same bit for bit
    next_batch = random_batch(seed=2)
    a = original.train_step(next_batch, 1)
    b = resumed.train_step(next_batch, 1)
    assert a.loss == b.loss and a.grad_norm == b.grad_norm
    assert _bit_equal(_state(resumed), _state(original))


def test_checkpoint_is_a_loadable_hf_directory(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = Trainer(trainer_config(tiny_model_dir))
    trainer.train_step(random_batch(seed=3), 0)
    uri, _ = trainer.save_checkpoint(tmp_path / "ckpt")
    directory = Path(urlparse(uri).path)
    names = {p.name for p in directory.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            ckpt.PROGRESS_FILE, ckpt.ENGINE_STATE_DIR} <= names
    loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    assert _bit_equal({k: v for k, v in loaded.state_dict().items()}, _state(trainer))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.decode(tokenizer.encode("3+4=")) == "3+4="


def test_inference_weight_reader_accepts_the_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The inference engine's hot-swap reader (names, shapes, tied weights) takes the trainer's output."""
    from inference_svc.weights import read_checkpoint

    trainer = Trainer(trainer_config(tiny_model_dir))
    trainer.train_step(random_batch(seed=4), 0)
    uri, _ = trainer.save_checkpoint(tmp_path / "ckpt")
    state = read_checkpoint(Path(urlparse(uri).path), trainer.model)
    assert all(torch.equal(state[k], trainer.model.state_dict()[k]) for k in state)


def test_commit_is_atomic_and_never_overwrites(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(trainer_config(tiny_model_dir))
    trainer.save_checkpoint(tmp_path / "a")
    with pytest.raises(CheckpointError, match="already exists"):
        trainer.save_checkpoint(tmp_path / "a")
    with pytest.raises(CheckpointError, match="JSON"):
        trainer.save_checkpoint(tmp_path / "b", consumed_offsets={"p": object()})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # nothing half-written left behind


def test_tampered_weights_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(trainer_config(tiny_model_dir))
    uri, _ = trainer.save_checkpoint(tmp_path / "c")
    weights = Path(urlparse(uri).path) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        trainer.load_checkpoint(Path(urlparse(uri).path))
    with pytest.raises(CheckpointError, match="not a trainer checkpoint"):
        trainer.load_checkpoint(tiny_model_dir)


def test_latest_checkpoint_ignores_staging_folders(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(trainer_config(tiny_model_dir))
    batch = random_batch(seed=5)
    trainer.train_step(batch, 0)
    trainer.save_checkpoint(tmp_path / "step-1")
    trainer.train_step(batch, 1)
    trainer.save_checkpoint(tmp_path / "step-2")
    staging = tmp_path / ".step-3.tmp-deadbeef"
    staging.mkdir()
    (staging / ckpt.PROGRESS_FILE).write_text(json.dumps({"step": 3, "version": 3}))
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step-2"
    assert ckpt.latest_checkpoint(tmp_path / "missing") is None


def test_ppo_checkpoint_restores_the_critic(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = trainer_config(tiny_model_dir, algorithm=AlgorithmConfig(algorithm="ppo", critic_learning_rate=1e-2))
    original = Trainer(config)
    original.train_step(random_batch(seed=6), 0)
    uri, _ = original.save_checkpoint(tmp_path / "ppo")
    assert (Path(urlparse(uri).path) / ckpt.CRITIC_STATE_DIR).is_dir()
    resumed = Trainer(config)
    resumed.load_checkpoint(Path(urlparse(uri).path))
    assert original.critic is not None and resumed.critic is not None
    for a, b in zip(original.critic.module.parameters(), resumed.critic.module.parameters(), strict=True):
        assert torch.equal(a, b)
