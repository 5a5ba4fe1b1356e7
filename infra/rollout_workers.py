"""Rollout workers: run the example's agent on every task the scheduler dispatches.

They stand for the agent fleet of a real deployment: they read `TaskDispatched` from `tasks`, run
the group's n sessions through the capture proxy with the official OpenAI client (the agents know
nothing but the proxy's base URL and their key), score each episode with the example's reward and
report it. A dispatch is committed only once all its sessions ended, so a killed worker re-runs
unfinished groups (the trajectory processor ignores samples beyond a complete group). The agent, the
task parser and the reward are the run config's `example` parts (infra/example.py), loaded at start-up.

`python -m infra.rollout_workers --base-url http://127.0.0.1:8100/v1 --api-key KEY --model NAME
[--agent module:attr --task module:attr --reward module:attr]` (default: the calculator example)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai

from agents_adapter.sdk import AsyncAgentSession
from bus.config import BusConfig
from bus.consumer import EventConsumer, Received
from bus.kit import run_until_signalled
from bus.log import configure_logging
from infra.example import AGENT_SETTINGS, CALCULATOR, Agent, check_call, load_reference
from schemas.events import TaskDispatched
from schemas.payloads import TaskPayload

log = logging.getLogger("sflow.rollout")


@dataclass(frozen=True)
class WorkerConfig:
    """base_url: the proxy's OpenAI base URL (…/v1). concurrency: sessions running at once.
    max_turns / max_tokens / temperature / ignore_eos: the agent's settings. agent / task / reward: the
    example's parts (`package.module:attribute`; task None: the agent and reward take the row)."""

    base_url: str
    api_key: str
    model: str
    concurrency: int = 16
    max_turns: int = 3
    max_tokens: int = 96
    temperature: float = 1.0
    ignore_eos: bool = False
    group_id: str = "rollout-workers"
    agent: str = CALCULATOR.agent
    task: str | None = CALCULATOR.task
    reward: str = CALCULATOR.reward


@dataclass(frozen=True)
class Example:
    """The example's parts, loaded: the agent built with the worker's settings."""

    agent: Agent
    task_of: Callable[[dict[str, Any]], Any]
    reward: Callable[[Any, Any], float]

    @classmethod
    def load(cls, config: WorkerConfig) -> Example:
        settings = {name: getattr(config, name) for name in AGENT_SETTINGS}
        agent_factory = load_reference(config.agent)
        check_call("agent", config.agent, agent_factory, 1, settings)
        task_of = load_reference(config.task) if config.task else dict
        return cls(agent_factory(config.model, **settings), task_of, load_reference(config.reward))


def row_of(event: TaskDispatched) -> dict[str, Any]:
    """The dispatched row, its `task_id` the dispatched one."""
    return {**TaskPayload.from_json(event.payload).fields, "task_id": event.task_id}


async def run_episode(config: WorkerConfig, example: Example, task: Any, event: TaskDispatched,
                      http: openai.DefaultAsyncHttpxClient) -> float:
    """One session through the proxy (over the worker's one HTTP client, see agents_adapter.sdk);
    the reward is reported when the session ends."""
    async with AsyncAgentSession(config.base_url, config.api_key, task_id=event.task_id,
                                 group_id=event.group_id, http_client=http) as s:
        episode = await example.agent.arun(s.client, task, s.session_id)
        s.reward = reward = float(example.reward(episode, task))
    return reward


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


async def run_group(config: WorkerConfig, example: Example, event: TaskDispatched,
                    slots: asyncio.Semaphore, http: openai.DefaultAsyncHttpxClient) -> list[float]:
    """The group's rewards (0.0 for a session that failed)."""
    task = example.task_of(row_of(event))

    async def one() -> float:
        async with slots:
            try:
                return await run_episode(config, example, task, event, http)
            except Exception as e:  # a failed session is reported failed by the SDK; the group goes on
                log.warning("episode failed", extra={"group": event.group_id, "error": repr(e)})
                return 0.0

    return list(await asyncio.gather(*(one() for _ in range(event.n_samples))))


async def serve(config: WorkerConfig, bus: BusConfig, stop: threading.Event) -> None:
    example = Example.load(config)
    consumer = EventConsumer(bus, config.group_id, ["tasks"])
    commits = InOrderCommits(consumer)
    slots = asyncio.Semaphore(config.concurrency)
    running: set[asyncio.Task[None]] = set()
    http = openai.DefaultAsyncHttpxClient()

    async def handle(r: Received) -> None:
        assert isinstance(r.event, TaskDispatched)
        rewards = await run_group(config, example, r.event, slots, http)
        mean = sum(rewards) / max(1, len(rewards))
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
        await http.aclose()
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
    parser.add_argument("--agent", default=CALCULATOR.agent, help="the example's agent factory (module:attr)")
    parser.add_argument("--task", default=CALCULATOR.task, help="its row-to-task parser ('' : the row itself)")
    parser.add_argument("--reward", default=CALCULATOR.reward, help="its reward(episode, task)")
    args = parser.parse_args(argv)
    configure_logging("rollout-workers")
    config = WorkerConfig(args.base_url, args.api_key, args.model, args.concurrency, args.max_turns,
                          args.max_tokens, args.temperature, args.ignore_eos,
                          agent=args.agent, task=args.task or None, reward=args.reward)
    bus = BusConfig.from_env("rollout-workers")
    run_until_signalled(lambda stop: asyncio.run(serve(config, bus, stop)))


if __name__ == "__main__":
    main()
