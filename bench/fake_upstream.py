"""An edge fake of an inference engine for gateway benchmarks: zero compute, a fixed latency, one process
that answers both APIs the gateways call.

- SGLang's native `POST /generate` (token ids in, token ids out; what SeamlessFlow's capture proxy calls),
  with `meta_info.output_token_logprobs`, `weight_version` and `output_token_versions`, as the native engine
  answers (`schemas.inference.protocol`).
- OpenAI `POST /v1/chat/completions` in vLLM's token-id form (what rllm-model-gateway and Agent Lightning's
  proxy call, asking for `return_token_ids` and `logprobs`): `prompt_token_ids` at the root, `token_ids` and
  `logprobs.content` in the choice, the tool calls parsed into `message.tool_calls` as vLLM's hermes parser does.

What it answers is a scripted multi-turn tool session, the same on both APIs: while the conversation holds
fewer than `--tool-turns` tool results the reply is a calculator tool call, then the final answer. Reply
token ids are the served model's tokenizer's (the chat API's prompt ids are the chat template's, rendered
and tokenized here, so every gateway records the ids an engine would have used). Each answer is sent
`--latency-ms` after the request arrived: the gateways in front of it are what is measured, not this.

    .venv/bin/python bench/fake_upstream.py --port P --model-path DIR [--latency-ms 20] [--tool-turns 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Final

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import orjson  # noqa: E402
import uvicorn  # noqa: E402
from proxy_floor import answer_json, request_body  # noqa: E402  (bench/, this directory)

from agents_adapter.proxy.chat_codec import ChatCodec  # noqa: E402
from examples.calculator.tool import CALCULATOR  # noqa: E402

#: The tool call every tool turn makes, and the final answer (the calculator's result of it).
EXPRESSION: Final = "12 + 7"
ANSWER: Final = "19"
TOOL_RESPONSE: Final = "<tool_response>"  # the chat template's marker of one tool result
WEIGHT_VERSION: Final = 3  # the policy version every token is said to come from
LOGPROB: Final = -0.25


class Script:
    """The scripted replies as the model's token ids (ending with its end-of-turn token)."""

    def __init__(self, codec: ChatCodec, tool_turns: int) -> None:
        self.codec, self.tool_turns = codec, tool_turns
        eos = min(codec.eos_token_ids)
        arguments = json.dumps({"expression": EXPRESSION})
        self.tool_call_text = f'<tool_call>\n{{"name": "{CALCULATOR}", "arguments": {arguments}}}\n</tool_call>'
        self.tool_call_ids = [*codec.encode(self.tool_call_text), eos]
        self.answer_ids = [*codec.encode(ANSWER), eos]
        self.arguments = arguments

    def calls_tool(self, tool_results: int) -> bool:
        return tool_results < self.tool_turns


class FakeUpstream:
    """A raw ASGI callable (the cheapest server: what it costs is not what is measured)."""

    def __init__(self, script: Script, latency_s: float) -> None:
        self.script, self.latency_s = script, latency_s
        self.calls = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await request_body(receive)
        path, started = scope["path"], asyncio.get_running_loop().time()
        if scope["method"] == "GET":  # readiness and health probes (/health, /health_generate, /v1/models)
            await answer_json(send, b'{"status":"ok"}')
            return
        request = orjson.loads(body) if body else {}
        if path == "/generate":
            reply = self.generate(request)
        elif path.endswith("/chat/completions"):
            reply = self.chat(request)
        elif path == "/abort_request":
            reply = {"num_aborted": 0}
        else:
            await answer_json(send, b'{"error":{"message":"not found"}}', 404)
            return
        self.calls += 1
        await asyncio.sleep(max(0.0, started + self.latency_s - asyncio.get_running_loop().time()))
        await answer_json(send, orjson.dumps(reply))

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        """SGLang's /generate answer for the prompt ids (its turn read from the tool results it holds)."""
        prompt_ids = request.get("input_ids") or []
        tool_results = self.script.codec.decode(prompt_ids).count(TOOL_RESPONSE)
        ids = self.script.tool_call_ids if self.script.calls_tool(tool_results) else self.script.answer_ids
        return {"text": "", "output_ids": ids, "meta_info": {
            "id": str(request.get("rid") or self.calls), "finish_reason": {"type": "stop", "matched": ids[-1]},
            "prompt_tokens": len(prompt_ids), "completion_tokens": len(ids), "cached_tokens": 0,
            "weight_version": str(WEIGHT_VERSION), "output_token_logprobs": [[LOGPROB, i, None] for i in ids],
            "output_token_versions": [WEIGHT_VERSION] * len(ids)}}

    def chat(self, request: dict[str, Any]) -> dict[str, Any]:
        """vLLM's chat completion with `return_token_ids` (prompt ids from the chat template, as vLLM's)."""
        messages = request.get("messages") or []
        codec, script = self.script.codec, self.script
        prompt_ids = codec.encode(codec.render(messages, request.get("tools")))
        tool_call = script.calls_tool(sum(1 for m in messages if m.get("role") == "tool"))
        ids = script.tool_call_ids if tool_call else script.answer_ids
        message: dict[str, Any] = {"role": "assistant", "content": ANSWER, "tool_calls": []}
        if tool_call:
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"chatcmpl-tool-{self.calls}", "type": "function",
                "function": {"name": CALCULATOR, "arguments": script.arguments}}]}
        logprobs: list[dict[str, Any]] = [
            {"token": f"token_id:{i}", "logprob": LOGPROB, "bytes": None, "top_logprobs": []} for i in ids]
        return {"id": f"chatcmpl-{self.calls}", "object": "chat.completion", "created": 0,
                "model": request.get("model", ""), "prompt_token_ids": prompt_ids,
                "choices": [{"index": 0, "message": message, "logprobs": {"content": logprobs},
                             "finish_reason": "tool_calls" if tool_call else "stop", "stop_reason": None,
                             "token_ids": ids}],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                          "total_tokens": len(prompt_ids) + len(ids)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-path", type=Path, required=True, help="the served model's directory (tokenizer)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="every answer is sent this long after")
    parser.add_argument("--tool-turns", type=int, default=3, help="tool calls per session before the answer")
    args = parser.parse_args()
    app = FakeUpstream(Script(ChatCodec.from_model_dir(args.model_path), args.tool_turns), args.latency_ms / 1000)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                timeout_keep_alive=60)


if __name__ == "__main__":
    main()
