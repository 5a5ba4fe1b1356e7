"""`bench/gpu_smoke.py` end to end on CPU (`--device cpu --tiny`): the engine samples, the trainer recomputes
the same tokens' logprobs under DeepSpeed's CPU accelerator and agrees, one train step runs, and a
disagreement beyond the tolerance fails the run. The real check (CUDA, Qwen3-0.6B shapes) is the `gpu` test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "bench" / "gpu_smoke.py"


def smoke(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """The script in its own process, as a user runs it (DeepSpeed's process group stays out of pytest's)."""
    # not this process's MASTER_PORT: an in-process trainer of an earlier test holds it (EADDRINUSE)
    env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"} | {"TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def reported(output: str, label: str) -> float:
    found = re.search(rf"^{re.escape(label)}: ([0-9.e+-]+)x?$", output, re.MULTILINE)
    assert found, f"no {label!r} line in:\n{output}"
    return float(found.group(1))


@pytest.mark.unit
@pytest.mark.slow
def test_cpu_run_agrees_trains_and_reports() -> None:
    done = smoke("--device", "cpu", "--tiny", "--threads", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert reported(done.stdout, "max abs logprob diff engine vs trainer") <= 1e-3  # fp32: rounding only
    assert reported(done.stdout, "ratio generation vs train-step tokens/s") > 0
    assert "4 requests x 16 tokens" in done.stdout and "tokens/s" in done.stdout
    assert "train step (wall s" in done.stdout and "FAILED" not in done.stdout


@pytest.mark.unit
@pytest.mark.slow
def test_a_disagreement_beyond_the_tolerance_fails_the_run() -> None:
    done = smoke("--device", "cpu", "--tiny", "--threads", "1", "--precision", "bf16", "--tolerance", "0")
    assert done.returncode == 1, done.stdout + done.stderr
    diff = reported(done.stdout, "max abs logprob diff engine vs trainer")
    assert 0 < diff < 0.25  # bf16 differs a little, well inside the default bf16 tolerance
    assert "FAILED: logprobs disagree" in " ".join(done.stdout.split())


@pytest.mark.unit
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback of a machine without CUDA")
def test_auto_without_a_gpu_falls_back_to_the_tiny_cpu_run() -> None:
    from bench.gpu_smoke import parse_args

    args = parse_args(["--device", "auto"])
    assert (args.device, args.tiny, args.precision, args.tolerance) == ("cpu", True, "fp32", 1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_smoke_on_cuda() -> None:
    done = smoke("--device", "cuda", timeout_s=600)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
