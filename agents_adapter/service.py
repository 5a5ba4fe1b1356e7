"""The capture proxy's request logic, without HTTP: sessions, prompts, dispatch, recording, replies.

One served call = one engine-stitched output = one LLMCall event, acknowledged by Kafka before the
reply leaves (`Recorder`). A request with `n` choices (or a batch of text prompts) is several calls,
recorded together: either all of them are served or none is.

Session lifecycle: `open` from its first call; `POST /v1/sessions/{id}/end` with a reward publishes
SessionEnded (after the session's calls in flight finished, so `num_calls` counts them all); without
a reward the session waits in `awaiting_reward` until `/reward` brings it. An ended session takes no
more calls (409). Sessions belong to the agent that opened them (403 for any other agent).
Limits: the session cache is in memory; a session the cache forgot (LRU, TTL, restart) starts over
(its SessionStarted has the same event id, so consumers keep one; its turn numbers restart at 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents_adapter.config import AdapterConfig
from agents_adapter.dispatch import Dispatcher, EngineSampling, now_ms
from agents_adapter.errors import (
    DrainingError,
    InvalidParameterError,
    PromptTooLongError,
    SessionClosedError,
    SessionForbiddenError,
    UnknownModelError,
    UnknownSessionError,
)
from agents_adapter.openai_models import (
    ChatCompletionRequest,
    CompletionRequest,
    TokenGenerateRequest,
    _Sampling,
    unsupported,
)
from agents_adapter.outputs import Reply, chat_logprobs, completion_logprobs, finish_reply
from agents_adapter.recording import Recorder, llm_call, session_ended, session_started
from agents_adapter.routing import RoutingTable
from agents_adapter.stitching import StitchedCall
from agents_adapter.tito import BuiltPrompt, ChatCodec, SessionCache, SessionState, TitoBuilder, new_call_id
from schemas.events import Event, SessionStatus

logger = logging.getLogger(__name__)
_END_WAIT_POLL_S = 0.05


@dataclass(frozen=True)
class CallContext:
    """Who calls and in which session, from the key, the headers and the body."""

    agent_id: str
    session_id: str
    task_id: str = ""
    group_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    request_ms: int = field(default_factory=now_ms)
    started: float = field(default_factory=time.monotonic)


@dataclass
class Served:
    """What the HTTP layer turns into a response body."""

    response_id: str
    session_id: str
    replies: list[Reply]
    prompt_tokens: int
    logprobs: dict[int, dict[str, Any]]
    extra: dict[str, Any]


@dataclass
class _Live:
    """Per-session requests in flight (for end-of-session waiting); not part of the cached state."""

    inflight: int = 0


class AdapterService:
    def __init__(self, config: AdapterConfig, codec: ChatCodec, routing: RoutingTable, dispatcher: Dispatcher,
                 recorder: Recorder) -> None:
        self.config = config
        self.codec = codec
        self.routing = routing
        self.dispatcher = dispatcher
        self.recorder = recorder
        self.sessions = SessionCache(config.session_cache_size, config.session_ttl_s, on_evict=self._evicted)
        self.tito = TitoBuilder(codec, config.calls_cached_per_session)
        self.context_tokens = config.context_tokens()
        self.draining = False
        self.inflight = 0
        self._live: dict[str, _Live] = {}
        self.calls_served = 0
        self.requests_failed: Counter[str] = Counter()
        self.drift_by_agent: Counter[str] = Counter()
        self.calls_by_agent: Counter[str] = Counter()
        self.open_sessions_evicted = 0

    # ----- sessions

    def _evicted(self, state: SessionState, why: str) -> None:
        self.routing.forget_session(state.session_id)
        if state.phase != "ended":
            self.open_sessions_evicted += 1
            logger.warning("session forgotten before it ended",
                           extra={"session": state.session_id, "agent": state.agent_id, "why": why})

    def _session(self, ctx: CallContext) -> SessionState:
        state, _ = self.sessions.get_or_create(ctx.session_id, lambda: SessionState(
            ctx.session_id, ctx.agent_id, ctx.task_id, ctx.group_id, dict(ctx.metadata)))
        if state.agent_id != ctx.agent_id:
            raise SessionForbiddenError(f"session {ctx.session_id!r} belongs to another agent")
        if state.phase != "open":
            raise SessionClosedError(f"session {ctx.session_id!r} has ended ({state.phase}): start a new session")
        state.task_id = state.task_id or ctx.task_id
        state.group_id = state.group_id or ctx.group_id
        return state

    def _owned(self, agent_id: str, session_id: str) -> SessionState | None:
        state = self.sessions.get(session_id)
        if state is not None and state.agent_id != agent_id:
            raise SessionForbiddenError(f"session {session_id!r} belongs to another agent")
        return state

    @contextlib.contextmanager
    def _admitted(self, session_id: str) -> Iterator[None]:
        if self.draining:
            raise DrainingError("the proxy is draining and takes no new calls; retry on another instance")
        live = self._live.setdefault(session_id, _Live())
        self.inflight += 1
        live.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1
            live.inflight -= 1
            if live.inflight == 0:
                self._live.pop(session_id, None)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.config.model_name:
            raise UnknownModelError(
                f"The model {model!r} does not exist here; this proxy serves {self.config.model_name!r}",
                param="model",
            )

    # ----- the three call shapes

    async def chat(self, ctx: CallContext, req: ChatCompletionRequest) -> Served:
        self.check_model(req.model)
        req.check_supported()
        messages = [m.for_template() for m in req.messages]
        use_tools = bool(req.tools) and req.tool_choice != "none"
        tools = [t.model_dump(exclude_none=True) for t in req.tools or ()] if use_tools else None
        with self._admitted(ctx.session_id):
            state = self._session(ctx)
            prompt = self.tito.chat_prompt(state, messages, tools)
            max_new = self._budget(len(prompt.ids), req.max_new(), "max_tokens")
            calls = await self._dispatch(ctx, [prompt] * req.n, max_new, self._sampling(req), req.n)
            replies = [
                finish_reply(self.codec, call_id, call, stops=req.stop_list(), stop_token_ids=(),
                             parse_tools=tools is not None)
                for call_id, call in calls
            ]
            await self._record(ctx, state, [prompt] * req.n, replies, req.model)
            for reply in replies:
                self.tito.remember_chat(state, prompt, reply.message(), reply.call_id, reply.call.output_ids)
        logprobs = {i: chat_logprobs(self.codec, r, req.top_logprobs or 0) for i, r in enumerate(replies)
                    } if req.logprobs else {}
        return self._served("chatcmpl", ctx, replies, len(prompt.ids), logprobs, [prompt] * req.n)

    async def complete(self, ctx: CallContext, req: CompletionRequest) -> Served:
        self.check_model(req.model)
        req.check_supported()
        prompts_in = req.prompts()
        with self._admitted(ctx.session_id):
            state = self._session(ctx)
            built = [
                self.tito.text_prompt(state, p) if isinstance(p, str) else self.tito.token_prompt(state, p)
                for p in prompts_in
            ]
            budgets = [self._budget(len(b.ids), req.max_tokens, "max_tokens") for b in built]
            per_choice = [b for b in built for _ in range(req.n)]
            is_text = [isinstance(p, str) for p in prompts_in for _ in range(req.n)]
            sampling = self._sampling(req)
            calls = await self._dispatch(ctx, per_choice, [m for m in budgets for _ in range(req.n)], sampling, req.n)
            replies = [
                finish_reply(self.codec, call_id, call, stops=req.stop_list(), stop_token_ids=(), parse_tools=False)
                for call_id, call in calls
            ]
            await self._record(ctx, state, per_choice, replies, req.model)
            for prompt, reply, text in zip(per_choice, replies, is_text, strict=True):
                if text:
                    self.tito.remember_text(state, prompt, reply.text, reply.call_id, reply.call.output_ids)
                else:
                    self.tito.remember_tokens(state, prompt, reply.call_id, reply.call.output_ids)
        logprobs = {i: completion_logprobs(self.codec, r, req.logprobs) for i, r in enumerate(replies)
                    } if req.logprobs is not None else {}
        return self._served("cmpl", ctx, replies, sum(len(b.ids) for b in built), logprobs, per_choice)

    async def generate(self, ctx: CallContext, req: TokenGenerateRequest) -> Served:
        self.check_model(req.model)
        params = req.sampling_params
        with self._admitted(ctx.session_id):
            state = self._session(ctx)
            prompt = self.tito.token_prompt(state, req.input_ids)
            max_new = self._budget(len(prompt.ids), params.max_new_tokens, "sampling_params.max_new_tokens",
                                   allow_zero=True)
            sampling = EngineSampling(
                temperature=1.0 if params.temperature is None else params.temperature,
                top_p=1.0 if params.top_p is None else params.top_p,
                top_k=-1 if params.top_k is None else params.top_k,
                seed=params.sampling_seed if params.sampling_seed is not None else params.seed,
                stop_token_ids=tuple(params.stop_token_ids or ()), ignore_eos=params.ignore_eos,
            )
            calls = await self._dispatch(ctx, [prompt], max_new, sampling, 1)
            replies = [finish_reply(self.codec, call_id, call, stops=(), stop_token_ids=sampling.stop_token_ids,
                                    parse_tools=False, skip_special_tokens=params.skip_special_tokens)
                       for call_id, call in calls]
            await self._record(ctx, state, [prompt], replies, req.model or self.config.model_name)
            self.tito.remember_tokens(state, prompt, replies[0].call_id, replies[0].call.output_ids)
        return self._served("gen", ctx, replies, len(prompt.ids), {}, [prompt])

    # ----- pieces

    def _budget(self, prompt_tokens: int, requested: int | None, param: str, *, allow_zero: bool = False) -> int:
        limit = self.config.max_prompt_tokens
        if prompt_tokens > limit:
            raise PromptTooLongError(
                f"the prompt has {prompt_tokens} tokens; this proxy accepts at most max_prompt_tokens={limit}",
                param="messages",
            )
        room = self.context_tokens - prompt_tokens
        if room < 1:
            raise PromptTooLongError(
                f"the prompt has {prompt_tokens} tokens; the model's context length is {self.context_tokens}",
                param="messages",
            )
        if requested is None:
            return min(self.config.default_max_tokens, room)
        if requested < (0 if allow_zero else 1):
            raise InvalidParameterError(f"{param}={requested} must be >= 1", param=param)
        if requested > room:
            raise PromptTooLongError(
                f"{param}={requested} + the prompt's {prompt_tokens} tokens exceed the model's context length "
                f"{self.context_tokens}", param=param,
            )
        return requested

    def _sampling(self, req: _Sampling) -> EngineSampling:
        if req.n > self.config.max_n:
            raise unsupported("n", f"n={req.n} is above this proxy's max_n={self.config.max_n}")
        return EngineSampling(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k,
            seed=req.seed,
            ignore_eos=req.ignore_eos,
        )

    async def _dispatch(self, ctx: CallContext, prompts: Sequence[BuiltPrompt], max_new: int | Sequence[int],
                        sampling: EngineSampling, n: int) -> list[tuple[str, StitchedCall]]:
        """Runs every choice on the engines; if one fails the others are cancelled (and aborted)."""
        deadline = ctx.started + self.config.long_request_timeout_s
        budgets = [max_new] * len(prompts) if isinstance(max_new, int) else list(max_new)
        call_ids = [new_call_id() for _ in prompts]
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self.dispatcher.run(
                        call_id, ctx.session_id, prompt.ids, budget,
                        _seeded(sampling, i % n), deadline,
                    ))
                    for i, (call_id, prompt, budget) in enumerate(zip(call_ids, prompts, budgets, strict=True))
                ]
        except BaseExceptionGroup as group_error:
            raise group_error.exceptions[0] from None
        return [(call_id, task.result()) for call_id, task in zip(call_ids, tasks, strict=True)]

    async def _record(self, ctx: CallContext, state: SessionState, prompts: Sequence[BuiltPrompt],
                      replies: list[Reply], model: str) -> None:
        """Publishes the calls (and SessionStarted once) and waits for Kafka; only then are they served."""
        producer = self.config.instance_id
        first_turn = state.next_turn
        state.next_turn += len(replies)
        completed = now_ms()
        events: list[Event] = [] if state.started_recorded else [session_started(state, producer)]
        for i, (prompt, reply) in enumerate(zip(prompts, replies, strict=True)):
            reply.turn = first_turn + i
            events.append(llm_call(
                call_id=reply.call_id, state=state, model=model, turn=reply.turn, call=reply.call,
                request_ms=ctx.request_ms, completed_ms=completed, drift=prompt.drift,
                parent_call_id=prompt.parent_call_id, producer=producer,
            ))
        try:
            await self.recorder.record(events)
        except Exception:
            if state.next_turn == first_turn + len(replies):
                state.next_turn = first_turn  # no later call took a turn: reuse the numbers
            raise
        state.started_recorded = True
        state.calls_served += len(replies)
        drifted = sum(1 for p in prompts if p.drift)
        state.drift_calls += drifted
        self.drift_by_agent[ctx.agent_id] += drifted
        self.calls_by_agent[ctx.agent_id] += len(replies)
        self.calls_served += len(replies)

    def _served(self, kind: str, ctx: CallContext, replies: list[Reply], prompt_tokens: int,
                logprobs: dict[int, dict[str, Any]], prompts: Sequence[BuiltPrompt]) -> Served:
        extra = {
            "session_id": ctx.session_id,
            "call_ids": [r.call_id for r in replies],
            "turns": [r.turn for r in replies],
            "drift": any(p.drift for p in prompts),
            "parent_call_id": prompts[0].parent_call_id if prompts else "",
            "segments": [len(r.call.segments) for r in replies],
        }
        return Served(f"{kind}-{uuid.uuid4().hex}", ctx.session_id, replies, prompt_tokens, logprobs, extra)

    # ----- session ends and rewards

    async def end_session(self, agent_id: str, session_id: str, reward: float | None, status: str,
                          task_id: str = "", group_id: str = "") -> dict[str, Any]:
        """`task_id` / `group_id` come with the end request too: a session that failed before its first
        call reached this proxy (it was down) is still ended in its task group, which can then complete."""
        state = self._owned(agent_id, session_id)
        if state is None:  # never called here, or forgotten: end it anyway (num_calls unknown = 0)
            state, _ = self.sessions.get_or_create(session_id, lambda: SessionState(session_id, agent_id))
        state.task_id = state.task_id or task_id
        state.group_id = state.group_id or group_id
        if state.phase != "open":
            raise SessionClosedError(f"session {session_id!r} has already ended ({state.phase})")
        if reward is None:
            state.phase = "awaiting_reward"
            state.metadata["pending_status"] = status
            await self._wait_idle(session_id)
            return self._session_view(state)
        return await self._close(state, reward, SessionStatus(status))

    async def report_reward(self, agent_id: str, session_id: str, reward: float, status: str | None) -> dict[str, Any]:
        state = self._owned(agent_id, session_id)
        if state is None:
            raise UnknownSessionError(f"session {session_id!r} is not known here (never opened, or forgotten)")
        if state.phase == "ended":
            raise SessionClosedError(f"session {session_id!r} already has its reward ({state.reward})")
        chosen = status or state.metadata.get("pending_status", "completed")
        return await self._close(state, reward, SessionStatus(chosen))

    async def _close(self, state: SessionState, reward: float, status: SessionStatus) -> dict[str, Any]:
        previous = state.phase
        state.phase = "ending"  # no new calls while we wait for those in flight
        try:
            await self._wait_idle(state.session_id)
            await self.recorder.record([session_ended(state, reward, status, self.config.instance_id)])
        except BaseException:
            state.phase = previous
            raise
        state.phase, state.reward = "ended", reward
        state.metadata.pop("pending_status", None)
        return self._session_view(state) | {"status": status.value}

    async def _wait_idle(self, session_id: str) -> None:
        deadline = time.monotonic() + self.config.long_request_timeout_s
        while session_id in self._live and time.monotonic() < deadline:
            await asyncio.sleep(_END_WAIT_POLL_S)

    def session_info(self, agent_id: str, session_id: str) -> dict[str, Any]:
        state = self._owned(agent_id, session_id)
        if state is None:
            raise UnknownSessionError(f"session {session_id!r} is not known here (never opened, or forgotten)")
        return self._session_view(state)

    def _session_view(self, state: SessionState) -> dict[str, Any]:
        return {
            "session_id": state.session_id,
            "agent_id": state.agent_id,
            "task_id": state.task_id,
            "group_id": state.group_id,
            "phase": state.phase,
            "num_calls": state.calls_served,
            "drift_calls": state.drift_calls,
            "reward": state.reward,
        }

    # ----- admin

    async def drain(self, stop_accepting: bool, timeout_s: float, end_sessions: bool) -> dict[str, Any]:
        """Stops taking calls, waits for those in flight, optionally ends open sessions (aborted)."""
        self.draining = stop_accepting
        deadline = time.monotonic() + timeout_s
        while stop_accepting and self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(_END_WAIT_POLL_S)
        ended = 0
        if end_sessions:
            closing = [s for s in self.sessions if s.phase in ("open", "awaiting_reward")]
            await asyncio.gather(*(self._close(s, 0.0, SessionStatus.ABORTED) for s in closing))
            ended = len(closing)
        return {"draining": self.draining, "inflight": self.inflight, "sessions_ended": ended}

    def stats(self) -> dict[str, Any]:
        phases = Counter(s.phase for s in self.sessions)
        return {
            "calls_served": self.calls_served,
            "inflight": self.inflight,
            "draining": self.draining,
            "requests_failed": dict(self.requests_failed),
            "calls_by_agent": dict(self.calls_by_agent),
            "drift_by_agent": dict(self.drift_by_agent),
            "sessions": {
                "cached": len(self.sessions),
                "by_phase": dict(phases),
                "evicted_lru": self.sessions.evicted_lru,
                "expired_ttl": self.sessions.expired_ttl,
                "open_sessions_evicted": self.open_sessions_evicted,
            },
            "dispatch": {"resumed_calls": self.dispatcher.resumed_calls,
                         "engine_failures": self.dispatcher.engine_failures},
            "recording": {"events_recorded": self.recorder.recorded, "events_failed": self.recorder.failed},
            "routing": self.routing.snapshot(),
            "routing_events_applied": self.routing.events_applied,
        }


def _seeded(sampling: EngineSampling, choice: int) -> EngineSampling:
    """Choice i of a seeded request samples with seed + i (n identical samples would be useless)."""
    if sampling.seed is None or choice == 0:
        return sampling
    return EngineSampling(sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed + choice,
                          sampling.stop_token_ids, sampling.ignore_eos)
