"""The layering contracts of pyproject.toml (`[tool.importlinter]`) can fail.

`lint-imports` on the real tree is the check itself (`make lint`, `make test`). Here the same contracts,
read from pyproject.toml, run on a skeleton of the packages they name (empty modules): kept as it is,
broken by one forbidden import of each kind, direct or through another module.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _config() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return config


def _internal_modules(config: dict[str, Any]) -> set[str]:
    roots = set(config["root_packages"])
    named = {m for c in config["contracts"] for key in ("modules", "source_modules", "forbidden_modules")
             for m in c.get(key, ())}
    return roots | {m for m in named if m.split(".")[0] in roots}


def _skeleton(tmp: Path, config: dict[str, Any]) -> Path:
    """Every package and module the contracts name, as empty files, and the contracts as a config file."""
    for module in sorted(_internal_modules(config)):
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            package = tmp.joinpath(*parts[:i])
            package.mkdir(exist_ok=True)
            (package / "__init__.py").touch()
    lines = ["[importlinter]", "root_packages =\n    " + "\n    ".join(config["root_packages"]),
             f"include_external_packages = {config.get('include_external_packages', False)}"]
    for i, contract in enumerate(config["contracts"]):
        lines.append(f"\n[importlinter:contract:{i}]")
        for key, value in contract.items():
            text = "\n    ".join(value) if isinstance(value, list) else str(value)
            lines.append(f"{key} =\n    {text}" if isinstance(value, list) else f"{key} = {text}")
    path = tmp / "layering.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def _lint(tmp: Path, config_file: Path) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(tmp), "PATH": "", "COLUMNS": "400"}  # wide: one contract per line
    return subprocess.run([str(LINT_IMPORTS), str(config_file), "--no-cache"], cwd=tmp, capture_output=True,
                          text=True, timeout=120, env=env)


def _broken(output: str) -> list[str]:
    return [line.removesuffix(" BROKEN") for line in output.splitlines() if line.endswith(" BROKEN")]


def _add_import(tmp: Path, module: str, statement: str) -> None:
    init = tmp.joinpath(*module.split(".")) / "__init__.py"
    init.write_text(init.read_text() + statement + "\n")


# (importing module, statement, the contracts it breaks): one forbidden import of each kind.
FORBIDDEN = [
    ("scheduler_svc", "import trainer_svc", ("Services are independent",)),
    ("trainer_svc", "import infra", ("Services import neither infra",)),
    ("bus", "import agents_adapter", ("The shared layer (schemas, bus) imports no service",)),
    ("scheduler_svc.policies", "import confluent_kafka", ("Functional cores import no Kafka",)),
    ("trainer_svc.losses", "import bus", ("Functional cores import no Kafka",)),  # bus imports confluent_kafka
    ("agents_adapter.proxy", "import torch", ("The capture proxy and the agent SDK never load torch",)),
    ("inference_svc", "import examples", ("Services import neither infra", "Only infra (configs, the demo)")),
]


def test_the_contracts_hold_on_a_skeleton_without_forbidden_imports(tmp_path: Path) -> None:
    config_file = _skeleton(tmp_path, _config())
    _add_import(tmp_path, "bus", "import confluent_kafka")  # the shell may: only cores may not
    _add_import(tmp_path, "infra", "import examples\nimport trainer_svc")
    result = _lint(tmp_path, config_file)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(_config()['contracts'])} kept, 0 broken." in result.stdout


@pytest.mark.parametrize(("module", "statement", "contracts"), FORBIDDEN)
def test_one_forbidden_import_breaks_its_contract(tmp_path: Path, module: str, statement: str,
                                                   contracts: tuple[str, ...]) -> None:
    config_file = _skeleton(tmp_path, _config())
    _add_import(tmp_path, "bus", "import confluent_kafka")
    _add_import(tmp_path, module, statement)
    result = _lint(tmp_path, config_file)
    assert result.returncode != 0, result.stdout
    broken = _broken(result.stdout)
    assert len(broken) == len(contracts), result.stdout
    assert all(any(name.startswith(c) for name in broken) for c in contracts), result.stdout
