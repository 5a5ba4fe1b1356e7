"""The chat formats a model can be created with (Qwen3, Llama 3.1, the project's ChatML) and the
byte-level BPE: rendered exactly as those checkpoints render, probed for token-in/token-out, and a
tokenizer trained the same way on every machine."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.outputs import parse_tool_calls
from agents_adapter.proxy.tokenizer_files import TokenizerFiles
from inference_svc.default_model import TEMPLATES, DefaultModelSpec, build_tokenizer, create_default_model

pytestmark = pytest.mark.unit
TOOL = {"type": "function", "function": {"name": "calculator", "description": "Evaluate.", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'}}
SESSION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    {"role": "assistant", "content": "<think>\nthe tool said 5\n</think>\n\nIt is 5."},
]
QWEN3_TOOLS_HEADER = (
    "<|im_start|>system\nYou are terse.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
    "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOL) + "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)
QWEN3_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Any]:
    return {name: build_tokenizer("bpe", name) for name in TEMPLATES}


def render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return str(tokenizer.apply_chat_template(messages, tools=[TOOL], tokenize=False, **kwargs))


def test_qwen3_format_keeps_reasoning_after_the_last_query_only(tokenizers: dict[str, Any]) -> None:
    qwen = tokenizers["qwen3"]
    assert render(qwen, SESSION) == (
        QWEN3_TOOLS_HEADER + "<|im_start|>user\n2+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nadd\n</think>\n\n" + QWEN3_CALL + "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nthe tool said 5\n</think>\n\nIt is 5.<|im_end|>\n")
    later = render(qwen, [*SESSION, {"role": "user", "content": "thanks"}], add_generation_prompt=True)
    assert later == (  # a new query: the earlier turns' reasoning is dropped, as Qwen3's template does
        QWEN3_TOOLS_HEADER + "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n" + QWEN3_CALL
        + "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nIt is 5.<|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n")
    no_think = qwen.apply_chat_template(SESSION[1:2], tokenize=False, add_generation_prompt=True,
                                        enable_thinking=False)
    assert no_think == "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_llama3_format_with_a_tool_call(tokenizers: dict[str, Any]) -> None:
    llama = tokenizers["llama3"]
    session = [SESSION[0], SESSION[1], {"role": "assistant", "content": None, "tool_calls": [CALL]}, SESSION[3],
               {"role": "assistant", "content": " It is 5.\n"}]
    assert render(llama, session, add_generation_prompt=False) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge "
        "Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for "
        "a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
        '{"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n'
        + json.dumps(TOOL, indent=4) + "\n\n2+3?<|eot_id|>"
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "calculator", "parameters": {"expression": '
        '"2+3"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\nIt is 5.<|eot_id|>")
    with pytest.raises(Exception, match="single tool-calls"):
        render(llama, [SESSION[1], {"role": "assistant", "content": None, "tool_calls": [CALL, CALL]}])


@pytest.mark.parametrize(("template", "close", "generation_prompt", "style"), [
    ("chatml", "<|im_end|>\n", "<|im_start|>assistant\n", "hermes"),
    ("qwen3", "<|im_end|>\n", "<|im_start|>assistant\n", "hermes"),
    ("llama3", "<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>\n\n", "json"),
])
def test_each_format_passes_the_token_in_token_out_probe(tokenizers: dict[str, Any], template: str, close: str,
                                                         generation_prompt: str, style: str) -> None:
    tokenizer = tokenizers[template]
    codec = ChatCodec(tokenizer, [tokenizer.convert_tokens_to_ids(t) for t in TEMPLATES[template].stop])
    assert (codec.convention.turn_close, codec.convention.generation_prompt) == (close, generation_prompt)
    assert codec.tool_call_style == style
    # a tail is rendered without the template's conversation header (Llama 3 writes one before any message)
    assert codec.render_tail([{"role": "tool", "content": "5"}]).count("system") == 0


def test_a_reply_the_template_refuses_as_history_is_served_from_its_ids_and_realigned(
        tokenizers: dict[str, Any]) -> None:
    from agents_adapter.proxy.session_cache import SessionState
    from agents_adapter.proxy.tito import REALIGNED, TitoBuilder

    tokenizer = tokenizers["llama3"]
    codec = ChatCodec(tokenizer, [tokenizer.convert_tokens_to_ids(t) for t in TEMPLATES["llama3"].stop])
    builder, state = TitoBuilder(codec, 8), SessionState("s", "a")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "2+3?"}]
    first = builder.chat_prompt(state, messages, [TOOL])
    output = [*codec.encode("two calls"), tokenizer.eos_token_id]
    served = {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "call_2"}]}
    builder.remember_chat(state, first, served, "c0", output)
    state.calls_served = 1
    messages += [served, {"role": "tool", "content": "5"}, {"role": "tool", "content": "5"}]
    second = builder.chat_prompt(state, messages, [TOOL])  # Llama 3's template raises on two calls in a turn
    assert second.ids[: len(first.ids) + len(output)] == first.ids + output
    assert (second.drift, second.drift_class, second.parent_call_id) == (False, REALIGNED, "c0")


def test_llama3_tool_calls_are_parsed_from_the_bare_json_reply() -> None:
    parsed = parse_tool_calls('<|python_tag|>{"name": "calculator", "parameters": {"expression": "1+1"}}', "json")
    assert parsed is not None and parsed[0] == ""
    assert parsed[1][0]["function"] == {"name": "calculator", "arguments": '{"expression": "1+1"}'}
    assert parse_tool_calls("The answer is {1}.", "json") is None
    assert parse_tool_calls('{"name": "calculator", "parameters": {"expression": "1+1"}', "json") is None  # cut
    assert parse_tool_calls('{"name": "f"}', "hermes") is None  # the styles are not mixed


def test_bpe_merges_across_words_and_round_trips(tokenizers: dict[str, Any]) -> None:
    backend = tokenizers["qwen3"].backend_tokenizer
    assert 4096 <= backend.get_vocab_size() < 4200  # 4,096 BPE tokens + the special tokens
    assert all(backend.id_to_token(i) == build_tokenizer("byte").backend_tokenizer.id_to_token(i) for i in range(256))
    text = 'Hello, wörld 日本語 😀\n\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}'
    ids = backend.encode(text, add_special_tokens=False).ids
    assert backend.decode(ids, skip_special_tokens=False) == text
    assert len(ids) < len(text.encode()) / 2  # merges: far fewer tokens than bytes
    assert backend.token_to_id("ĊĊ") is not None and backend.token_to_id('Ġ{"') is not None


def test_bpe_training_is_the_same_in_another_process() -> None:
    """Hash order differs between processes (PYTHONHASHSEED here; Rust's per process): the merges may not."""
    script = ("import hashlib, sys; from inference_svc.default_model import build_tokenizer; "
              "print(hashlib.sha256(build_tokenizer('bpe', 'llama3').backend_tokenizer.to_str().encode()).hexdigest())")
    here = hashlib.sha256(build_tokenizer("bpe", "llama3").backend_tokenizer.to_str().encode()).hexdigest()
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True,
                           timeout=120)
    assert other.stdout.strip() == here


