"""`model.shape`: a larger default model, validated, keyed in the warm-up cache; unset, every earlier key stays."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from infra import run_inputs
from infra.errors import InfraError
from infra.run_config import RunConfig
from infra.run_inputs import warmup_cache_key
from tests.unit.infra.run_configs import DEMO, load

pytestmark = pytest.mark.unit


def test_an_unset_shape_keeps_the_demos_warm_up_key() -> None:
    demo = RunConfig.load(DEMO)
    assert demo.model.shape is None
    before_shape = {k: v for k, v in demo.model.model_dump(exclude={"warmup_seed", "warmup_workers"}).items()
                    if k not in ("shape", "path")}  # the key as computed before `shape` and `path` existed:
    # cached warm-ups stay valid
    expected = hashlib.sha256(json.dumps([before_shape, run_inputs._warmup_source(demo.example), demo.warmup_seed,
                                          run_inputs._CACHE_FORMAT]).encode()).hexdigest()[:12]
    assert warmup_cache_key(demo) == expected


def test_a_shape_is_part_of_the_key_and_its_heads_must_group(tmp_path: Path) -> None:
    small = load(tmp_path, model={"warmup_steps": 0})
    larger = load(tmp_path, model={"warmup_steps": 0, "shape": {"hidden_size": 256, "num_hidden_layers": 6}})
    assert larger.model.shape is not None and larger.model.shape.num_hidden_layers == 6
    assert warmup_cache_key(larger) != warmup_cache_key(small)
    with pytest.raises(InfraError, match="num_attention_heads=6"):
        load(tmp_path, model={"shape": {"num_attention_heads": 6, "num_key_value_heads": 4}})
