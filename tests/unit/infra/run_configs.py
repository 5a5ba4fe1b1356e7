"""Run configs for the run-config tests: the demo's file, and a minimal config with chosen sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from infra.run_config import RunConfig

DEMO = Path(__file__).resolve().parents[3] / "infra" / "configs" / "demo.yaml"
BASE: dict[str, Any] = {"inference": {"resources": [{"id": "r0"}]}}


def load(tmp_path: Path, **sections: Any) -> RunConfig:
    """A one-resource run config with `sections` over it, loaded from a file as `make demo` loads one."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**BASE, **sections}))
    return RunConfig.load(path)
