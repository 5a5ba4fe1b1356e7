"""Evaluator: the held-out evaluations of a run (what, when and why: infra/evaluation.py).

It sits next to the rollout workers in the demo's agent fleet and runs the same example agent and
reward through the capture proxy, one greedy session per held-out task, on the rollout resources
between and during train steps, as the policy routes any call. It follows `train` (TrainStepCompleted:
when an evaluation is due; its own EvalCompleted: which are done, read to the end at start-up, so a
restarted evaluator goes on where it was) and `weights` (WeightSyncCompleted: the engines serve the
newest step's weights), and publishes one `EvalCompleted` per evaluation on `train`, tagged with the
weight versions the proxy returned for its tokens. It waits at most `sync_wait_s` for a weight sync
before evaluating anyway (the tags tell).

`python -m infra.evaluator --base-url URL --api-key KEY --model NAME --run-id RUN --tasks-file FILE
--every-steps N --max-steps M [--agent/--task/--reward/--score module:attr ...]`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai

from agents_adapter.sdk import AsyncAgentSession
from bus.config import BusConfig
from bus.consumer import EventConsumer, unique_group
from bus.errors import ConsumeError
from bus.kit import run_until_signalled
from bus.log import configure_logging
from bus.producer import EventProducer
from bus.replay import replay
from infra.evaluation import EvalSchedule, TaskResult, eval_event, group_id_of, versions_in_reply
from infra.example import CALCULATOR, load_reference
from infra.launcher import ServiceSpec
from infra.rollout_workers import Example, WorkerConfig
from schemas.events import EvalCompleted, TrainStepCompleted, WeightSyncCompleted

if TYPE_CHECKING:
    from infra.run_config import RunConfig

log = logging.getLogger("sflow.evaluator")
#: Evaluations are greedy: a version's result is then what that version does, not a sampling draw.
EVAL_TEMPERATURE = 0.0


@dataclass(frozen=True)
class EvaluatorConfig:
    """worker: the agent's settings (its temperature is EVAL_TEMPERATURE). score: `module:attr` of
    score(episode, task) in [0, 1], averaged into the accuracy (None: the reward). sync_wait_s: how long a
    due evaluation waits for the engines to load the newest step's weights."""

    worker: WorkerConfig
    run_id: str
    tasks_file: Path
    every_steps: int
    max_steps: int
    score: str | None = None
    tasks_seed: int = 0
    sync_wait_s: float = 30.0


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class ReplyVersions:
    """The weight versions of the replies the proxy sent each session, read by a response hook on the
    evaluation's one HTTP client (see agents_adapter.sdk: one client for all its sessions)."""

    def __init__(self) -> None:
        self.by_session: dict[str, set[int]] = {}

    async def note(self, response: Any) -> None:  # the openai client's own HTTP library's response
        versions = self.by_session.get(response.request.headers.get("X-Session-Id", ""))
        if versions is not None and response.headers.get("content-type", "").startswith("application/json"):
            await response.aread()
            with contextlib.suppress(ValueError, TypeError, AttributeError):  # not a completion body
                versions.update(versions_in_reply(response.json()))


async def run_task(worker: WorkerConfig, example: Example, score_of: Callable[[Any, Any], float],
                   row: dict[str, Any], group_id: str, http: openai.DefaultAsyncHttpxClient,
                   replies: ReplyVersions) -> TaskResult:
    """One held-out session; the versions are those of the replies the proxy sent it."""
    task_id = str(row["task_id"])
    task = example.task_of(row)
    session = AsyncAgentSession(worker.base_url, worker.api_key, task_id=task_id, group_id=group_id,
                                http_client=http)
    versions = replies.by_session.setdefault(session.session_id, set())
    try:
        async with session as s:
            episode = await example.agent.arun(s.client, task, s.session_id)
            s.reward = reward = float(example.reward(episode, task))
            score = float(score_of(episode, task))
    except Exception as e:  # a failed session scores 0; the evaluation goes on
        log.warning("held-out session failed", extra={"task": task_id, "error": repr(e)})
        return TaskResult(task_id, 0.0, 0.0, tuple(sorted(versions)), failed=True)
    finally:
        replies.by_session.pop(session.session_id, None)
    return TaskResult(task_id, score, reward, tuple(sorted(versions)))


async def evaluate(config: EvaluatorConfig, example: Example, score_of: Callable[[Any, Any], float],
                   rows: Sequence[dict[str, Any]], step: int) -> EvalCompleted:
    """Every held-out task once, at most `concurrency` at a time."""
    started = time.perf_counter()
    slots = asyncio.Semaphore(config.worker.concurrency)
    replies = ReplyVersions()

    async with openai.DefaultAsyncHttpxClient(event_hooks={"response": [replies.note]}) as http:
        async def one(row: dict[str, Any]) -> TaskResult:
            async with slots:
                return await run_task(config.worker, example, score_of, row,
                                      group_id_of(config.run_id, step, str(row["task_id"])), http, replies)

        results = await asyncio.gather(*(one(r) for r in rows))
    return eval_event(config.run_id, step, config.max_steps, results, temperature=EVAL_TEMPERATURE,
                      tasks_seed=config.tasks_seed, duration_ms=(time.perf_counter() - started) * 1000)


