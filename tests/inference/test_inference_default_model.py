"""The shipped default model, tokenizer and chat template load offline and behave."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer

from inference_svc.__main__ import parse_config
from inference_svc.config import InferenceConfig
from inference_svc.default_model import SPECIAL_TOKENS, chat_template, main

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def default_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("default-model")
    main(["--out", str(out)])
    return out


def test_default_model_is_a_small_qwen3_loadable_offline(default_dir: Path) -> None:
    files = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
    for name in files:
        assert (default_dir / name).is_file()
    model = AutoModelForCausalLM.from_pretrained(str(default_dir), local_files_only=True)
    assert model.config.model_type == "qwen3"
    assert 0.5e6 <= sum(p.numel() for p in model.parameters()) <= 3e6
    tokenizer = AutoTokenizer.from_pretrained(str(default_dir), local_files_only=True)
    assert model.config.vocab_size == len(tokenizer)
    assert json.loads((default_dir / "tokenizer_config.json").read_text())["chat_template"] == chat_template()


def test_byte_level_tokenizer_round_trips_and_keeps_specials_whole(default_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(default_dir), local_files_only=True)
    text = "naïve café 🙂\ttabs\n<|im_start|>user"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert ids[:5] == [*list(b"na\xc3\xaf"[:4]), ord("v")]
    for token in SPECIAL_TOKENS:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        assert len(encoded) == 1 and encoded[0] >= 256
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|pad|>"


def test_chat_template_renders_tools_calls_and_results(default_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(default_dir), local_files_only=True)
    tools: list[dict[str, Any]] = [{"type": "function", "function": {
        "name": "add", "description": "Adds two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "done"},
    ]
    text = str(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True))  # type: ignore[arg-type]
    assert text.startswith("<|im_start|>system\nBe brief.\n\n<tools>\nadd(a: integer, b: integer) Adds two integers.\n"
                           "</tools><|im_end|>\n")
    call = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert f"<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>" in text
    results = "<tool_response>\n3\n</tool_response>\n<tool_response>\ndone\n</tool_response>"
    assert f"<|im_start|>user\n{results}<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"


def test_config_errors_name_the_field_and_value(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="max_context"):
        InferenceConfig(model_path=tiny_model_dir, max_context=1)
    with pytest.raises(ValidationError, match="nowhere"):
        InferenceConfig(model_path=tmp_path / "nowhere")
    with pytest.raises(ValidationError, match="device='tpu'"):
        InferenceConfig(model_path=tiny_model_dir, device="tpu")
    with pytest.raises(ValidationError, match="extra"):
        InferenceConfig.model_validate({"model_path": tiny_model_dir, "max_ctx": 5})
    config = parse_config(["--model-path", str(tiny_model_dir), "--port", "0", "--sglang-arg=--x", "--sglang-arg=1"])
    assert config.port == 0 and config.sglang_args == ("--x", "1") and config.host == "127.0.0.1"
