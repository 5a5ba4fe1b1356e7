"""The run config's trainer section: every loss option, dynamic sampling and the collapse guard are
validated at load (errors name the field) and reach the trainer service as its own config file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.errors import InfraError
from infra.run_config import RunConfig
from tests.unit.infra.run_configs import DEMO, load
from trainer_svc.__main__ import parse_config
from trainer_svc.config import EngineConfig, ServiceConfig

pytestmark = pytest.mark.unit


def service_config(tmp_path: Path, config: RunConfig) -> ServiceConfig:
    """What the trainer service builds from the file the demo writes for it."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    recipe = tmp_path / "trainer.yaml"
    recipe.write_text(yaml.safe_dump(config.trainer.service_values()))
    return parse_config(["--run-id", "r", "--base-model-dir", str(model), "--weights-root", str(tmp_path / "w"),
                         "--config", str(recipe), "--bootstrap-servers", "127.0.0.1:1"])


def test_the_demo_recipe_reaches_the_trainer_with_the_agents_token_limit(tmp_path: Path) -> None:
    config = RunConfig.load(DEMO)
    service = service_config(tmp_path, config)
    assert service.algorithm.aggregation == "seq_mean_token_mean"
    assert service.algorithm.max_response_tokens == config.agent.max_tokens == 80
    assert service.engine.learning_rate == config.trainer.learning_rate
    assert service.engine.micro_batch_tokens == config.trainer.micro_batch_tokens == 512  # dense masks: short is fast
    assert service.algorithm.dynamic_sampling and service.algorithm.overlong_mask  # the demo's recipe
    assert service.collapse_guard.enabled and service.collapse_guard.converged_reward == 0.75
    assert config.scheduler.dynamic_sampling_extra_groups > 0  # the scheduler refills what the trainer filters


def test_every_option_reaches_the_trainer(tmp_path: Path) -> None:
    algorithm = {"aggregation": "seq-mean-token-sum-norm", "aggregation_constant": 64.0, "clip_eps_high": 0.28,
                 "ratio_level": "sequence", "kl_coef": 0.01, "kl_estimator": "k1", "entropy_coef": 0.001,
                 "overlong_mask": True, "overlong_buffer": 16, "overlong_penalty": 0.5, "dynamic_sampling": True,
                 "dynamic_sampling_max_filtered": 8}
    guard = {"window": 5, "max_truncated_fraction": 0.8, "min_entropy_ratio": 0.1}
    config = load(tmp_path, agent={"max_tokens": 64}, trainer={"learning_rate": 1e-4, "algorithm": algorithm,
                                                                "collapse_guard": guard})
    service = service_config(tmp_path, config)
    got = service.algorithm.model_dump()
    assert got == {**got, **algorithm, "aggregation": "seq_mean_token_sum_norm", "max_response_tokens": 64}
    assert service.collapse_guard.model_dump() == {**service.collapse_guard.model_dump(), **guard}
    assert service.engine.learning_rate == 1e-4
    assert service.engine.micro_batch_tokens == EngineConfig().micro_batch_tokens


@pytest.mark.parametrize(("trainer", "agent", "named"), [
    ({"algorithm": {"aggregation": "mean"}}, {}, "trainer.algorithm.aggregation"),
    ({"algorithm": {"overlong_buffer": 80}}, {}, "overlong_buffer=80"),
    ({"algorithm": {"aggregation": "seq_mean_token_sum_norm"}}, {}, "needs aggregation_constant"),
    ({"algorithm": {"max_response_tokens": 100}}, {"max_tokens": 80}, "max_response_tokens=100 differs"),
    ({"algorithm": {"dynamic_sampling_max_filtered": 0}}, {}, "trainer.algorithm.dynamic_sampling_max_filtered"),
    ({"collapse_guard": {"window": 0}}, {}, "trainer.collapse_guard.window"),
    ({"aggregation": "token_mean"}, {}, "trainer.aggregation"),  # the options live under trainer.algorithm
])
def test_a_bad_trainer_option_stops_the_run_at_load_naming_it(tmp_path: Path, trainer: dict[str, Any],
                                                               agent: dict[str, Any], named: str) -> None:
    with pytest.raises(InfraError, match=named):
        load(tmp_path, trainer=trainer, agent=agent)
