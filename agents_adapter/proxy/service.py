"""The capture proxy's request logic, without HTTP: sessions, prompts, dispatch, recording, replies.

One served call = one engine-stitched output = one LLMCall event, acknowledged by Kafka before the
reply leaves (`Recorder`). A request with `n` choices (or a batch of text prompts) is several calls,
recorded together: either all of them are served or none is.

Session lifecycle: `open` from its first call; `POST /v1/sessions/{id}/end` with a reward publishes
SessionEnded (after the session's calls in flight finished, so `num_calls` counts them all); without
a reward the session waits in `awaiting_reward` until `/reward` brings it. An ended session takes no
more calls (409). Sessions belong to the agent that opened them (403 for any other agent).

Durable sessions (`session_store`): owner, counters, phase and the events of every request are
written to the store before Kafka is asked for them, so what the in-memory cache forgets (LRU, TTL,
a restart) comes back from the store: `/end` after a restart publishes the right `num_calls`, the
owner is still enforced, and the session's token-in/token-out cache is rebuilt (no drift).

Idempotent requests: a call retried with the same `Idempotency-Key` (the SDK sends one per logical
call and keeps it across its retries) gets the calls its first try recorded, published again if Kafka
had not acknowledged them, never a second sampling (which would be a second branch in the session's
tree). A retry arriving while the first try is still being served waits for it. `/end` and `/reward`
are idempotent too: a repeated request gets the first answer and publishes nothing; a different one
for a session already closed is refused (409). Closes of one session are serialized, so concurrent
`/reward`s, or `/end` racing `/reward`, publish exactly one SessionEnded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents_adapter.errors import (
    DrainingError,
    InvalidParameterError,
    PromptTooLongError,
    ProxyError,
    SessionClosedError,
    SessionForbiddenError,
    UnknownModelError,
    UnknownSessionError,
)
from agents_adapter.proxy.config import AdapterConfig
from agents_adapter.proxy.dispatch import Dispatcher, EngineSampling, now_ms
from agents_adapter.proxy.openai_models import (
    ChatCompletionRequest,
    CompletionRequest,
    TokenGenerateRequest,
    _Sampling,
    unsupported,
)
from agents_adapter.proxy.outputs import Reply, chat_logprobs, completion_logprobs, finish_reply
from agents_adapter.proxy.recording import Recorder, llm_call, session_ended, session_started
from agents_adapter.proxy.routing import RoutingTable
from agents_adapter.proxy.session_store import SessionStore, StoredCall
from agents_adapter.proxy.stitching import StitchedCall
from agents_adapter.proxy.tito import BuiltPrompt, ChatCodec, SessionCache, SessionState, TitoBuilder, new_call_id
from schemas.events import Event, LLMCall, SessionStarted, SessionStatus

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
    request_key: str = ""  # the client's Idempotency-Key ('' = none: the request is not deduplicated)
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


class _KeyedLocks:
    """One asyncio lock per key, dropped once nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[key]


# What finishes a call into the reply its request shape shows, and its token-in/token-out entry.
_Finish = Callable[[str, StitchedCall], Reply]
_Entry = Callable[[int, BuiltPrompt, Reply], dict[str, Any]]


