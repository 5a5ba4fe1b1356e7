"""Forced tool calls and response formats as grammars: built from each template's own tool-call syntax,
accepting what the template renders and nothing else, and always giving a parseable call from the
random-weights default model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from llguidance import LLMatcher, LLTokenizer, grammar_from

from agents_adapter.errors import InvalidParameterError
from agents_adapter.proxy.anthropic_api import MessagesRequest
from agents_adapter.proxy.anthropic_api import chat_request as anthropic_chat_request
from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.constraints import Constraints, forced_tools, response_schema
from agents_adapter.proxy.openai_models import BodyLimits
from agents_adapter.proxy.outputs import finish_reply
from agents_adapter.proxy.responses_api import ResponsesRequest
from agents_adapter.proxy.responses_api import chat_request as responses_chat_request
from agents_adapter.proxy.stitching import StitchedCall
from inference_svc.default_model import TEMPLATES, DefaultModelSpec, build_tokenizer, create_default_model
from inference_svc.engine import NativeEngine
from schemas.inference.types import SamplingOptions

pytestmark = pytest.mark.unit

WEATHER_ARGS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "unit"]}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "forecast", "parameters": WEATHER_ARGS}},
    {"type": "function", "function": {"name": "stop_here"}},  # no parameters: {}
]


def codec_of(template: str) -> ChatCodec:
    tokenizer = build_tokenizer("byte", template)
    return ChatCodec(tokenizer, tokenizer.convert_tokens_to_ids(list(TEMPLATES[template].stop)))


def matcher(codec: ChatCodec, lark: str) -> Any:
    import llguidance.hf

    tokenizer: LLTokenizer = llguidance.hf.from_tokenizer(codec.tokenizer, eos_token=sorted(codec.eos_token_ids))
    found = LLMatcher(tokenizer, grammar_from("ebnf", lark), log_level=0)
    assert not found.is_error(), found.get_error()
    return found


def rendered_calls(codec: ChatCodec, calls: list[tuple[str, str]]) -> list[int]:
    """The tokens the template gives an assistant turn calling `calls` (name, arguments), end token included."""
    user = [{"role": "user", "content": "weather?"}]
    head = codec.render(user, TOOLS, add_generation_prompt=True)
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)]}
    full = codec.render([*user, turn], TOOLS, add_generation_prompt=False)
    body = full[len(head) : len(full) - len(codec.convention.turn_close)]
    return [*codec.encode(body), min(codec.eos_token_ids)]


def takes(found: Any, ids: list[int]) -> bool:
    return bool(found.consume_tokens(ids)) and bool(found.is_stopped())


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_the_grammar_takes_what_the_template_renders_and_nothing_else(template: str) -> None:
    codec = codec_of(template)
    constraints = Constraints(codec)
    assert constraints.syntax is not None, constraints.syntax_problem
    lark = constraints.grammar(TOOLS, "required", None, None).ebnf
    assert lark is not None
    good = '{"city": "Paris", "unit": "celsius", "days": 3}'
    assert takes(matcher(codec, lark), rendered_calls(codec, [("get_weather", good)]))
    assert takes(matcher(codec, lark), rendered_calls(codec, [("stop_here", "{}")]))
    for name, arguments in [("get_weather", '{"city": "Paris"}'),  # a required field missing
                            ("get_weather", '{"city": "Paris", "unit": "kelvin"}'),  # not in the enum
                            ("get_weather", '{"city":"Paris","unit":"celsius"}'),  # not compact json.dumps
                            ("stop_here", '{"x": 1}'),  # no parameters: a closed empty object
                            ("delete_all", "{}")]:  # not a tool
        assert not takes(matcher(codec, lark), rendered_calls(codec, [(name, arguments)])), (name, arguments)
    named = constraints.grammar(TOOLS, {"type": "function", "function": {"name": "stop_here"}}, None, None).ebnf
    assert named is not None and not takes(matcher(codec, named), rendered_calls(codec, [("get_weather", good)]))
    if constraints.syntax.next_prefix is not None:  # templates that write several calls in a turn
        two = rendered_calls(codec, [("get_weather", good), ("stop_here", "{}")])
        assert takes(matcher(codec, lark), two)
        single = constraints.grammar(TOOLS, "required", False, None).ebnf
        assert single is not None and not takes(matcher(codec, single), two)


@pytest.fixture(scope="module")
def default_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_default_model(tmp_path_factory.mktemp("default-model"), DefaultModelSpec())


def test_a_forced_call_from_the_random_default_model_always_parses(default_model_dir: Path) -> None:
    codec = ChatCodec.from_model_dir(default_model_dir)
    constraints = Constraints(codec)
    prompt = codec.encode(codec.render([{"role": "user", "content": "weather in Paris?"}], TOOLS,
                                       add_generation_prompt=True))
    choices: list[Any] = ["required", {"type": "function", "function": {"name": "get_weather"}}]
    with NativeEngine(default_model_dir, max_context=2048, seed=0) as engine:
        for seed in range(8):
            choice = choices[seed % 2]
            lark = constraints.grammar(TOOLS, choice, seed % 3 != 0, None).ebnf
            result = engine.generate(prompt, SamplingOptions(max_new_tokens=400, seed=seed, ebnf=lark))
            assert result.finish_reason is not None and result.finish_reason.type == "stop"
            reply = finish_reply(codec, "c", StitchedCall(prompt, 400, result.output_ids, result.output_logprobs,
                                                          result.output_versions, [], "stop"),
                                 stops=(), stop_token_ids=(), parse_tools=True)
            assert reply.tool_calls and reply.finish_reason == "tool_calls" and reply.text == "", reply.text
            for call in reply.tool_calls:
                name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
                assert name in (["get_weather"] if isinstance(choice, dict) else ["get_weather", "stop_here"])
                jsonschema.validate(arguments, WEATHER_ARGS if name == "get_weather" else {"maxProperties": 0})


def test_requests_that_cannot_be_forced_are_refused_by_name() -> None:
    with pytest.raises(InvalidParameterError, match="needs tools"):
        forced_tools(None, "required")
    with pytest.raises(InvalidParameterError, match="not among the tools"):
        forced_tools(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(InvalidParameterError, match="expected"):
        forced_tools(TOOLS, {"type": "allowed_tools"})
    with pytest.raises(InvalidParameterError, match="schema"):
        response_schema({"type": "json_schema", "json_schema": {"name": "x"}})
    with pytest.raises(InvalidParameterError, match="response_format type"):
        response_schema({"type": "grammar"})
    assert response_schema({"type": "json_object"}) == '{"type": "object"}'
    assert forced_tools(TOOLS, "auto") is None and response_schema({"type": "text"}) is None
    constraints = Constraints(codec_of("chatml"))
    with pytest.raises(InvalidParameterError, match="send one of them"):
        constraints.grammar(TOOLS, "required", None, {"type": "json_object"})
    assert constraints.grammar(TOOLS, "auto", None, {"type": "json_schema", "json_schema": {
        "schema": WEATHER_ARGS}}).json_schema == json.dumps(WEATHER_ARGS)


def test_anthropic_and_responses_forms_mean_the_chat_ones() -> None:
    tool = {"name": "get_weather", "input_schema": WEATHER_ARGS}
    base = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "q"}], "tools": [tool]}
    for choice, expected, parallel in [({"type": "any"}, "required", None),
                                       ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
                                        {"type": "function", "function": {"name": "get_weather"}}, False)]:
        chat = anthropic_chat_request(MessagesRequest.model_validate(base | {"tool_choice": choice}), BodyLimits())
        assert (chat.tool_choice, chat.parallel_tool_calls) == (expected, parallel)
    fn = {"type": "function", "name": "get_weather", "parameters": WEATHER_ARGS}
    req = ResponsesRequest.model_validate({"model": "m", "input": "q", "tools": [fn],
                                           "tool_choice": {"type": "function", "name": "get_weather"},
                                           "text": {"format": {"type": "json_schema", "name": "w",
                                                               "schema": WEATHER_ARGS}}})
    chat = responses_chat_request(req, [], [{"role": "user", "content": "q"}], BodyLimits())
    assert chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert chat.response_format == {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER_ARGS}}


def test_a_template_without_a_cuttable_call_says_what_to_change() -> None:
    """A template that writes the arguments as tags of their own (as Qwen3-Coder's does), not as the JSON
    object, has no grammar here: free decoding still serves, a forced call is a 400 naming what to change."""
    tokenizer = build_tokenizer("byte", "chatml")
    raw = "{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    assert raw in tokenizer.chat_template
    tokenizer.chat_template = tokenizer.chat_template.replace(
        raw, "{%- for k, v in fn.arguments.items() -%}<{{ k }}>{{ v }}</{{ k }}>{%- endfor -%}")
    codec = ChatCodec(tokenizer, tokenizer.convert_tokens_to_ids(list(TEMPLATES["chatml"].stop)))
    assert codec.arguments_as_mapping
    constraints = Constraints(codec)
    assert constraints.syntax is None
    with pytest.raises(InvalidParameterError, match="arguments as one JSON object"):
        constraints.grammar(TOOLS, "required", None, None)
    assert constraints.grammar(TOOLS, "auto", None, None).ebnf is None


def test_a_resumed_constrained_run_carries_the_tokens_already_generated() -> None:
    """The dispatcher's engine request: a free one is SGLang's payload as before (no new field), a
    constrained one names its grammar, and a resumed one how many of its input ids the grammar already took."""
    from agents_adapter.proxy.dispatch import EngineSampling
    from schemas.inference.client import generate_payload

    free = generate_payload([1, 2, 3], EngineSampling().params(10, 4))["sampling_params"]
    assert not set(free) & {"json_schema", "regex", "ebnf", "structural_tag", "grammar_prefix_tokens"}
    constrained = EngineSampling(json_schema='{"type": "object"}')
    assert generate_payload([1], constrained.params(10))["sampling_params"]["json_schema"] == '{"type": "object"}'
    assert "grammar_prefix_tokens" not in generate_payload([1], constrained.params(10))["sampling_params"]
    assert constrained.params(6, 4).grammar_prefix_tokens == 4
