"""TrainerConfig: defaults are valid, every bad value is refused with its field and value named."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_svc.config import AlgorithmConfig, EngineConfig, TrainerConfig
from trainer_svc.errors import ConfigError, TrainerError

pytestmark = pytest.mark.unit


def test_defaults_are_valid(tiny_model_dir: Path) -> None:
    config = TrainerConfig(model_path=str(tiny_model_dir))
    assert config.engine.zero_stage == 0 and config.algorithm.algorithm == "grpo"


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        (EngineConfig, "zero_stage", 3),
        (EngineConfig, "precision", "fp16"),
        (EngineConfig, "device", "tpu"),
        (EngineConfig, "micro_batch_tokens", 0),
        (EngineConfig, "gradient_accumulation_steps", -1),
        (EngineConfig, "learning_rate", 0.0),
        (EngineConfig, "learning_rate", float("nan")),
        (EngineConfig, "optimizer", "sgd"),
        (EngineConfig, "attn_implementation", "flash_attention_2"),
        (AlgorithmConfig, "algorithm", "dpo"),
        (AlgorithmConfig, "aggregation", "mean"),
        (AlgorithmConfig, "clip_eps", 0.0),
        (AlgorithmConfig, "dual_clip", 1.0),
        (AlgorithmConfig, "iw_cap", 0.5),
        (AlgorithmConfig, "max_staleness", -1),
        (AlgorithmConfig, "ppo_epochs", 0),
        (AlgorithmConfig, "gamma", 1.5),
        (AlgorithmConfig, "kl_coef", -0.1),
        (AlgorithmConfig, "normalize_std", "yes"),
    ],
)
def test_bad_value_names_field_and_value(section: type, field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        section(**{field: value})
    assert field in str(info.value) and repr(value) in str(info.value)
    assert isinstance(info.value, TrainerError) and isinstance(info.value, ValueError)


def test_model_path_must_be_a_model_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model_path"):
        TrainerConfig(model_path=str(tmp_path))


def test_from_mapping_builds_nested_sections(tiny_model_dir: Path) -> None:
    config = TrainerConfig.from_mapping({
        "model_path": str(tiny_model_dir),
        "engine": {"zero_stage": 2, "precision": "bf16"},
        "algorithm": {"algorithm": "ppo", "skip_statuses": ["aborted", "timeout"]},
    })
    assert config.engine.zero_stage == 2 and config.engine.precision == "bf16"
    assert config.algorithm.skip_statuses == ("aborted", "timeout")


def test_from_mapping_refuses_unknown_keys(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"engine\.zero"):
        TrainerConfig.from_mapping({"model_path": str(tiny_model_dir), "engine": {"zero": 1}})
    with pytest.raises(ConfigError, match="lr"):
        TrainerConfig.from_mapping({"model_path": str(tiny_model_dir), "lr": 1})