class AdapterService:
    def __init__(self, config: AdapterConfig, codec: ChatCodec, routing: RoutingTable, dispatcher: Dispatcher,
                 recorder: Recorder) -> None:
        self.config = config
        self.codec = codec
        self.routing = routing
        self.dispatcher = dispatcher
        self.recorder = recorder
        self.sessions = SessionCache(config.session_cache_size, config.session_ttl_s, on_evict=self._evicted)
        self.store = SessionStore(config.session_store_path)
        self._requests = _KeyedLocks()  # (session, idempotency key): a retry waits for its first try
        self._closing = _KeyedLocks()  # session: one /end or /reward at a time
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
        self.sessions_restored = 0
        self.requests_replayed = 0
        self.events_republished = 0

    # ----- sessions

    def _evicted(self, state: SessionState, why: str) -> None:
        """The cache forgot a session; the store keeps it (it comes back on its next request)."""
        self.routing.forget_session(state.session_id)
        if state.phase != "ended":
            self.open_sessions_evicted += 1
            logger.info("open session left the cache (kept in the store)",
                        extra={"session": state.session_id, "agent": state.agent_id, "why": why})

    def _cached(self, session_id: str) -> SessionState | None:
        """The session from the cache, else from the store (with its token-in/token-out cache rebuilt)."""
        state = self.sessions.get(session_id)
        if state is not None:
            return state
        stored = self.store.load(session_id)
        if stored is None:
            return None
        for kept in self.store.recent_calls(session_id, self.config.calls_cached_per_session):
            call = kept.event
            if isinstance(call, LLMCall) and kept.tito is not None:
                self.tito.restore(stored, kept.tito, call.call_id, list(call.prompt_ids), list(call.output_ids))
        self.sessions_restored += 1
        state, _ = self.sessions.get_or_create(session_id, lambda: stored)
        return state

    def _session(self, ctx: CallContext) -> SessionState:
        state = self._cached(ctx.session_id)
        if state is None:
            state, _ = self.sessions.get_or_create(ctx.session_id, lambda: SessionState(
                ctx.session_id, ctx.agent_id, ctx.task_id, ctx.group_id, dict(ctx.metadata)))
            self.store.save(state)
        if state.agent_id != ctx.agent_id:
            raise SessionForbiddenError(f"session {ctx.session_id!r} belongs to another agent")
        if state.phase != "open":
            raise SessionClosedError(f"session {ctx.session_id!r} has ended ({state.phase}): start a new session")
        state.task_id = state.task_id or ctx.task_id
        state.group_id = state.group_id or ctx.group_id
        return state

    def _owned(self, agent_id: str, session_id: str) -> SessionState | None:
        state = self._cached(session_id)
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
        async with self._request(ctx):
            state = self._session(ctx)
            # templating and tokenization on a worker thread: a 10 MB prompt must not stall every other agent
            prompt = await asyncio.to_thread(self.tito.chat_prompt, state, messages, tools)
            max_new = self._budget(len(prompt.ids), req.max_new(), "max_tokens")
            prompts, replies = await self._serve(
                ctx, state, [prompt] * req.n, [max_new] * req.n, self._sampling(req), req.n, req.model,
                lambda call_id, call: finish_reply(self.codec, call_id, call, stops=req.stop_list(),
                                                   stop_token_ids=(), parse_tools=tools is not None),
                lambda _, p, r: {"kind": "chat", "key": self.tito.chat_key(p, r.message()).hex()},
            )
        logprobs = {i: chat_logprobs(self.codec, r, req.top_logprobs or 0) for i, r in enumerate(replies)
                    } if req.logprobs else {}
        return self._served("chatcmpl", ctx, replies, len(prompts[0].ids), logprobs, prompts)

    async def complete(self, ctx: CallContext, req: CompletionRequest) -> Served:
        self.check_model(req.model)
        req.check_supported()
        prompts_in = req.prompts()
        async with self._request(ctx):
            state = self._session(ctx)
            built = await asyncio.to_thread(lambda: [
                self.tito.text_prompt(state, p) if isinstance(p, str) else self.tito.token_prompt(state, p)
                for p in prompts_in
            ])
            budgets = [self._budget(len(b.ids), req.max_tokens, "max_tokens") for b in built]
            is_text = [isinstance(p, str) for p in prompts_in for _ in range(req.n)]

            def entry(i: int, prompt: BuiltPrompt, reply: Reply) -> dict[str, Any]:
                if is_text[i]:
                    return {"kind": "text", "prompt_text": prompt.text, "full_text": prompt.text + reply.text}
                return {"kind": "tokens"}

            per_choice, replies = await self._serve(
                ctx, state, [b for b in built for _ in range(req.n)], [m for m in budgets for _ in range(req.n)],
                self._sampling(req), req.n, req.model,
                lambda call_id, call: finish_reply(self.codec, call_id, call, stops=req.stop_list(),
                                                   stop_token_ids=(), parse_tools=False),
                entry,
            )
        logprobs = {i: completion_logprobs(self.codec, r, req.logprobs) for i, r in enumerate(replies)
                    } if req.logprobs is not None else {}
        return self._served("cmpl", ctx, replies, sum(len(b.ids) for b in per_choice[:: req.n]), logprobs,
                            per_choice)

    async def generate(self, ctx: CallContext, req: TokenGenerateRequest) -> Served:
        self.check_model(req.model)
        params = req.sampling_params
        async with self._request(ctx):
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
            prompts, replies = await self._serve(
                ctx, state, [prompt], [max_new], sampling, 1, req.model or self.config.model_name,
                lambda call_id, call: finish_reply(self.codec, call_id, call, stops=(),
                                                   stop_token_ids=sampling.stop_token_ids, parse_tools=False,
                                                   skip_special_tokens=params.skip_special_tokens),
                lambda *_: {"kind": "tokens"},
            )
        return self._served("gen", ctx, replies, len(prompts[0].ids), {}, prompts)

    @contextlib.asynccontextmanager
    async def _request(self, ctx: CallContext) -> AsyncIterator[None]:
        """Admits a request; one with an idempotency key first waits for an earlier try of it."""
        if not ctx.request_key:
            with self._admitted(ctx.session_id):
                yield
            return
        async with self._requests.hold((ctx.session_id, ctx.request_key)):
            with self._admitted(ctx.session_id):
                yield

    async def _serve(self, ctx: CallContext, state: SessionState, prompts: Sequence[BuiltPrompt],
                     budgets: Sequence[int], sampling: EngineSampling, n: int, model: str, finish: _Finish,
                     entry: _Entry) -> tuple[list[BuiltPrompt], list[Reply]]:
        """Samples, records and remembers the request's calls; a retried request gets what it got before."""
        stored = [c for c in self.store.calls(ctx.session_id, ctx.request_key) if isinstance(c.event, LLMCall)
                  ] if ctx.request_key else []
        if len(stored) == len(prompts):
            return await self._replay(ctx, state, prompts, stored, finish)
        calls = await self._dispatch(ctx, prompts, budgets, sampling, n)
        replies = [finish(call_id, call) for call_id, call in calls]
        entries = [entry(i, p, r) for i, (p, r) in enumerate(zip(prompts, replies, strict=True))]
        await self._record(ctx, state, prompts, replies, model, entries)
        for prompt, reply, kept in zip(prompts, replies, entries, strict=True):
            self.tito.restore(state, kept, reply.call_id, prompt.ids, reply.call.output_ids)
        return list(prompts), replies

    async def _replay(self, ctx: CallContext, state: SessionState, prompts: Sequence[BuiltPrompt],
                      stored: list[StoredCall], finish: _Finish) -> tuple[list[BuiltPrompt], list[Reply]]:
        if not all(c.acked for c in stored):
            await self._republish(state, ctx.request_key,
                                  [c.event for c in self.store.calls(ctx.session_id, ctx.request_key)])
        self.requests_replayed += 1
        served, replies = [], []
        for built, kept in zip(prompts, stored, strict=True):
            call = kept.event
            assert isinstance(call, LLMCall)
            served.append(dataclasses.replace(built, ids=list(call.prompt_ids), parent_call_id=call.parent_call_id,
                                              drift=call.drift))
            reply = finish(call.call_id, StitchedCall(
                list(call.prompt_ids), len(call.output_ids), list(call.output_ids), list(call.output_logprobs),
                list(call.output_versions), list(call.segments), call.finish_reason))
            reply.turn = call.turn
            replies.append(reply)
            if kept.tito is not None:
                self.tito.restore(state, kept.tito, call.call_id, list(call.prompt_ids), list(call.output_ids))
        logger.info("retried request answered with its recorded calls",
                    extra={"session": ctx.session_id, "calls": len(replies)})
        return served, replies

    async def _republish(self, state: SessionState, request_key: str, events: Sequence[Event]) -> None:
        """Events stored before a crash, maybe never acknowledged: published again (same ids: one copy)."""
        await self.recorder.record(events)
        state.started_recorded = state.started_recorded or any(isinstance(e, SessionStarted) for e in events)
        self.store.acked(state, request_key, self.config.calls_cached_per_session)
        self.events_republished += len(events)

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

    async def _dispatch(self, ctx: CallContext, prompts: Sequence[BuiltPrompt], budgets: Sequence[int],
                        sampling: EngineSampling, n: int) -> list[tuple[str, StitchedCall]]:
        """Runs every choice on the engines; if one fails the others are cancelled (and aborted)."""
        deadline = ctx.started + self.config.long_request_timeout_s
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
                      replies: list[Reply], model: str, entries: Sequence[dict[str, Any]]) -> None:
        """Stores the calls (and SessionStarted once), publishes them and waits for Kafka; only then are
        they served. The store counts them first: a crash before the acknowledgement leaves them to be
        published again (see `session_store`), never a `num_calls` lower than the log."""
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
        drifted = sum(1 for p in prompts if p.drift)
        key = ctx.request_key or f"auto-{uuid.uuid4().hex}"
        state.calls_served += len(replies)
        state.drift_calls += drifted
        try:
            self.store.begin_calls(state, key, events, [None] * (len(events) - len(replies)) + list(entries))
        except BaseException:
            self._unserved(state, first_turn, len(replies), drifted)
            raise
        try:
            await self.recorder.record(events)
        except BaseException:
            self._unserved(state, first_turn, len(replies), drifted)
            self.store.abandon_calls(state, key)
            raise
        state.started_recorded = True
        self.store.acked(state, key, self.config.calls_cached_per_session)
        self.drift_by_agent[ctx.agent_id] += drifted
        self.calls_by_agent[ctx.agent_id] += len(replies)
        self.calls_served += len(replies)

    @staticmethod
    def _unserved(state: SessionState, first_turn: int, calls: int, drifted: int) -> None:
        """Takes back the counts of calls that were not served."""
        if state.next_turn == first_turn + calls:
            state.next_turn = first_turn  # no later call took a turn: reuse the numbers
        state.calls_served -= calls
        state.drift_calls -= drifted

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
        call reached this proxy (it was down) is still ended in its task group, which can then complete.

        A repeated end (the same reward and status: a client retry) gets the first answer."""
        request = {"reward": reward, "status": status}
        async with self._closing.hold(session_id):
            state = self._owned(agent_id, session_id)
            if state is None:  # never called here: end it anyway (no call)
                state, _ = self.sessions.get_or_create(session_id, lambda: SessionState(session_id, agent_id))
            if state.phase != "open":
                return await self._closed_answer(state, "end", request)
            state.task_id = state.task_id or task_id
            state.group_id = state.group_id or group_id
            if reward is not None:
                return await self._close(state, "end", request, reward, SessionStatus(status))
            state.phase = "awaiting_reward"
            state.metadata["pending_status"] = status
            await self._wait_idle(session_id)
            answer = self._session_view(state)
            self.store.save_close(state, "end", request, answer)
            return answer

    async def report_reward(self, agent_id: str, session_id: str, reward: float, status: str | None) -> dict[str, Any]:
        request = {"reward": reward, "status": status}
        async with self._closing.hold(session_id):
            state = self._owned(agent_id, session_id)
            if state is None:
                raise UnknownSessionError(f"session {session_id!r} is not known here (never opened, or forgotten)")
            if state.phase in ("ending", "ended"):
                return await self._closed_answer(state, "reward", request)
            chosen = status or state.metadata.get("pending_status", "completed")
            return await self._close(state, "reward", request, reward, SessionStatus(chosen))

    async def _closed_answer(self, state: SessionState, via: str, request: dict[str, Any]) -> dict[str, Any]:
        """A session already closing or closed: the same request again gets its answer, another one 409."""
        if state.phase == "ending":  # a close a crash interrupted (it holds no lock: we hold it)
            await self._finish_close(state)
        record = self.store.close_record(state.session_id, via)
        if record is not None and record.answer is not None and {k: record.request.get(k) for k in request} == request:
            return record.answer
        if via == "reward":
            raise SessionClosedError(f"session {state.session_id!r} already has its reward ({state.reward})")
        raise SessionClosedError(f"session {state.session_id!r} has already ended ({state.phase})")

    async def _close(self, state: SessionState, via: str, request: dict[str, Any], reward: float,
                     status: SessionStatus) -> dict[str, Any]:
        """Publishes the one SessionEnded of the session (the caller holds its close lock).

        The close is stored (no answer yet) before it is published, so that a crash in between is
        finished when the proxy is back (`recover`)."""
        previous = state.phase
        state.phase = "ending"  # no new calls while we wait for those in flight
        stored = request | {"chosen_status": status.value}
        try:
            self.store.save_close(state, via, stored, None)
            await self._wait_idle(state.session_id)
            await self.recorder.record([session_ended(state, reward, status, self.config.instance_id)])
        except BaseException:
            state.phase = previous
            self.store.drop_close(state, via)
            raise
        return self._ended(state, via, stored, reward, status)

    def _ended(self, state: SessionState, via: str, stored: dict[str, Any], reward: float,
               status: SessionStatus) -> dict[str, Any]:
        state.phase, state.reward = "ended", reward
        state.metadata.pop("pending_status", None)
        answer = self._session_view(state) | {"status": status.value}
        self.store.save_close(state, via, stored, answer)
        return answer

    async def _finish_close(self, state: SessionState) -> None:
        """A close a crash interrupted: its calls and its SessionEnded are published now (it stays
        `ending` if Kafka refuses, for the next try)."""
        for (session_id, key), events in self.store.unacked().items():
            if session_id == state.session_id:
                await self._republish(state, key, events)
        record = self.store.unfinished_close(state.session_id)
        stored = record.request if record is not None else {"reward": 0.0, "status": None, "chosen_status": "failed"}
        reward, status = float(stored.get("reward") or 0.0), SessionStatus(str(stored.get("chosen_status") or "failed"))
        await self.recorder.record([session_ended(state, reward, status, self.config.instance_id)])
        self._ended(state, record.via if record is not None else "end", stored, reward, status)
        logger.info("session end interrupted by a restart finished", extra={"session": state.session_id})

    async def recover(self) -> None:
        """Publishes what a crash left unacknowledged (calls, then interrupted ends). Safe to call again."""
        for (session_id, key), events in self.store.unacked().items():
            state = self._cached(session_id)
            if state is None:
                continue
            await self._republish(state, key, events)
        for session_id in self.store.session_ids(("ending",)):
            async with self._closing.hold(session_id):
                state = self._cached(session_id)
                if state is not None and state.phase == "ending":
                    await self._finish_close(state)

    async def maintain(self) -> None:
        """One round of housekeeping (the app runs it at start and every 30 s): recovery, cache and store
        expiry. A Kafka still down leaves the recovery to the next round."""
        try:
            await self.recover()
        except ProxyError as e:
            logger.warning("recovery of stored events postponed: %s", e)
        self.sessions.sweep()
        try:
            self.store.prune(self.config.session_ttl_s)
        except ProxyError as e:
            logger.warning("session store pruning failed: %s", e)

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
            ended = sum(await asyncio.gather(*(
                self._abort(sid) for sid in self.store.session_ids(("open", "awaiting_reward")))))
        return {"draining": self.draining, "inflight": self.inflight, "sessions_ended": ended}

    async def _abort(self, session_id: str) -> int:
        async with self._closing.hold(session_id):
            state = self._cached(session_id)
            if state is None or state.phase not in ("open", "awaiting_reward"):
                return 0
            await self._close(state, "drain", {"reward": 0.0, "status": "aborted"}, 0.0, SessionStatus.ABORTED)
            return 1

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
                "restored_from_store": self.sessions_restored,
            },
            "idempotency": {
                "requests_replayed": self.requests_replayed,
                "events_republished": self.events_republished,
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