@pytest.mark.parametrize("template", ["qwen3", "llama3"])
def test_a_bpe_model_folder_loads_in_the_proxy_as_in_transformers(tmp_path: Path, template: str) -> None:
    spec = DefaultModelSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=16, tokenizer="bpe", chat_template=template)
    model_dir = create_default_model(tmp_path / "model", spec)
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(model_dir))
    files = TokenizerFiles.from_model_dir(model_dir)
    text = reference.apply_chat_template(SESSION, tools=[TOOL], tokenize=False)
    assert files.apply_chat_template(SESSION, tools=[TOOL]) == text
    codec = ChatCodec.from_model_dir(model_dir)
    assert codec.encode(text) == reference.encode(text, add_special_tokens=False)
    assert codec.eos_token_ids == {reference.convert_tokens_to_ids(t) for t in TEMPLATES[template].stop}
    assert codec.tool_call_style == ("json" if template == "llama3" else "hermes")
    assert json.loads((model_dir / "config.json").read_text())["vocab_size"] == len(reference)


def test_the_spec_refuses_unknown_choices() -> None:
    with pytest.raises(ValueError, match="tokenizer='wordpiece'"):
        DefaultModelSpec(tokenizer="wordpiece")
    with pytest.raises(ValueError, match="chat_template='mistral'"):
        DefaultModelSpec(chat_template="mistral")
    with pytest.raises(ValueError, match="bpe_vocab_size=100"):
        DefaultModelSpec(bpe_vocab_size=100)
