"""Cluster simulator: smoke runs of every pipeline on a small cluster, the headline comparison,
faults, determinism, the Gantt chart and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_svc.errors import ConfigError
from scheduler_svc.roofline import device_preset
from scheduler_svc.sim import PIPELINES, SimConfig, draw_gantt, format_table, main, run_simulation
from scheduler_svc.sim.model import DevicePerf, Efficiency, model_preset
from scheduler_svc.sim.workload import AgenticCoding, SingleTurnMath

pytestmark = pytest.mark.unit

SMALL = {"devices": 8, "steps": 4, "train_batch_groups": 16}


@pytest.fixture(scope="module")
def small_math() -> dict[str, object]:
    return {p: run_simulation(SimConfig(pipeline=p, workload="math", **SMALL)) for p in PIPELINES}


def test_every_pipeline_runs_and_reports_consistent_numbers(small_math) -> None:
    for r in small_math.values():
        assert r.steps_measured == 3
        assert r.tokens_per_s > 0 and r.samples_per_s > 0
        assert r.utilisation + r.bubble + r.overhead == pytest.approx(1.0, abs=1e-6)
        assert r.samples_per_step == 16 * 16
        assert r.wall_clock_s < 10
    assert small_math["colocated_sync"].max_staleness == 0
    assert small_math["microbatch"].max_staleness == 0
    assert small_math["spatiotemporal"].max_staleness <= 1
    assert small_math["offpolicy_fill"].max_staleness <= 1
    assert "spatiotemporal" in format_table(list(small_math.values()))


def test_spatiotemporal_beats_colocated_sync(small_math) -> None:
    st, co = small_math["spatiotemporal"], small_math["colocated_sync"]
    assert st.tokens_per_s > 1.2 * co.tokens_per_s
    assert st.bubble < co.bubble
    assert small_math["disaggregated_naive"].bubble > st.bubble


def test_agentic_smoke_and_same_samples_in_every_pipeline() -> None:
    cfg = {"devices": 8, "steps": 3, "train_batch_groups": 8, "samples_per_task": 4, "workload": "agentic"}
    co = run_simulation(SimConfig(pipeline="colocated_sync", **cfg))
    st = run_simulation(SimConfig(pipeline="spatiotemporal", **cfg))
    assert st.tokens_per_s > co.tokens_per_s
    # deterministic: the same config gives the same numbers
    again = run_simulation(SimConfig(pipeline="spatiotemporal", **cfg))
    assert again.tokens_per_s == st.tokens_per_s and again.events == st.events


def test_failures_and_joins_do_not_stall_any_pipeline() -> None:
    for p in PIPELINES:
        r = run_simulation(
            SimConfig(
                pipeline=p,
                devices=8,
                steps=4,
                train_batch_groups=8,
                samples_per_task=4,
                failures=((60.0, 0), (200.0, 5)),
                joins=((150.0, "H20"),),
            )
        )
        assert r.devices == 9 and r.steps_measured == 3
        assert r.state_shares["rollout"] > 0


def test_heterogeneous_pool_puts_training_on_compute_rich_devices() -> None:
    r = run_simulation(
        SimConfig(pipeline="spatiotemporal", device_mix=(("H20", 4), ("H800", 4)), train_resources=4, steps=3)
    )
    trained_on = {i for i, segs in enumerate(r.segments) if any(s[2] == "train" for s in segs)}
    assert trained_on == {4, 5, 6, 7}  # the H800s (engines e0004..e0007)


def test_gantt_chart_is_written(small_math, tmp_path: Path) -> None:
    out = draw_gantt(list(small_math.values()), tmp_path / "g.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gantt = tmp_path / "cli.png"
    rc = main(
        [
            "--pipeline", "colocated_sync", "--pipeline", "spatiotemporal",
            "--devices", "4", "--batch", "4", "--samples", "4", "--steps", "3", "--gantt", str(gantt),
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and "ratio tokens/s spatiotemporal vs colocated_sync" in out and gantt.exists()
    assert main(["--devices", "1"]) == 2


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="pipeline"):
        SimConfig(pipeline="magic")
    with pytest.raises(ConfigError, match="train_resources"):
        SimConfig(devices=4, train_resources=4).resolved()
    with pytest.raises(ConfigError, match="KV cache room"):
        run_simulation(SimConfig(model="qwen3-32b", device_kind="A100", devices=4, engine_tp=1, steps=2))


def test_decode_model_is_a_roofline() -> None:
    perf = DevicePerf(model_preset("qwen3-8b"), device_preset("H800"), Efficiency())
    # small batches are bandwidth bound: one more sequence costs (almost) nothing per iteration
    assert perf.iteration_base(2) == perf.iteration_base(1)
    # closed forms are inverse of each other
    t = perf.time_for_steps(1000, 32, 100_000)
    assert perf.steps_in(t, 32, 100_000) == pytest.approx(1000)
    h20 = DevicePerf(model_preset("qwen3-8b"), device_preset("H20"), Efficiency())
    assert h20.iteration_base(1) < perf.iteration_base(1)  # more bandwidth: faster small-batch decode
    assert h20.iteration_base(256) > perf.iteration_base(256)  # less compute: slower at large batch


def test_workloads_are_long_tailed_and_bounded() -> None:
    math_lengths = [SingleTurnMath().sample(p, i).generated_tokens for p in range(100) for i in range(8)]
    assert max(math_lengths) == 20_000 and sorted(math_lengths)[len(math_lengths) // 2] < 6000
    agent = [AgenticCoding().sample(p, i) for p in range(50) for i in range(4)]
    assert max(s.total_tokens for s in agent) <= 65_536
    assert max(len(s.turns) for s in agent) > 3 * min(len(s.turns) for s in agent)
    assert SingleTurnMath().sample(3, 1) == SingleTurnMath().sample(3, 1)
