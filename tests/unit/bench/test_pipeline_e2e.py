"""bench/pipeline_e2e.py's jobs: the same demo job twice, only the policy (and what it implies) differs."""

from __future__ import annotations

from collections import Counter

import pytest

from infra.run_config import RunConfig
from infra.run_inputs import warmup_cache_key
from tests.unit.bench.bench_modules import load_bench

pytestmark = pytest.mark.unit


pipeline_e2e = load_bench("pipeline_e2e")


def test_the_colocated_baseline_is_on_policy_on_every_resource_and_the_rest_is_the_same_job() -> None:
    colocated: RunConfig = pipeline_e2e.job("colocated", 16)
    spatiotemporal: RunConfig = pipeline_e2e.job("spatiotemporal", 16)
    assert colocated.scheduler.policy == "colocated" and colocated.scheduler.max_staleness == 0
    assert all(set(r.capabilities) == {"rollout", "train"} for r in colocated.inference.resources)
    assert spatiotemporal.scheduler.policy == "spatiotemporal" and spatiotemporal.scheduler.max_staleness >= 1
    assert [r.id for r in spatiotemporal.inference.resources if "train" in r.capabilities] == ["r1"]
    a, b = colocated, spatiotemporal
    assert a.run.max_steps == b.run.max_steps == 16
    assert not a.eval.enabled and not b.eval.enabled
    assert warmup_cache_key(a) == warmup_cache_key(b)  # one model, one warm-up for both
    assert a.tasks == b.tasks and a.agent == b.agent and a.trainer == b.trainer
    assert a.scheduler.train_batch_groups == b.scheduler.train_batch_groups
    assert a.scheduler.samples_per_task == b.scheduler.samples_per_task


def test_one_pair_prints_its_ratio_and_several_print_each_and_their_median() -> None:
    assert pipeline_e2e.ratio_lines([1.234]) == ["ratio rollout tokens/s spatiotemporal vs colocated_sync: 1.23x"]
    each, final = pipeline_e2e.ratio_lines([1.2, 1.03, 1.19])
    assert each == "ratio of each pair: 1.20x, 1.03x, 1.19x (min 1.03x, max 1.20x)"
    assert final == "ratio rollout tokens/s spatiotemporal vs colocated_sync (median of 3 pairs): 1.19x"


def test_command_lines_are_named_by_the_part_of_the_job_they_run() -> None:
    assert pipeline_e2e.program(["taskset", "-c", "1", "python", "-m", "inference_svc", "--port", "1"]) == "engines"
    assert pipeline_e2e.program(["python", "-m", "agents_adapter.processor"]) == "processor"
    assert pipeline_e2e.program(["python", "-m", "some.module"]) == "some.module"
    assert pipeline_e2e.program(["java", "-cp", "lib/*", "kafka.Kafka", "server.properties"]) == "broker"
    assert pipeline_e2e.program(["python", "bench/pipeline_e2e.py", "--steps", "4"]) == "bench (run monitor)"
    assert pipeline_e2e.program(["bash"]) == "other"


def test_cpu_shares_are_taken_between_the_first_and_last_sample_inside_the_window() -> None:
    cpu = pipeline_e2e.HostCpu()
    sample = pipeline_e2e.CpuSample
    cpu.samples = [sample(0, 0, 0, Counter()), sample(1_000, 100, 200, Counter(broker=20)),
                   sample(2_000, 250, 400, Counter(broker=60, engines=50)),
                   sample(3_000, 400, 600, Counter(broker=100, engines=150))]
    assert cpu.busy_share(1_000, 3_000) == 300 / 400
    assert cpu.program_shares(1_000, 3_000) == {"broker": 80 / 400, "engines": 150 / 400}
    assert cpu.busy_share(1_500, 2_500) == 0.0 and cpu.program_shares(1_500, 2_500) == {}  # one sample only


def test_the_ceiling_scales_each_ratio_to_a_fully_busy_machine() -> None:
    line = pipeline_e2e.ceiling_line([1.2, 1.0], [0.96, 0.8])
    assert line.endswith(": 1.25x, 1.25x")
    assert "not measured" in pipeline_e2e.ceiling_line([1.2], [0.0])
