"""The evaluator against a real broker, capture proxy and native engine (infra/evaluator.py): the start
evaluation runs before any train step, the next one once the train topic says a step completed and the
weights are synced (a restarted evaluator finds both done), and each result's versions are the ones the
proxy returned for its tokens (the engine swapped to version 1 in between); every session is in a
held-out group, never a dispatched one."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents_adapter.proxy.app import create_app
from agents_adapter.proxy.config import AdapterConfig
from bus.config import BusConfig
from bus.errors import ConsumeError
from bus.producer import EventProducer
from examples.calculator.tasks import make_arithmetic_tasks
from infra.evaluation import held_out_rows
from infra.evaluator import EVAL_TEMPERATURE, EvaluatorConfig, recorded_schedule, serve
from infra.rollout_workers import WorkerConfig
from infra.run_inputs import task_rows
from schemas import events as ev
from schemas.rollout_events import is_held_out
from tests.adapter.conftest import ADMIN_KEY
from tests.adapter.support import free_port, wait_for
from tests.adapter.support import serve as serve_app
from tests.adapter.test_adapter_service import recorded

pytestmark = pytest.mark.kafka

RUN = "eval-test"


def calculator(n: int, seed: int) -> list[dict[str, Any]]:
    return task_rows(make_arithmetic_tasks(n, seed, max_operand=9), "calculator")


@pytest.fixture
def proxy(bus_config: BusConfig, tiny_model_dir: Path, engine_a: tuple[str, Any]) -> Iterator[tuple[str, str]]:
    """The proxy's URL and served model name."""
    config = AdapterConfig.build(
        env={"SFLOW_ADAPTER_API_KEYS": "agent-a=key-a", "SFLOW_ADAPTER_ADMIN_KEY": ADMIN_KEY},
        model_path=tiny_model_dir, port=free_port(), inference_endpoints=[f"rollout-a={engine_a[0]}"],
        bus=bus_config, routing_from_events=False, delivery_timeout_ms=5000)
    with ExitStack() as stack:
        yield stack.enter_context(serve_app(create_app(config), config.port)), config.model_name
    gc.collect()  # the proxy's librdkafka handles go now, not when the broker is long gone


def evals(bus: BusConfig) -> list[ev.EvalCompleted]:
    try:
        return recorded(bus, "train", ev.EvalCompleted)
    except ConsumeError:  # a fresh broker's partition without a leader yet: nothing recorded to read
        return []


def test_each_evaluation_is_tagged_with_the_versions_the_proxy_served(
        bus_config: BusConfig, proxy: tuple[str, str], engine_a: tuple[str, Any], tiny_model_dir: Path,
        perturbed_model_dir: Path, tmp_path: Path) -> None:
    rows = held_out_rows(calculator, 3, 1007, calculator(40, 7))
    tasks_file = tmp_path / "eval_tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    worker = WorkerConfig(f"{proxy[0]}/v1", "key-a", proxy[1], concurrency=3, max_turns=1, max_tokens=6,
                          temperature=EVAL_TEMPERATURE)
    config = EvaluatorConfig(worker, RUN, tasks_file, every_steps=1, max_steps=1, tasks_seed=1007, sync_wait_s=60)
    stop = threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(serve(config, bus_config, stop)), daemon=True)
    thread.start()
    producer = EventProducer(bus_config)
    try:
        wait_for(lambda: len(evals(bus_config)) == 1, timeout_s=90, interval_s=0.5)
        swap = httpx.post(f"{engine_a[0]}/update_weights_from_disk", timeout=60,
                          json={"model_path": str(perturbed_model_dir), "weight_version": "1"})
        assert swap.status_code == 200, swap.text
        producer.publish_sync(ev.TrainStepCompleted(
            correlation_id="a1", run_id=RUN, step=1, new_version=1, loss=0.0, reward_mean=0.0, kl=0.0,
            clip_fraction=0.0, num_tokens=1, duration_ms=1.0), 10)
        assert len(evals(bus_config)) == 1  # due, but it waits for the engines to serve version 1
        producer.publish_sync(ev.WeightSyncCompleted(model="m", sync_id="s1", version=1), 10)
        wait_for(lambda: len(evals(bus_config)) == 2, timeout_s=90, interval_s=0.5)
    finally:
        stop.set()
        thread.join(timeout=30)
        producer.close()
        httpx.post(f"{engine_a[0]}/update_weights_from_disk", timeout=60,
                   json={"model_path": str(tiny_model_dir), "weight_version": "0"})
    start, end = sorted(evals(bus_config), key=lambda e: e.step)
    assert (start.step, start.trigger, start.versions, start.pinned) == (0, "start", (0,), True)
    assert (end.step, end.trigger, end.versions, end.pinned) == (1, "end", (1,), True)
    for e in (start, end):
        assert e.task_ids == tuple(r["task_id"] for r in rows) and e.num_tasks == 3 and e.failed == 0
        assert e.temperature == 0.0 and 0.0 <= e.accuracy <= 1.0
    restarted = recorded_schedule(config, bus_config)  # what an evaluator started now would find to do
    assert restarted.finished and restarted.due() is None and restarted.completed == 1
    calls = recorded(bus_config, "llm.calls", ev.LLMCall)
    assert len(calls) == 6 and all(is_held_out(c.group_id) for c in calls)
    assert sorted({int(v) for c in calls for v in c.output_versions}) == [0, 1]
