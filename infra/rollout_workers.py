"""Rollout workers: run the example agent on every task the scheduler dispatches.

They stand for the agent fleet of a real deployment: they read `TaskDispatched` from `tasks`, run
the group's n sessions through the capture proxy with the official OpenAI client (the agents know
nothing but the proxy's base URL and their key), verify each answer and report the reward. A
dispatch is committed only once all its sessions ended, so a killed worker re-runs unfinished
groups (the trajectory processor ignores samples beyond a complete group).

`python -m infra.rollout_workers --base-url http://127.0.0.1:8100/v1 --api-key KEY --model NAME`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import threading
from collections import defaultdict
from dataclasses import dataclass

from agents_adapter.agents import ArithmeticTask, CalculatorAgent, EpisodeResult, verify
from agents_adapter.sdk import AsyncAgentSession
from bus.config import BusConfig
from bus.consumer import EventConsumer, Received
from bus.log import configure_logging
from schemas.events import TaskDispatched

log = logging.getLogger("sflow.rollout")


@dataclass(frozen=True)
class WorkerConfig:
    """base_url: the proxy's OpenAI base URL (…/v1). concurrency: sessions running at once.
    max_turns / max_tokens / temperature / ignore_eos: the agent's settings."""

    base_url: str
    api_key: str
    model: str
    concurrency: int = 16
    max_turns: int = 3
    max_tokens: int = 96
    temperature: float = 1.0
    ignore_eos: bool = False
    group_id: str = "rollout-workers"


FORMAT_REWARD = 0.2  # the episode used the calculator correctly (a tool call that parsed and ran)
REPORT_REWARD = 0.3  # the final answer reports what the calculator returned
CORRECT_REWARD = 0.5  # the final answer is the task's answer


def shaped_reward(result: EpisodeResult, task: ArithmeticTask) -> float:
    """Format, faithful report, correctness — R1-style shaping for a tool agent: the small rewards for
    calling the tool and reporting its result give GRPO a signal before correct answers are common."""
    used_tool = result.tool_calls > 0 and result.tool_errors == 0
    reported = used_tool and result.answered and result.last_tool_output != "" and verify(
        result.answer, ArithmeticTask(task.task_id, "", _number(result.last_tool_output))) == 1.0
    correct = verify(result.answer, task)
    return FORMAT_REWARD * used_tool + REPORT_REWARD * reported + CORRECT_REWARD * correct


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


async def run_episode(
    config: WorkerConfig, agent: CalculatorAgent, task: ArithmeticTask, group_id: str
) -> EpisodeResult:
    """One session through the proxy; the reward is reported when the session ends."""
    async with AsyncAgentSession(config.base_url, config.api_key, task_id=task.task_id, group_id=group_id) as s:
        result = await agent.arun(s.client, task, s.session_id)
        result.reward = s.reward = shaped_reward(result, task)
    return result


def task_of(event: TaskDispatched) -> ArithmeticTask:
    payload = json.loads(event.payload)
    return ArithmeticTask(event.task_id, str(payload["question"]), float(payload["answer"]))


class InOrderCommits:
    """Marks a dispatch done only when every earlier one of its partition is done too."""

    def __init__(self, consumer: EventConsumer) -> None:
        self.consumer = consumer
        self.open: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.done: dict[tuple[str, int], set[int]] = defaultdict(set)
        self.by_key: dict[tuple[str, int, int], Received] = {}

    def started(self, r: Received) -> None:
        self.open[(r.topic, r.partition)].append(r.offset)
        self.by_key[(r.topic, r.partition, r.offset)] = r

    def finished(self, r: Received) -> None:
        key = (r.topic, r.partition)
        self.done[key].add(r.offset)
        offsets = self.open[key]
        while offsets and offsets[0] in self.done[key]:
            first = offsets.pop(0)
            self.done[key].discard(first)
            self.consumer.mark_processed(self.by_key.pop((r.topic, r.partition, first)))


async def run_group(config: WorkerConfig, agent: CalculatorAgent, event: TaskDispatched,
                    slots: asyncio.Semaphore) -> list[EpisodeResult]:
    task = task_of(event)

    async def one() -> EpisodeResult:
        async with slots:
            try:
                return await run_episode(config, agent, task, event.group_id)
            except Exception as e:  # a failed session is reported failed by the SDK; the group goes on
                log.warning("episode failed", extra={"group": event.group_id, "error": repr(e)})
                return EpisodeResult("", task.task_id)

    return list(await asyncio.gather(*(one() for _ in range(event.n_samples))))


async def serve(config: WorkerConfig, bus: BusConfig, stop: threading.Event) -> None:
    consumer = EventConsumer(bus, config.group_id, ["tasks"])
    commits = InOrderCommits(consumer)
    agent = CalculatorAgent(config.model, max_turns=config.max_turns, max_tokens=config.max_tokens,
                            temperature=config.temperature, ignore_eos=config.ignore_eos)
    slots = asyncio.Semaphore(config.concurrency)
    running: set[asyncio.Task[None]] = set()

    async def handle(r: Received) -> None:
        assert isinstance(r.event, TaskDispatched)
        results = await run_group(config, agent, r.event, slots)
        mean = sum(x.reward for x in results) / max(1, len(results))
        log.info("group done", extra={"group": r.event.group_id, "reward": round(mean, 3)})
        commits.finished(r)

    try:
        while not stop.is_set():
            batch = await asyncio.to_thread(consumer.poll, 0.5)
            for r in batch:
                if isinstance(r.event, TaskDispatched):
                    commits.started(r)
                    t = asyncio.create_task(handle(r))
                    running.add(t)
                    t.add_done_callback(running.discard)
                else:
                    consumer.mark_processed(r)
            await asyncio.to_thread(consumer.commit)
    finally:
        for t in running:
            t.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        consumer.close(commit=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m infra.rollout_workers", description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--ignore-eos", action="store_true", help="every call generates its whole max_tokens")
    args = parser.parse_args(argv)
    configure_logging("rollout-workers")
    config = WorkerConfig(args.base_url, args.api_key, args.model, args.concurrency, args.max_turns,
                          args.max_tokens, args.temperature, args.ignore_eos)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    asyncio.run(serve(config, BusConfig.from_env("rollout-workers"), stop))


if __name__ == "__main__":
    main()
