"""The capture proxy's call serving, without HTTP: prompts, dispatch, recording, replies.

One served call = one engine-stitched output = one LLMCall event, acknowledged by Kafka before the
reply leaves (`Recorder`). A request with `n` choices (or a batch of text prompts) is several calls,
recorded together: either all of them are served or none is.

Sessions (owner, phase, ends, the durable store) are kept by `session_book`; this module serves calls.

Idempotent requests: a call retried with the same `Idempotency-Key` (the SDK sends one per logical
call and keeps it across its retries) gets the calls its first try recorded, published again if Kafka
had not acknowledged them, never a second sampling (which would be a second branch in the session's
tree). A retry arriving while the first try is still being served waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agents_adapter.errors import InvalidParameterError, PromptTooLongError, UnknownModelError
from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.config import AdapterConfig
from agents_adapter.proxy.constraints import Constraints
from agents_adapter.proxy.dispatch import Dispatcher, EngineSampling, now_ms
from agents_adapter.proxy.openai_models import (
    ChatCompletionRequest,
    CompletionRequest,
    TokenGenerateRequest,
    _Sampling,
    unsupported,
)
from agents_adapter.proxy.outputs import Reply, chat_logprobs, completion_logprobs, finish_reply
from agents_adapter.proxy.recording import Recorder, llm_call, on_the_wire, session_started
from agents_adapter.proxy.routing import RoutingTable
from agents_adapter.proxy.session_book import KeyedLocks, SessionBook
from agents_adapter.proxy.session_cache import SessionState
from agents_adapter.proxy.session_store import StoredCall
from agents_adapter.proxy.stitching import StitchedCall
from agents_adapter.proxy.tito import BuiltPrompt, TitoBuilder, drift_classes_by_agent, new_call_id
from schemas.events import Event, LLMCall

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallContext:
    """Who calls and in which session, from the key, the headers and the body."""

    agent_id: str
    session_id: str
    task_id: str = ""
    group_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    request_key: str = ""  # the client's Idempotency-Key ('' = none: the request is not deduplicated)
    body_bytes: int = 0  # the request body's size: a bound on what its prompt costs to build
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


# What finishes a call into the reply its request shape shows, and its token-in/token-out entry.
_Finish = Callable[[str, StitchedCall], Reply]
_Entry = Callable[[int, BuiltPrompt, Reply], dict[str, Any]]
_Built = TypeVar("_Built")


class AdapterService:
    """Serves the three call shapes; the sessions they go to are the `book`'s."""

    def __init__(self, config: AdapterConfig, codec: ChatCodec, routing: RoutingTable, dispatcher: Dispatcher,
                 recorder: Recorder) -> None:
        self.config = config
        self.codec = codec
        self.routing = routing
        self.dispatcher = dispatcher
        self.recorder = recorder
        self.tito = TitoBuilder(codec, config.calls_cached_per_session)
        self.constraints = Constraints(codec)
        self.book = SessionBook(config, self.tito, routing, recorder)
        self._requests = KeyedLocks()  # (session, idempotency key): a retry waits for its first try
        self.context_tokens = config.context_tokens()
        self.calls_served = 0
        self.requests_failed: Counter[str] = Counter()
        self.drift_by_agent: Counter[str] = Counter()
        self.calls_by_agent: Counter[str] = Counter()
        self.drift_classes: Counter[tuple[str, str]] = Counter()  # (agent, tito drift class) -> calls
        self.requests_replayed = 0
        # the proxy's own share of a call's latency (the app points it at a Prometheus histogram)
        self.observe_added_latency: Callable[[float], None] = lambda _seconds: None

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
        grammar = self.constraints.grammar(tools, req.tool_choice, req.parallel_tool_calls, req.response_format)
        sampling = dataclasses.replace(self._sampling(req), json_schema=grammar.json_schema, ebnf=grammar.ebnf)
        async with self._request(ctx) as state:
            prompt = await _built(ctx.body_bytes, lambda: self.tito.chat_prompt(state, messages, tools))
            max_new = self._budget(len(prompt.ids), req.max_new(), "max_tokens")
            prompts, replies = await self._serve(
                ctx, state, [prompt] * req.n, [max_new] * req.n, sampling, req.n, req.model,
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
        async with self._request(ctx) as state:
            built = await _built(ctx.body_bytes, lambda: [
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
        req.check_supported()
        async with self._request(ctx) as state:
            prompt = self.tito.token_prompt(state, req.input_ids)
            max_new = self._budget(len(prompt.ids), params.max_new_tokens, "sampling_params.max_new_tokens",
                                   allow_zero=True)
            sampling = EngineSampling(
                temperature=1.0 if params.temperature is None else params.temperature,
                top_p=1.0 if params.top_p is None else params.top_p,
                top_k=-1 if params.top_k is None else params.top_k,
                seed=params.sampling_seed if params.sampling_seed is not None else params.seed,
                stop_token_ids=tuple(params.stop_token_ids or ()), ignore_eos=params.ignore_eos,
                json_schema=params.json_schema, regex=params.regex, ebnf=params.ebnf,
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
    async def _request(self, ctx: CallContext) -> AsyncIterator[SessionState]:
        """Admits a request into its session; one with an idempotency key first waits for an earlier try."""
        async with contextlib.AsyncExitStack() as stack:
            if ctx.request_key:
                await stack.enter_async_context(self._requests.hold((ctx.session_id, ctx.request_key)))
            stack.enter_context(self.book.admitted(ctx.session_id))
            yield self.book.open_for_call(ctx.session_id, ctx.agent_id, ctx.task_id, ctx.group_id, ctx.metadata)

    async def _serve(self, ctx: CallContext, state: SessionState, prompts: Sequence[BuiltPrompt],
                     budgets: Sequence[int], sampling: EngineSampling, n: int, model: str, finish: _Finish,
                     entry: _Entry) -> tuple[list[BuiltPrompt], list[Reply]]:
        """Samples, records and remembers the request's calls; a retried request gets what it got before."""
        stored = [c for c in self.book.store.calls(ctx.session_id, ctx.request_key) if isinstance(c.event, LLMCall)
                  ] if ctx.request_key else []
        if len(stored) == len(prompts):
            return await self._replay(ctx, state, prompts, stored, finish)
        dispatched = time.monotonic()
        calls = await self._dispatch(ctx, prompts, budgets, sampling, n)
        on_engines = time.monotonic() - dispatched
        replies = [finish(call_id, call) for call_id, call in calls]
        entries = [entry(i, p, r) for i, (p, r) in enumerate(zip(prompts, replies, strict=True))]
        recorded = await self._record(ctx, state, prompts, replies, model, entries)
        for call, kept in zip(recorded, entries, strict=True):  # the events' packed ids: no list to convert again
            self.tito.restore(state, kept, call.call_id, call.prompt_ids, call.output_ids, call.parent_call_id)
        self.observe_added_latency(time.monotonic() - ctx.started - on_engines)
        return list(prompts), replies

    async def _replay(self, ctx: CallContext, state: SessionState, prompts: Sequence[BuiltPrompt],
                      stored: list[StoredCall], finish: _Finish) -> tuple[list[BuiltPrompt], list[Reply]]:
        if not all(c.acked for c in stored):
            await self.book.republish(state, ctx.request_key)
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
                self.tito.restore(state, kept.tito, call.call_id, list(call.prompt_ids), list(call.output_ids),
                                  call.parent_call_id)
        logger.info("retried request answered with its recorded calls",
                    extra={"session": ctx.session_id, "calls": len(replies)})
        return served, replies

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
                        sampling.for_choice(i % n), deadline,
                    ))
                    for i, (call_id, prompt, budget) in enumerate(zip(call_ids, prompts, budgets, strict=True))
                ]
        except BaseExceptionGroup as group_error:
            raise group_error.exceptions[0] from None
        return [(call_id, task.result()) for call_id, task in zip(call_ids, tasks, strict=True)]

    async def _record(self, ctx: CallContext, state: SessionState, prompts: Sequence[BuiltPrompt],
                      replies: list[Reply], model: str, entries: Sequence[dict[str, Any]]) -> list[LLMCall]:
        """Stores the calls (and SessionStarted once), publishes them and waits for Kafka; only then are
        they served (returned: the replies' LLMCall events). The store counts them first: a crash before
        the acknowledgement leaves them to be published again (see `session_store`), never a `num_calls`
        lower than the log."""
        producer = self.config.instance_id
        first_turn = state.next_turn
        state.next_turn += len(replies)
        completed = now_ms()
        calls: list[LLMCall] = []
        for i, (prompt, reply) in enumerate(zip(prompts, replies, strict=True)):
            reply.turn = first_turn + i
            calls.append(llm_call(
                call_id=reply.call_id, state=state, model=model, turn=reply.turn, call=reply.call,
                request_ms=ctx.request_ms, completed_ms=completed, drift=prompt.drift,
                parent_call_id=prompt.parent_call_id, producer=producer,
            ))
        events: list[Event] = [*([] if state.started_recorded else [session_started(state, producer)]), *calls]
        drifted = sum(1 for p in prompts if p.drift)
        key = ctx.request_key or f"auto-{uuid.uuid4().hex}"
        state.calls_served += len(replies)
        state.drift_calls += drifted
        async with self.book.publishing(state.session_id, key):
            try:
                encoded = self.book.store.begin_calls(state, key, events,
                                                      [None] * (len(events) - len(replies)) + list(entries))
            except BaseException:
                self._unserved(state, first_turn, len(replies), drifted)
                raise
            try:
                await self.recorder.record(events, on_the_wire(events, encoded, prompts, state))
            except BaseException:
                self._unserved(state, first_turn, len(replies), drifted)
                self.book.store.abandon_calls(state, key)
                raise
            state.started_recorded = True
            self.book.store.acked(state, key, self.config.calls_cached_per_session)
        self.drift_by_agent[ctx.agent_id] += drifted
        self.calls_by_agent[ctx.agent_id] += len(replies)
        self.drift_classes.update((ctx.agent_id, p.drift_class) for p in prompts if p.drift_class)
        self.calls_served += len(replies)
        return calls

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
            # the weight versions each reply's tokens came from (what an evaluation is tagged with)
            "weight_versions": [sorted({int(v) for v in r.call.versions}) for r in replies],
        }
        return Served(f"{kind}-{uuid.uuid4().hex}", ctx.session_id, replies, prompt_tokens, logprobs, extra)

    def stats(self) -> dict[str, Any]:
        book = self.book
        return {
            "calls_served": self.calls_served,
            "inflight": book.inflight,
            "draining": book.draining,
            "requests_failed": dict(self.requests_failed),
            "calls_by_agent": dict(self.calls_by_agent),
            "drift_by_agent": dict(self.drift_by_agent),
            "drift_classes_by_agent": drift_classes_by_agent(self.drift_classes),
            "sessions": book.stats(),
            "idempotency": {
                "requests_replayed": self.requests_replayed,
                "events_republished": book.events_republished,
                "events_found_on_log": book.events_found_on_log,
            },
            "dispatch": {"resumed_calls": self.dispatcher.resumed_calls,
                         "engine_failures": self.dispatcher.engine_failures},
            "recording": {"events_recorded": self.recorder.recorded, "events_failed": self.recorder.failed,
                          "events_awaiting_ack": self.recorder.awaiting},
            "routing": self.routing.snapshot(),
            "routing_events_applied": self.routing.events_applied,
        }


#: Prompts of request bodies up to this size are templated and tokenized on the event loop: a worker thread's
#: round trip (two thread switches, the loop woken through its pipe) costs more CPU than they do. Larger
#: ones go to a worker thread: a 10 MB prompt must not stall every other agent. A translated request (Responses,
#: Messages) has its body's size; a context without one (0) is built on the loop.
_BUILD_INLINE_BYTES = 16 * 1024


async def _built(body_bytes: int, build: Callable[[], _Built]) -> _Built:
    """`build()`, on the event loop for a body up to `_BUILD_INLINE_BYTES`, else on a worker thread."""
    return build() if body_bytes <= _BUILD_INLINE_BYTES else await asyncio.to_thread(build)
