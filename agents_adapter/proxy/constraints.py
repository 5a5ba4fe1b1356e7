"""What a request forces the reply to be, as a grammar the engine decodes under (constrained decoding).

- A forced tool call (chat `tool_choice: "required"` or `{"type": "function", "function": {"name"}}`;
  Anthropic's `{"type": "any"}` / `{"type": "tool", "name"}` and the Responses API's forms are translated
  to these) becomes an `ebnf` grammar (llguidance's Lark) of the chat template's own tool-call block:
  for the default template `<tool_call>\\n{"name": "<one of the tools>", "arguments": <that tool's
  parameters schema>}\\n</tool_call>`, several of them when `parallel_tool_calls` is not false.
- `response_format` `json_schema` / `json_object` becomes `json_schema` (SGLang's field as it is).

The tool-call block is not written here by hand: it is probed from the template (`ToolCallSyntax.probe`),
by rendering an assistant turn that calls a probe tool and cutting the text around the probe's name and
arguments, so the grammar is the syntax the template renders and the proxy parses (`outputs`), for every
template whose calls have the form text + name + text + arguments + text. Special tokens in that text
(`<tool_call>` is one in the default tokenizer) are required as the special token, as the template
tokenizes them, not as their characters.

A tool's parameters schema is taken as closed (`additionalProperties: false` unless it says otherwise,
as OpenAI's strict mode does) and its JSON compact (`, ` and `: `, as `json.dumps` writes it, which is how
the arguments come back in the next prompt); keywords the grammar library does not implement are
ignored (`lenient`), since frameworks send schema dialects of their own (smolagents: `nullable`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agents_adapter.errors import InvalidParameterError, TemplateError
from agents_adapter.proxy.chat_codec import ChatCodec

_PROBE_NAMES: Final = ("probe_tool_one", "probe_tool_two")
_PROBE_ARGS: Final = ('{"probe_arg": "PROBE-ARGS-ONE"}', '{"probe_arg": "PROBE-ARGS-TWO"}')
_PROBE_USER: Final = "PROBE-USER"
#: llguidance's options for the arguments of a tool call (see the module doc).
_ARGUMENTS_JSON: Final[dict[str, Any]] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                          "lenient": True}


@dataclass(frozen=True)
class ToolCallSyntax:
    """An assistant tool call as the template writes it: prefix + name + middle + arguments + suffix;
    a further call of the same turn starts with `next_prefix` instead (None: the template writes one call
    per turn; Qwen3's writes its empty think block before the first call only)."""

    prefix: str
    middle: str
    suffix: str
    next_prefix: str | None

    @classmethod
    def probe(cls, codec: ChatCodec) -> ToolCallSyntax:
        """Raises `TemplateError` (saying what to change) when the template's calls cannot be cut so."""
        one = _assistant_text(codec, 1)
        pieces = _cut(one, 0)
        if pieces is None:
            raise TemplateError(
                "the chat template does not write a tool call as text + name + text + arguments + text "
                f"(probe rendered {one!r}): forced tool calls need a template that writes the call's name and then "
                "its arguments as one JSON object (the string as given, or the mapping as json.dumps writes it)"
            )
        prefix, middle, suffix = pieces
        try:
            two = _assistant_text(codec, 2)
        except Exception:  # the template refuses two calls in a turn (Llama 3's raises): one call per reply
            return cls(prefix, middle, suffix, None)
        first = prefix + _PROBE_NAMES[0] + middle + _PROBE_ARGS[0] + suffix
        second = _cut(two[len(first) :], 1) if two.startswith(first) else None
        if second is None or second[1:] != (middle, suffix):
            return cls(prefix, middle, suffix, None)
        return cls(prefix, middle, suffix, second[0])

    def lark(self, tools: Sequence[Mapping[str, Any]], parallel: bool, special_tokens: Sequence[str]) -> str:
        """The Lark grammar of a reply that is one call (or several, `parallel`) of one of `tools`."""
        def seq(*parts: str) -> str:
            return " ".join(p for p in parts if p)

        def literal(text: str) -> str:
            return _lark_literal(text, special_tokens)

        choices = f"({' | '.join(f'fn_{i}' for i in range(len(tools)))})"
        lines = ["start: " + seq(literal(self.prefix), choices, literal(self.suffix),
                                 "next_call*" if parallel and self.next_prefix is not None else "")]
        if parallel and self.next_prefix is not None:
            lines.append("next_call: " + seq(literal(self.next_prefix), choices, literal(self.suffix)))
        for i, tool in enumerate(tools):
            lines.append(f"fn_{i}: " + seq(literal(tool["name"]), literal(self.middle), f"args_{i}"))
            lines.append(f"args_{i}: %json {json.dumps(arguments_schema(tool.get('parameters')))}")
        return "\n".join(lines) + "\n"


def arguments_schema(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    schema: dict[str, Any] = dict(parameters) if parameters else {"type": "object", "properties": {}}
    schema.setdefault("additionalProperties", False)
    schema["x-guidance"] = {**_ARGUMENTS_JSON, **schema.get("x-guidance", {})}
    return schema


def _assistant_text(codec: ChatCodec, calls: int) -> str:
    """The text the template writes for an assistant turn with `calls` probe calls and no content."""
    tools = [{"type": "function", "function": {"name": n, "description": "probe",
                                               "parameters": {"type": "object", "properties": {
                                                   "probe_arg": {"type": "string"}}}}} for n in _PROBE_NAMES]
    tool_calls = [{"id": f"call_probe_{i}", "type": "function",
                   "function": {"name": _PROBE_NAMES[i], "arguments": _PROBE_ARGS[i]}} for i in range(calls)]
    user = [{"role": "user", "content": _PROBE_USER}]
    head = codec.render(user, tools, add_generation_prompt=True)
    full = codec.render([*user, {"role": "assistant", "content": "", "tool_calls": tool_calls}], tools,
                        add_generation_prompt=False)
    close = codec.convention.turn_close
    if not full.startswith(head) or not full.endswith(close):
        raise TemplateError(f"the assistant turn does not follow its generation prompt: {full!r}")
    return full[len(head) : len(full) - len(close)]


def _cut(text: str, i: int) -> tuple[str, str, str] | None:
    name, args = _PROBE_NAMES[i], _PROBE_ARGS[i]
    at_name = text.find(name)
    at_args = text.find(args, at_name + len(name)) if at_name >= 0 else -1
    if at_args < 0:
        return None
    return text[:at_name], text[at_name + len(name) : at_args], text[at_args + len(args) :]


def _lark_literal(text: str, special_tokens: Sequence[str]) -> str:
    """`text` as a Lark sequence: its special tokens as tokens (`<|im_end|>` syntax), the rest as strings."""
    specials = sorted((t for t in special_tokens if t and t in text), key=len, reverse=True)
    parts = re.split(f"({'|'.join(map(re.escape, specials))})", text) if specials else [text]
    return " ".join(part if part in specials else json.dumps(part, ensure_ascii=False) for part in parts if part)


# ------------------------------------------------------------------------------ what a request forces


def forced_tools(tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The tools a chat request forces the reply to call (None: it forces none). `tools` are chat tools
    ({"type": "function", "function": {...}}); returns their function definitions."""
    if tool_choice in (None, "auto", "none"):
        return None
    functions = [dict(t["function"]) for t in tools or ()]
    if not functions:
        raise InvalidParameterError(f"tool_choice={tool_choice!r} needs tools", param="tool_choice")
    if tool_choice == "required":
        return functions
    name = _named_function(tool_choice)
    chosen = [f for f in functions if f["name"] == name]
    if not chosen:
        raise InvalidParameterError(
            f"tool_choice names {name!r}, which is not among the tools ({', '.join(f['name'] for f in functions)})",
            param="tool_choice")
    return chosen


def _named_function(tool_choice: Any) -> str:
    if (isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function"
            and isinstance(tool_choice.get("function"), Mapping)
            and isinstance(tool_choice["function"].get("name"), str)):
        return str(tool_choice["function"]["name"])
    raise InvalidParameterError(
        f"tool_choice={tool_choice!r}: expected 'none', 'auto', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")


def response_schema(response_format: Mapping[str, Any] | None) -> str | None:
    """The JSON Schema (as text) a chat `response_format` asks for; None for text."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind == "json_schema":
        spec = (response_format or {}).get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise InvalidParameterError("response_format.json_schema.schema: a JSON Schema object is required",
                                        param="response_format")
        return json.dumps(schema)
    raise InvalidParameterError(
        f"response_format type {kind!r}: expected 'text', 'json_object' or 'json_schema'", param="response_format")


@dataclass(frozen=True)
class EngineGrammar:
    """The grammar field of the engine request (at most one set; neither: free decoding)."""

    json_schema: str | None = None
    ebnf: str | None = None


class Constraints:
    """Builds the engine grammar of a chat request for one model's template (probed once)."""

    def __init__(self, codec: ChatCodec) -> None:
        self.codec = codec
        self._special_tokens = [codec.decode([int(i)]) for i in getattr(codec.tokenizer, "all_special_ids", ())]
        try:
            self.syntax: ToolCallSyntax | None = ToolCallSyntax.probe(codec)
            self.syntax_problem = ""
        except TemplateError as e:
            self.syntax, self.syntax_problem = None, str(e)

    def grammar(self, tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any, parallel_tool_calls: bool | None,
                response_format: Mapping[str, Any] | None) -> EngineGrammar:
        """The engine's grammar of a chat request (raises `InvalidParameterError`, a 400, for a bad one)."""
        forced = forced_tools(tools, tool_choice)
        schema = response_schema(response_format)
        if forced is None:
            return EngineGrammar(json_schema=schema)
        if schema is not None:
            raise InvalidParameterError(
                "response_format with a forced tool_choice: the reply is a tool call, so it cannot also be the "
                "response_format's JSON; send one of them", param="response_format")
        if self.syntax is None:
            raise InvalidParameterError(f"tool_choice={tool_choice!r} is not served with this model's chat template: "
                                        f"{self.syntax_problem}", param="tool_choice")
        return EngineGrammar(ebnf=self.syntax.lark(forced, parallel_tool_calls is not False, self._special_tokens))
