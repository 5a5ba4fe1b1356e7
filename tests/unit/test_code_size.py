"""Production code stays readable: no module over 400 lines, no function over 60 (issue 12's limits).

Production code is every package the project ships (pyproject's package list): tests and benches are not
measured. A failure names each offender with its size, so the fix starts from the message.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "bus", "agents_adapter", "inference_svc", "scheduler_svc", "trainer_svc", "infra", "examples")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def production_modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def oversized_modules(paths: list[Path], limit: int) -> list[str]:
    sizes = ((p, len(p.read_text().splitlines())) for p in paths)
    return [f"{p.relative_to(REPO)}: {n} lines" for p, n in sizes if n > limit]


def oversized_functions(paths: list[Path], limit: int) -> list[str]:
    out = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > limit:
                    out.append(f"{p.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    return out


@pytest.mark.unit
def test_no_production_module_is_over_400_lines() -> None:
    assert not oversized_modules(production_modules(), MAX_MODULE_LINES)


@pytest.mark.unit
def test_no_production_function_is_over_60_lines() -> None:
    assert not oversized_functions(production_modules(), MAX_FUNCTION_LINES)


@pytest.mark.unit
def test_the_size_checks_find_an_oversized_module_and_function(tmp_path: Path) -> None:
    long_body = "\n".join(f"    x{i} = {i}" for i in range(61))
    module = tmp_path / "big.py"
    module.write_text(f"def long_one() -> None:\n{long_body}\n" + "\n" * 340)
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        assert oversized_modules([module], MAX_MODULE_LINES) == ["big.py: 402 lines"]
        assert oversized_functions([module], MAX_FUNCTION_LINES) == ["big.py:1 long_one: 62 lines"]
    finally:
        REPO = saved
