"""The benchmarks under bench/ are scripts, not a package: their pure parts are imported by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[3] / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/<name>.py as a module (registered in sys.modules, so its dataclasses resolve)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
