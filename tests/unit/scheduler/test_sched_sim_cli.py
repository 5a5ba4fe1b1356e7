"""`sflow sim` pointed at a user's own cluster: a device mix and a length distribution."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_svc.errors import ConfigError
from scheduler_svc.sim import main
from scheduler_svc.sim.workload import ObservedLengths, length_distribution

pytestmark = pytest.mark.unit

SMALL = [
    "--batch",
    "4",
    "--samples",
    "4",
    "--steps",
    "3",
    "--pipeline",
    "colocated_sync",
    "--pipeline",
    "spatiotemporal",
]


def test_device_mix_and_observed_lengths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("100\n2000\n\n500\n")
    assert main(["--device-mix", "H800:2,H20:2", "--lengths", str(lengths), *SMALL]) == 0
    out = capsys.readouterr().out
    assert "devices=H800:2,H20:2" in out and "ratio tokens/s spatiotemporal vs colocated_sync" in out
    workload = length_distribution(str(lengths))
    assert isinstance(workload, ObservedLengths)
    assert {workload.sample(p, 0).generated_tokens for p in range(50)} == {100, 2000, 500}


def test_length_specs_are_validated() -> None:
    assert length_distribution("lognormal:7,0.5").sample(0, 0).generated_tokens > 0
    with pytest.raises(ConfigError, match="lognormal"):
        length_distribution("lognormal:7")
    with pytest.raises(ConfigError, match="nope"):
        length_distribution("nope")
    assert main(["--device-mix", "H800", *SMALL]) == 2


def test_a_horizon_no_longer_than_its_warm_up_is_refused_naming_both(capsys: pytest.CaptureFixture[str]) -> None:
    """The measured window starts after the warm-up steps: with none left there is nothing to measure."""
    assert main([*SMALL[:4], "--steps", "2"]) == 2
    assert "steps (2) must exceed warmup_steps (2)" in capsys.readouterr().out
    assert main(["--random", "1", "--steps", "3", "--warmup-steps", "3"]) == 2
    assert "warmup_steps (3)" in capsys.readouterr().out
