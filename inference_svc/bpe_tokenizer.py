"""A byte-level BPE for the default model, trained here, at model creation, on text this module writes.

Why: with the byte-level tokenizer one character is one token, so re-tokenizing a conversation can
never merge across a message or turn boundary, and token-in/token-out is never tested where real
tokenizers (Qwen, Llama) make it hard. This one splits text as Qwen2/Qwen3's `tokenizer.json` does
(the same pre-tokenizer regex, then GPT-2's byte map) and learns a few thousand merges from seeded
synthetic conversations (prose, numbers, JSON tool calls and results, <think> blocks, non-ASCII text)
rendered with the model's own chat template, so merges like `"arguments": {"` or `\\n\\n` exist as in a
real vocabulary. Nothing is fetched; the same inputs give the same merges on every machine (the
trainer breaks ties by the pair, not by hash order). Ids 0..255 are the bytes in the byte-level
tokenizer's order, then the merges in the order they were learned, then the special tokens.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from schemas.inference.byte_level import bytes_to_unicode

# Qwen2/Qwen3's pre-tokenizer split (their tokenizer.json): single digits, letters with one leading mark.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS_CONVERSATIONS = 800
CORPUS_SEED = 13

_WORD_LIST = ("the a an of to and in is it that for on with as at by this be are from or have not was but what all "
          "were when we there can your which their said if do will each about how up out them then she many some "
          "so these would other into has more her two like him see time could no make than first been its who now "
          "people my made over did down only way find use may water long little very after words called just where "
          "most know get through back much before go good new write our used me man too any day same right look "
          "think also around another came come work three word must because does part even place well such here "
          "take why things help put years different away again off went old number great tell men say small every "
          "found still between name should home big give air line set own under read last never us left end along "
          "while might next sound below saw something thought both few those always looked show large often "
          "together asked house don't world going want school important until form food keep children feet land "
          "side without boy once animals life enough took sometimes four head above kind began almost live page "
          "got earth need far hand high year mother light parts country father let night following picture being "
          "study second eyes soon times story boys since white days ever paper hard near sentence better best "
          "across during today others however sure means knew it's try told young miles sun ways thing whole hear "
          "example heard several change answer room sea against top turned learn point city play toward five using "
          "compute result total value sum product expression calculator tool call function arguments response "
          "error retry step plan check verify final question task agent model token reward")
_WORDS = _WORD_LIST.split()
_SUFFIXES = ("", "", "", "", "s", "ed", "ing", "er", "ly", "ness", "able")
_UNICODE = ("café", "naïve", "über", "straße", "señor", "façade", "Ελληνικά", "русский", "日本語", "中文字符",
            "한국어", "العربية", "हिन्दी", "😀", "🚀✨", "—", "…", "€", "½", "→", "✓")
_TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}}, {"type": "function", "function": {
    "name": "search", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}},
}}]


def _word(rng: random.Random) -> str:
    """A word, often inflected, now and then made up of two (the words of code and of tool names)."""
    word = rng.choice(_WORDS) + rng.choice(_SUFFIXES)
    roll = rng.random()
    if roll < 0.05:
        return word + rng.choice(("_", "-", "")) + rng.choice(_WORDS)
    if roll < 0.1:
        return word.capitalize()
    return word


def _sentence(rng: random.Random) -> str:
    words = []
    for _ in range(rng.randint(3, 16)):
        roll = rng.random()
        if roll < 0.08:
            words.append(str(rng.randint(0, 10 ** rng.randint(1, 5))))
        elif roll < 0.12:
            words.append(rng.choice(_UNICODE))
        else:
            words.append(_word(rng))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice((".", ".", "?", "!", ":", ","))


def _prose(rng: random.Random, sentences: int) -> str:
    return (" " if rng.random() < 0.7 else "\n").join(_sentence(rng) for _ in range(sentences))


def _expression(rng: random.Random) -> str:
    terms = [str(rng.randint(0, 999)) for _ in range(rng.randint(2, 4))]
    return "".join(t + rng.choice((" + ", " - ", " * ", "*", "+")) for t in terms[:-1]) + terms[-1]


def _assistant(rng: random.Random, tools: bool) -> dict[str, Any]:
    think = f"<think>\n{_prose(rng, rng.randint(1, 3))}\n</think>\n\n" if rng.random() < 0.4 else ""
    if tools and rng.random() < 0.5:
        name, args = (("calculator", {"expression": _expression(rng)}) if rng.random() < 0.7
                      else ("search", {"query": rng.choice(_WORDS), "limit": rng.randint(1, 9)}))
        call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        return {"role": "assistant", "content": think or None, "tool_calls": [call]}
    return {"role": "assistant", "content": think + _prose(rng, rng.randint(1, 4))}


def conversation(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """A seeded synthetic conversation (prose, numbers, tool calls and results, think blocks, non-ASCII) and
    its tools (None: none offered)."""
    tools = _TOOLS if rng.random() < 0.5 else None
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": _prose(rng, rng.randint(1, 2))})
    messages.append({"role": "user", "content": _prose(rng, rng.randint(1, 3))})
    for _ in range(rng.randint(1, 4)):
        reply = _assistant(rng, tools is not None)
        messages.append(reply)
        if reply.get("tool_calls"):
            result = json.dumps({"result": rng.randint(-999, 99999)}) if rng.random() < 0.6 else _sentence(rng)
            messages.append({"role": "tool", "tool_call_id": "call_0", "content": result})
        else:
            messages.append({"role": "user", "content": _prose(rng, rng.randint(1, 2))})
    return messages, tools


def corpus(render: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str],
           special_tokens: Sequence[str]) -> Iterator[str]:
    """Seeded conversations rendered by `render`, cut at the special tokens (they are never merged)."""
    rng = random.Random(CORPUS_SEED)
    cut = re.compile("|".join(re.escape(t) for t in sorted(special_tokens, key=len, reverse=True)))
    for _ in range(CORPUS_CONVERSATIONS):
        messages, tools = conversation(rng)
        yield from (piece for piece in cut.split(render(messages, tools)) if piece)


def bpe_backend(merges: Sequence[tuple[str, str]]) -> Any:
    """The `tokenizers.Tokenizer` (no special tokens yet) of these merges over the 256 byte tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    return backend


def train_merges(texts: Iterable[str], vocab_size: int) -> list[tuple[str, str]]:
    """Merges learned from `texts` for a vocabulary of `vocab_size` tokens (bytes included, specials not)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if vocab_size <= 256:
        raise ValueError(f"bpe_vocab_size={vocab_size}: a byte-level BPE needs more than the 256 byte tokens")
    scratch = Tokenizer(models.BPE())
    scratch.pre_tokenizer = bpe_backend(()).pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    scratch.train_from_iterator(texts, trainer)
    merges = json.loads(scratch.to_str())["model"]["merges"]
    return [(str(m[0]), str(m[1])) if isinstance(m, list) else (m.split(" ", 1)[0], m.split(" ", 1)[1])
            for m in merges]
