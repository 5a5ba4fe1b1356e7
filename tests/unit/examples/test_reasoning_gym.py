"""The reasoning-gym example: its tasks (reasoning-gym's generator; held-out disjoint from training by the
evaluation's own machinery), its reward and score (reasoning-gym's `score_answer`), and its warm-up, which
must be exactly what the unmodified openai-agents agent sends (checked against the SDK's own requests)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from examples.calculator.agent import EpisodeResult
from examples.calculator.tool import run_tool
from examples.reasoning_gym.agent import GymAgent
from examples.reasoning_gym.reward import score, shaped_reward
from examples.reasoning_gym.tasks import GymTask, make_tasks, task_from_row
from examples.reasoning_gym.warmup import demonstrations, tool_conversation
from infra.evaluation import disjoint, held_out_rows
from infra.run_config import RunConfig
from tests.fakes import ScriptedChatModel
from trainer_svc.warmup import demonstrations_from_records

pytestmark = pytest.mark.unit
CONFIG = RunConfig.load(Path(__file__).resolve().parents[3] / "examples" / "reasoning_gym" / "config.yaml")
OPTIONS: dict[str, Any] = dict(CONFIG.example.tasks_options)


def rows(count: int, seed: int) -> list[dict[str, Any]]:
    """As the run writes its tasks file: each task a JSON object."""
    return [json.loads(json.dumps(dataclasses.asdict(t))) for t in make_tasks(count, seed, **OPTIONS)]


def test_tasks_come_from_reasoning_gym_and_held_out_ones_are_not_trained_on() -> None:
    train = rows(300, CONFIG.tasks.seed)
    assert all(r["dataset"] == "basic_arithmetic" and r["question"].startswith("Calculate ") for r in train)
    assert rows(300, CONFIG.tasks.seed) == train  # seeded
    held_out = held_out_rows(lambda n, seed: rows(n, seed), 32, CONFIG.eval.seed, train)
    assert len(held_out) == 32 and disjoint(held_out, train)
    # the same question drawn by two seeds is the same row content (no positional metadata in it)
    other = rows(300, CONFIG.eval.seed)
    shared = {r["question"] for r in train} & {r["question"] for r in other}
    assert shared and not disjoint([r for r in other if r["question"] in shared], train)
    task = task_from_row(train[0])
    assert task == make_tasks(1, CONFIG.tasks.seed, **OPTIONS)[0]


@pytest.mark.parametrize(("answer", "tool_calls", "tool_errors", "tool_output", "expected"), [
    ("7", 1, 0, "7", 1.0),  # tool used, its result reported, right answer
    ("9", 1, 0, "9", 0.5),  # result reported faithfully, wrong expression
    ("5", 1, 0, "9", 0.2),  # tool used, answer made up
    ("7", 0, 0, "", 0.5),  # right without the tool
    ("7", 1, 1, "", 0.5),  # a failed tool call earns no format reward
    ("The answer is 7", 0, 0, "", 0.5 / 15),  # score_answer's partial credit: len(answer) / len(reply)
])
def test_reward_and_score_are_reasoning_gyms_verdict(answer: str, tool_calls: int, tool_errors: int,
                                                     tool_output: str, expected: float) -> None:
    task = GymTask("t", "basic_arithmetic", "Calculate 3 + 4.", "7", {"expression": "3 + 4"})
    episode = EpisodeResult("s", "t", answer=answer, tool_calls=tool_calls, tool_errors=tool_errors,
                            answered=True, last_tool_output=tool_output)
    assert shaped_reward(episode, task) == pytest.approx(expected)
    assert score(episode, task) == pytest.approx(1.0 if answer == "7" else expected / 0.5 if "7" in answer else 0.0)
    assert score(dataclasses.replace(episode, answered=False), task) == 0.0


def test_warmup_demonstrations_render_and_their_tool_calls_run() -> None:
    records = demonstrations(64, seed=0, **OPTIONS, direct_fraction=0.5)
    data = demonstrations_from_records(records, "test")
    assert len(data.conversations) == 64
    with_tool = [r["messages"] for r in records if len(r["messages"]) == 5]
    assert 10 < len(with_tool) < 54
    for messages in with_tool:
        call = messages[2]["tool_calls"][0]["function"]
        assert run_tool(call["name"], call["arguments"]) == (messages[3]["content"], True)
        assert messages[4]["content"] == messages[3]["content"]


def test_the_warmup_is_what_the_unmodified_sdk_sends() -> None:
    """The openai-agents agent, run against a model that replays a tool demonstration, sends exactly the
    demonstration's prompts and tools; its episode is scored right."""
    task = make_tasks(1, 5, **OPTIONS)[0]
    demo = tool_conversation(task)
    model = ScriptedChatModel([demo[2], demo[4]])
    client = model.client()
    episode = asyncio.run(GymAgent("m", max_turns=3, max_tokens=64).arun(client, task, "s"))
    record = demonstrations(1, 0, **OPTIONS, direct_fraction=0.0)[0]
    assert [r["messages"] for r in model.requests] == [demo[:2], demo[:4]]
    assert all(r["tools"] == record["tools"] for r in model.requests)
    assert (episode.answered, episode.tool_calls, episode.tool_errors, episode.turns) == (True, 1, 0, 2)
    assert shaped_reward(episode, task) == 1.0 and score(episode, task) == 1.0


def test_an_episode_the_sdk_ends_by_raising_is_unanswered() -> None:
    def bad_call(i: int) -> dict[str, Any]:
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "1 +"}'}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    model = ScriptedChatModel([bad_call(0), bad_call(1)])
    client = model.client()
    task = make_tasks(1, 5, **OPTIONS)[0]
    episode = asyncio.run(GymAgent("m", max_turns=2).arun(client, task, "s"))
    assert not episode.answered and (episode.tool_calls, episode.tool_errors) == (2, 2)
    assert model.requests[1]["messages"][-1]["content"].startswith("error:")
    assert shaped_reward(episode, task) == 0.0