def follow(schedule: EvalSchedule, event: object, run_id: str) -> None:
    """What a consumed event tells the schedule."""
    if isinstance(event, TrainStepCompleted) and event.run_id == run_id:
        schedule.step_completed(event.step, event.new_version, event.status == "skipped")
    elif isinstance(event, WeightSyncCompleted):
        schedule.weights_synced(event.version)
    elif isinstance(event, EvalCompleted) and event.run_id == run_id:
        schedule.done(event.step)


def recorded_schedule(config: EvaluatorConfig, bus: BusConfig) -> EvalSchedule:
    """The schedule as the events recorded so far leave it (read to their end): a restarted evaluator
    redoes none of the evaluations it published."""
    schedule = EvalSchedule(config.every_steps, config.max_steps)
    try:
        for r in replay(bus, ["train", "weights"]).events:
            follow(schedule, r.event, config.run_id)
    except ConsumeError as e:  # a fresh broker's topics without leaders yet: nothing recorded to read
        log.warning("cannot read the recorded train and weights events; starting from none", extra={"error": str(e)})
    return schedule


async def serve(config: EvaluatorConfig, bus: BusConfig, stop: threading.Event) -> None:
    example = Example.load(config.worker)
    score_of = load_reference(config.score) if config.score else example.reward
    rows = read_rows(config.tasks_file)
    schedule = await asyncio.to_thread(recorded_schedule, config, bus)
    consumer = EventConsumer(bus, unique_group(f"evaluator-{config.run_id}"), ["train", "weights"])
    producer = EventProducer(bus, producer_id="evaluator")
    due_since: float | None = None
    try:
        while not stop.is_set():
            batch = await asyncio.to_thread(consumer.poll, 0.5)
            for r in batch:
                follow(schedule, r.event, config.run_id)
            if batch:
                continue  # act on a whole burst of events (a step, then its weight sync)
            step = schedule.due()
            if step is None:
                due_since = None
                continue
            due_since = due_since or time.monotonic()
            if not schedule.synced() and time.monotonic() - due_since < config.sync_wait_s:
                continue
            event = await evaluate(config, example, score_of, rows, step)
            await asyncio.to_thread(producer.publish_sync, event, 30.0)
            log.info("evaluation done", extra={"step": step, "accuracy": round(event.accuracy, 3),
                                               "versions": list(event.versions)})
            schedule.done(step)
            due_since = None
    finally:
        consumer.close(commit=False)
        producer.close()


def evaluator_spec(worker: WorkerConfig, config: EvaluatorConfig, env: dict[str, str]) -> ServiceSpec:
    """The evaluator as the demo launches it (the worker's settings, as the rollout workers get them)."""
    w = worker
    return ServiceSpec("evaluator", "infra.evaluator", (
        "--base-url", w.base_url, f"--api-key={w.api_key}", "--model", w.model, "--run-id", config.run_id,
        "--tasks-file", str(config.tasks_file), "--every-steps", str(config.every_steps),
        "--max-steps", str(config.max_steps), "--tasks-seed", str(config.tasks_seed),
        "--sync-wait-s", str(config.sync_wait_s), "--concurrency", str(w.concurrency),
        "--max-turns", str(w.max_turns), "--max-tokens", str(w.max_tokens),
        "--agent", w.agent, "--task", w.task or "", "--reward", w.reward, "--score", config.score or ""), env)


def evaluator_of(config: RunConfig, tasks_file: Path, base_url: str, api_key: str, model: str,
                 env: dict[str, str]) -> ServiceSpec:
    """The run's evaluator: its example and agent settings, greedy, on the `eval` section's schedule."""
    agent, example = config.agent, config.example
    worker = WorkerConfig(base_url, api_key, model, config.eval.concurrency, agent.max_turns, agent.max_tokens,
                          EVAL_TEMPERATURE, False, agent=example.agent, task=example.task,  # ends at EOS
                          reward=example.reward)
    return evaluator_spec(worker, EvaluatorConfig(
        worker, config.name, tasks_file, config.eval.every_steps, config.run.max_steps, score=example.score,
        tasks_seed=config.eval.seed, sync_wait_s=config.eval.sync_wait_s), env)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m infra.evaluator", description=__doc__.splitlines()[0])
    for flag in ("--base-url", "--api-key", "--model", "--run-id", "--tasks-file"):
        p.add_argument(flag, required=True)
    for flag, default in (("--every-steps", 10), ("--max-steps", 40), ("--tasks-seed", 0), ("--concurrency", 16),
                          ("--max-turns", 3), ("--max-tokens", 80)):
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--sync-wait-s", type=float, default=30.0)
    p.add_argument("--agent", default=CALCULATOR.agent)
    p.add_argument("--task", default=CALCULATOR.task, help="its row-to-task parser ('': the row itself)")
    p.add_argument("--reward", default=CALCULATOR.reward)
    p.add_argument("--score", default=CALCULATOR.score or "", help="score(episode, task) in [0, 1] ('': the reward)")
    return p


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    configure_logging("evaluator")
    worker = WorkerConfig(a.base_url, a.api_key, a.model, a.concurrency, a.max_turns, a.max_tokens,
                          temperature=EVAL_TEMPERATURE, agent=a.agent, task=a.task or None, reward=a.reward)
    config = EvaluatorConfig(worker, a.run_id, Path(a.tasks_file), a.every_steps, a.max_steps,
                             score=a.score or None, tasks_seed=a.tasks_seed, sync_wait_s=a.sync_wait_s)
    bus = BusConfig.from_env("evaluator")
    run_until_signalled(lambda stop: asyncio.run(serve(config, bus, stop)))


if __name__ == "__main__":
    main()

