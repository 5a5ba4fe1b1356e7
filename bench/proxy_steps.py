"""The capture proxy's drift-proof steps of a chat call, timed in process: what no server, profiler or
machine load adds.

`bench/adapter_bench.py` measures the proxy's CPU per call as a process (server, engine request, store,
Kafka and everything else) beside a floor server (`bench/proxy_floor.py`) that does the I/O and none of
the steps below; its cProfile view inflates every small Python function several times over. This bench
runs the steps themselves with the proxy's own objects on the bench's back-to-back conversation (50
turns of one session, WORDS as in `adapter_bench`, a one-token reply per turn), each step timed with
`time.thread_time` around it, per call:

  validate  the body parsed and checked (`http_requests.validate_body`) and the messages converted for the
            template (`ChatMessage.for_template`);
  prompt    token-in/token-out: the served prefix found by the messages' hash chain, the new messages
            rendered after the served reply and tokenized (`TitoBuilder.chat_prompt`);
  remember  the served call kept for the next turn (`TitoBuilder.remember_chat`);
  event     the `LLMCall` built and Avro-encoded (`recording.llm_call`, `schemas.events.encode_event`).

Baseline, same run and conversation: what a proxy without token-in/token-out does for the prompt: the
whole conversation rendered by the chat template and tokenized on every turn (`ChatCodec.render` +
`encode`), which also re-tokenizes what the model generated (the drift this project exists to avoid).

    .venv/bin/python bench/proxy_steps.py [--turns 50] [--rounds 4]

Final line: `ratio prompt step vs full re-render: X.XXx` (below 1: token-in/token-out is cheaper).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agents_adapter.proxy.chat_codec import ChatCodec  # noqa: E402
from agents_adapter.proxy.config import AdapterConfig  # noqa: E402
from agents_adapter.proxy.http_requests import validate_body  # noqa: E402
from agents_adapter.proxy.openai_models import ChatCompletionRequest  # noqa: E402
from agents_adapter.proxy.recording import llm_call  # noqa: E402
from agents_adapter.proxy.session_cache import SessionState  # noqa: E402
from agents_adapter.proxy.stitching import StitchedCall  # noqa: E402
from agents_adapter.proxy.tito import TitoBuilder, new_call_id  # noqa: E402
from inference_svc.default_model import create_default_model  # noqa: E402
from schemas.events import encode_event  # noqa: E402

WORDS = ("alpha", "beta", "gamma", "delta", "sum", "of", "twelve", "and", "seven", "please", "compute", "then")
STEPS = ("validate", "prompt", "remember", "event")


def measure_steps(codec: ChatCodec, config: AdapterConfig, turns: int, rounds: int, seed: int = 0,
                  ) -> tuple[dict[str, float], int]:
    """CPU ms per call of each step (and of the baseline, "full re-render") over the calls of `rounds` sessions
    of `turns` turns after a first, unmeasured one (warm caches); and the number of calls. The proxy's
    limits are `config`'s; a session ends where its prompt leaves no room for the reply in the model's context,
    as the proxy refuses it there and `adapter_bench`'s session ends."""
    tito = TitoBuilder(codec, config.calls_cached_per_session)
    context_tokens, limits = config.context_tokens(), config.body_limits()
    rng = random.Random(seed)
    spent: defaultdict[str, float] = defaultdict(float)
    calls = 0
    for session in range(rounds + 1):
        state = SessionState(session_id=f"bench-{session}", agent_id="bench")
        messages: list[dict[str, str]] = []
        for turn in range(turns):
            messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(4, 12)))})
            body = json.dumps({"model": "bench", "messages": messages, "max_tokens": 1}).encode()
            marks = [time.thread_time()]
            request = validate_body(body, ChatCompletionRequest, config.max_json_depth, limits)
            for_template = [m.for_template() for m in request.messages]
            marks.append(time.thread_time())
            prompt = tito.chat_prompt(state, for_template, None)
            marks.append(time.thread_time())
            if len(prompt.ids) >= context_tokens:
                break
            output = codec.encode(rng.choice(WORDS))[:1]
            reply = {"role": "assistant", "content": codec.decode(output)}
            tito.remember_chat(state, prompt, reply, new_call_id(), output)
            state.calls_served += 1
            marks.append(time.thread_time())
            call = StitchedCall(prompt_ids=prompt.ids, max_new_tokens=1, output_ids=list(output),
                                logprobs=[0.0] * len(output), versions=[0] * len(output), finish_reason="length")
            encode_event(llm_call(call_id=new_call_id(), state=state, model="bench", turn=turn, call=call,
                                  request_ms=0, completed_ms=0, drift=prompt.drift,
                                  parent_call_id=prompt.parent_call_id, producer="bench"))
            marks.append(time.thread_time())
            full = codec.encode(codec.render(for_template))
            marks.append(time.thread_time())
            messages.append(reply)
            if full != prompt.ids:
                raise SystemExit(f"turn {turn}: the token-in/token-out prompt differs from the full render")
            if session == 0:
                continue  # the warm-up session
            calls += 1
            for name, (start, end) in zip((*STEPS, "full re-render"), pairwise(marks), strict=True):
                spent[name] += end - start
    return {name: seconds / max(1, calls) * 1000 for name, seconds in spent.items()}, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50, help="turns of each session (adapter_bench's back to back)")
    parser.add_argument("--rounds", type=int, default=4, help="measured sessions (after one warm-up session)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        model = create_default_model(Path(work) / "model")
        codec = ChatCodec.from_model_dir(model)
        per_call, calls = measure_steps(codec, AdapterConfig(model_path=model), args.turns, args.rounds)
    print(f"proxy steps of a chat call, in process ({calls} calls, sessions of up to {args.turns} turns, thread CPU)")
    print(f"{'step':<16}{'ms/call':>9}")
    for name in STEPS:
        print(f"{name:<16}{per_call[name]:>9.3f}")
    print(f"{'all four':<16}{sum(per_call[n] for n in STEPS):>9.3f}")
    print(f"{'baseline: full re-render':<26}{per_call['full re-render']:>9.3f}  (template + tokenizer over the "
          "whole conversation)")
    print(f"ratio prompt step vs full re-render: {per_call['prompt'] / per_call['full re-render']:.2f}x")


if __name__ == "__main__":
    main()
