"""What every framework test checks: a stock agent run through the capture proxy, and the proxy's guarantees
on the calls it made, whatever the agent made of the random model's replies.

`served_and_recorded` runs the agent (a `drive` function that builds it against the proxy and runs it,
catching the framework's own errors about replies that do not parse) and asserts: every request answered
(no 4xx/5xx), every call recorded once on `llm.calls` with the prompt the engine read and the tokens it
wrote, the session a trajectory of those calls, and drift flagged on exactly the calls whose history the
framework rewrote. The last is judged here from the HTTP exchanges alone (`rewrote_history`), not from the
proxy's code: a call continues the session when its history (tools included) starts with an earlier call's
request plus the reply that call got, as served, with no assistant turn after it; a call that sends
assistant turns and continues no earlier call rewrote history. Chat messages and Responses items are
compared by what a chat template renders of them (role, text, tool calls' names and JSON arguments).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from bus.config import BusConfig
from schemas import events as ev
from tests.adapter.support import engine_inputs
from tests.adapter.test_adapter_service import Proxy, recorded
from tests.kafka.test_trajectory_processor import Worker, wait_for_trajectories

KEY = "key-a"


@dataclass(frozen=True)
class Exchange:
    status: int
    path: str
    request: dict[str, Any]
    body: dict[str, Any]

    @property
    def call_ids(self) -> list[str]:
        return list(self.body.get("sflow", {}).get("call_ids", []))


@dataclass
class Exchanges:
    """The agent's HTTP exchanges with the proxy's call routes, seen through its HTTP client's own event hook
    (`hook` for httpx.Client, `async_hook` for httpx.AsyncClient)."""

    answers: list[Exchange] = field(default_factory=list)

    def _add(self, response: httpx.Response) -> None:
        if response.request.method != "POST" or "/v1/sessions/" in response.request.url.path:
            return  # not a call: a session's end or reward
        self.answers.append(Exchange(response.status_code, response.request.url.path,
                                     json.loads(response.request.content or b"{}"), response.json()))

    def hook(self, response: httpx.Response) -> None:
        response.read()
        self._add(response)

    async def async_hook(self, response: httpx.Response) -> None:
        await response.aread()
        self._add(response)

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"response": [self.hook]}, timeout=600)

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(event_hooks={"response": [self.async_hook]}, timeout=600)


# ------------------------------------------------------------------------- history, as templates see it


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))


def _arguments(arguments: Any) -> Any:
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return arguments


def _chat_turn(message: Mapping[str, Any]) -> tuple[Any, ...]:
    calls = tuple((c["function"]["name"], json.dumps(_arguments(c["function"].get("arguments")), sort_keys=True))
                  for c in message.get("tool_calls") or ())
    return message["role"], _text(message.get("content")), calls


def _responses_turn(item: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """A Responses item as the turn it renders (None: an item that renders nothing, an empty reply text)."""
    kind = item.get("type", "message")
    if kind == "function_call":
        return "assistant", "", ((item["name"], json.dumps(_arguments(item.get("arguments")), sort_keys=True)),)
    if kind == "function_call_output":
        return "tool", _text(item.get("output")), ()
    if kind == "message":
        text = _text(item.get("content"))
        return None if item.get("role") == "assistant" and not text else (item["role"], text, ())
    return kind, json.dumps(item, sort_keys=True), ()


def _turns(exchange: Exchange) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The request's history and the reply it got, as turns; the first history turn holds the tools."""
    request, body = exchange.request, exchange.body
    tools = ("tools", json.dumps(request.get("tools") or [], sort_keys=True), ())
    if exchange.path.endswith("/chat/completions"):
        return [tools, *map(_chat_turn, request["messages"])], [_chat_turn(body["choices"][0]["message"])]
    items = request["input"] if isinstance(request["input"], list) else [{"role": "user", "content": request["input"]}]
    if request.get("instructions"):
        items = [{"role": "system", "content": request["instructions"]}, *items]
    history = [t for t in map(_responses_turn, items) if t is not None]
    return [tools, *history], [t for t in map(_responses_turn, body["output"]) if t is not None]


def rewrote_history(exchanges: Sequence[Exchange]) -> list[bool]:
    """Per exchange: whether the agent sent assistant turns there that continue none of its earlier calls."""
    seen: list[list[tuple[Any, ...]]] = []
    out = []
    for exchange in exchanges:
        history, reply = _turns(exchange)
        continues = any(history[: len(before)] == before and all(t[0] != "assistant" for t in history[len(before):])
                        for before in seen)
        out.append(bool(seen) and not continues and any(t[0] == "assistant" for t in history))
        seen.append(history + reply)
    return out


# ----------------------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class Run:
    exchanges: list[Exchange]
    calls: list[ev.LLMCall]
    drifted: list[bool]  # per call, in turn order: what the proxy flagged


Driver = Callable[[Proxy, Exchanges], str]
#: `served_and_recorded` with the test's broker, proxy factory, engine and scratch: (session, driver) -> Run
ThroughProxy = Callable[[str, Driver], Run]


def served_and_recorded(bus: BusConfig, start_proxy: Callable[..., Proxy], engine_a: tuple[str, Any],
                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, session: str,
                        drive: Driver) -> Run:
    """Runs a stock agent (`drive`: builds it against the proxy, runs it, says how it ended) and checks what
    the proxy guarantees on the calls it made."""
    worker = Worker(bus, tmp_path / "data", tmp_path / "worker.log")
    worker.start()
    seen = engine_inputs(engine_a[1], monkeypatch)
    proxy = start_proxy(bus, (f"rollout-a={engine_a[0]}",))
    exchanges = Exchanges()
    try:
        print(drive(proxy, exchanges)[:300])
        answers = exchanges.answers
        assert answers and {a.status for a in answers} == {200}, [a for a in answers if a.status != 200]
        calls = sorted((c for c in recorded(bus, "llm.calls", ev.LLMCall) if c.session_id == session),
                       key=lambda c: c.turn)
        assert all(len(a.call_ids) == 1 for a in answers)  # the frameworks ask for one choice
        assert [c.call_id for c in calls] == [a.call_ids[0] for a in answers]  # each recorded once, in order
        by_id = {c.call_id: c for c in calls}
        for call in calls:
            engine_input, future = seen[f"{call.call_id}-0"]
            assert list(call.prompt_ids) == engine_input  # the recorded prompt is what the engine read
            assert list(call.output_ids) == future.result().output_ids  # and the tokens it wrote
            if call.parent_call_id:  # a continuation reuses its parent's ids verbatim
                parent = by_id[call.parent_call_id]
                served = list(parent.prompt_ids) + list(parent.output_ids)
                assert list(call.prompt_ids[: len(served)]) == served and not call.drift
        rewrote = rewrote_history(answers)
        drifted = [c.drift for c in calls]
        assert drifted == rewrote, f"drift flagged {drifted}, history rewritten {rewrote}"
        ended = httpx.post(f"{proxy.url}/v1/sessions/{session}/end", json={"reward": 0.0},
                           headers={"Authorization": f"Bearer {KEY}"})
        assert ended.status_code == 200, ended.text
        worker.wait_ready()
        trajectory = wait_for_trajectories(bus, {session}, worker)[session]
        assert set(trajectory.call_ids) == set(by_id) and trajectory.drift_calls == sum(drifted)
    finally:
        worker.stop()
    print(f"calls: {len(calls)}, prompt tokens: {[len(c.prompt_ids) for c in calls]}, drift: {drifted}, "
          f"continuations: {[bool(c.parent_call_id) for c in calls]}")
    return Run(answers, calls, drifted)
