"""The proxy's torch-free tokenizer (`TokenizerFiles`) reads a model directory as `AutoTokenizer` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from agents_adapter.errors import TemplateError
from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.tokenizer_files import TokenizerFiles

pytestmark = pytest.mark.unit
PARAMETERS = {"type": "object", "properties": {"expr": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "evaluates", "parameters": PARAMETERS}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expr": "1+2"}'}}
CONVERSATIONS: list[tuple[list[dict[str, Any]], Any]] = [
    ([{"role": "user", "content": "hi"}], None),
    ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "caf\u00e9 \U0001f600"}], None),
    ([{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "3"},
      {"role": "tool", "tool_call_id": "c2", "content": "4"}],
     TOOLS),
    ([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
      {"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "two"}]}], TOOLS),
]


@pytest.fixture(scope="module")
def both(tiny_model_dir: Path) -> tuple[TokenizerFiles, Any]:
    return TokenizerFiles.from_model_dir(tiny_model_dir), AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.mark.parametrize(("messages", "tools"), CONVERSATIONS)
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_templates_render_as_transformers_renders_them(both: tuple[TokenizerFiles, Any], messages: Any, tools: Any,
                                                       generation_prompt: bool) -> None:
    files, reference = both
    assert files.apply_chat_template(messages, tools, add_generation_prompt=generation_prompt) == \
        reference.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False)


def test_vocabulary_and_special_tokens_are_those_of_transformers(both: tuple[TokenizerFiles, Any]) -> None:
    files, reference = both
    assert len(files) == len(reference) and files.eos_token_id == reference.eos_token_id
    assert set(files.all_special_ids) == set(reference.all_special_ids)
    assert [files.convert_ids_to_tokens(i) for i in range(len(files))] == \
        [reference.convert_ids_to_tokens(i) for i in range(len(reference))]


def test_the_codec_built_from_the_directory_matches_one_built_on_transformers(tiny_model_dir: Path,
                                                                               codec: ChatCodec) -> None:
    reference = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    on_transformers = ChatCodec(reference, codec.eos_token_ids)
    assert isinstance(codec.tokenizer, TokenizerFiles)
    assert codec.convention == on_transformers.convention and codec.vocab_size == on_transformers.vocab_size
    for messages, tools in CONVERSATIONS:
        text = codec.render(messages, tools)
        assert text == on_transformers.render(messages, tools)
        ids = codec.encode(text)
        assert ids == on_transformers.encode(text) == list(reference.encode(text, add_special_tokens=False))
    assert [codec.token_bytes(i) for i in range(codec.vocab_size)] == \
        [on_transformers.token_bytes(i) for i in range(codec.vocab_size)]


def test_named_templates_are_picked_as_transformers_picks_them(both: tuple[TokenizerFiles, Any]) -> None:
    backend = both[0].backend_tokenizer
    templates = {"default": "D{{ messages | length }}", "tool_use": "T"}
    named = TokenizerFiles(backend, templates, {"eos_token": "<|im_end|>"})
    assert named.apply_chat_template([{"role": "user", "content": "x"}]) == "D1"
    assert named.apply_chat_template([{"role": "user", "content": "x"}], TOOLS) == "T"
    with pytest.raises(TemplateError, match="none named 'default'"):
        TokenizerFiles(backend, {"other": "O"}, {}).apply_chat_template([{"role": "user", "content": "x"}])


def test_a_directory_without_a_readable_tokenizer_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TemplateError, match="cannot load its tokenizer"):
        ChatCodec.from_model_dir(tmp_path)
