"""Constrained decoding on the native engine: a grammar per request, a token mask per decode step.

A request may carry one grammar in SGLang's sampling-param fields: `json_schema` (a JSON Schema),
`regex`, or `ebnf` (a Lark grammar, llguidance's dialect, or GBNF; the proxy's tool-call grammars are
Lark with `%json` for the arguments). SGLang takes the same fields; its `--grammar-backend llguidance`
reads them as this engine does (its default xgrammar backend reads `ebnf` as GBNF only).

The grammar library is llguidance (`llguidance` on PyPI): a Rust matcher per request that computes the
allowed-token bitmask of the next step from its parser state in tens of microseconds, with a bridge to
Hugging Face fast tokenizers. Each running request holds its own `LLMatcher`; the engine's decode step
asks every constrained row for its mask, sets the logits of forbidden tokens to -inf before sampling
(so the logprob recorded for a token is under the distribution it was drawn from, the masked one), then
feeds the sampled token to the matcher. A complete grammar allows only the model's end-of-sequence
tokens, so a constrained reply ends with one as a free reply does (what SGLang's default xgrammar
backend does too; the chat template's turn close starts with it), even under `ignore_eos`.

A matcher's state is a function of the tokens generated under it, so a request keeps its matcher
across pause (in place or retract) and weight swaps (its tokens stay), and a call that resumes
elsewhere (pause with abort, then the rest of the call submitted as prompt + partial output) rebuilds
the state by feeding the matcher those tokens again (`grammar_prefix_tokens`, our extension).

JSON from `json_schema` (and `%json` without its own `x-guidance` options) is compact by default
(`, ` and `: ` separators, no free whitespace): what `json.dumps` writes and models are trained on, and
a bound on where a sampled reply can wander.
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from schemas.inference.errors import InvalidRequestError
from schemas.inference.types import SamplingOptions

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

#: llguidance's JSON options for `json_schema` requests (see the module doc).
COMPACT_JSON: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_BITS = torch.tensor([1 << k for k in range(32)], dtype=torch.int64).to(torch.int32)  # 1 << 31 wraps to the sign bit


class GrammarCompiler:
    """Compiles a request's grammar for one model's tokenizer and starts its matcher.

    The tokenizer is read from the model directory on the first constrained request (a model without a
    fast tokenizer serves every request but constrained ones)."""

    def __init__(self, model_path: Path, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self.model_path = model_path
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids

    @cached_property
    def tokenizer(self) -> Any:
        import llguidance.hf
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        try:
            hf_tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        except (OSError, ValueError) as e:
            raise InvalidRequestError(f"constrained decoding needs the model's tokenizer, unreadable: {e}") from e
        if not isinstance(hf_tokenizer, PreTrainedTokenizerFast):
            raise InvalidRequestError(
                f"constrained decoding needs a fast (tokenizer.json) tokenizer; {self.model_path} has "
                f"{type(hf_tokenizer).__name__}"
            )
        return llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=self.vocab_size,
                                            eos_token=sorted(self.eos_token_ids))

    def matcher(self, sampling: SamplingOptions, input_ids: list[int]) -> Any:
        """The request's matcher, already past its last `grammar_prefix_tokens` prompt tokens; None when
        the request has no grammar. Raises `InvalidRequestError` for a grammar that does not compile."""
        grammar = self.grammar_of(sampling)
        if grammar is None:
            return None
        from llguidance import LLMatcher

        matcher = LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"{constraint_field(sampling)}: the grammar does not compile: "
                                      f"{matcher.get_error().strip()}")
        prefix = sampling.grammar_prefix_tokens
        if prefix > len(input_ids):
            raise InvalidRequestError(
                f"grammar_prefix_tokens={prefix} is more than the {len(input_ids)} input_ids")
        if prefix and not matcher.consume_tokens(input_ids[len(input_ids) - prefix:]):
            raise InvalidRequestError(
                f"grammar_prefix_tokens={prefix}: the last {prefix} input_ids do not follow the grammar: "
                f"{matcher.get_error().strip()}")
        return matcher

    @staticmethod
    def grammar_of(sampling: SamplingOptions) -> str | None:
        from llguidance import LLMatcher, grammar_from

        if sampling.json_schema is not None:
            try:
                return LLMatcher.grammar_from_json_schema(sampling.json_schema, defaults=COMPACT_JSON)
            except ValueError as e:
                raise InvalidRequestError(f"json_schema: {e}") from e
        if sampling.regex is not None:
            return LLMatcher.grammar_from_regex(sampling.regex)
        if sampling.ebnf is not None:
            try:
                return grammar_from("ebnf", sampling.ebnf)
            except ValueError as e:
                raise InvalidRequestError(f"ebnf: {e}") from e
        return None


def constraint_field(sampling: SamplingOptions) -> str:
    return next(name for name in ("json_schema", "regex", "ebnf") if getattr(sampling, name) is not None)


def mask_logits(logits: torch.Tensor, matchers: list[Any]) -> None:
    """Sets, in place, the logits of the tokens each row's matcher forbids to -inf (None: no grammar).

    A matcher in an error state (it never is after a token it allowed) leaves its row unmasked and logs."""
    rows = [i for i, m in enumerate(matchers) if m is not None and not m.is_error()]
    if not rows:
        return
    vocab = logits.shape[1]
    bitmask = torch.empty((len(rows), (vocab + 31) // 32), dtype=torch.int32)  # llguidance's layout: bit k of
    for j, i in enumerate(rows):  # word w allows token 32w + k; the matcher writes its row in place
        matchers[i].unsafe_compute_mask_ptr(bitmask[j].data_ptr(), bitmask.shape[1] * 4)
    forbidden = (bitmask.unsqueeze(-1) & _BITS).eq(0).view(len(rows), -1)[:, :vocab].to(logits.device)
    if len(rows) == len(matchers):
        logits.masked_fill_(forbidden, float("-inf"))
    else:
        index = torch.tensor(rows, device=logits.device)
        logits[index] = logits[index].masked_fill(forbidden, float("-inf"))


def advance(matcher: Any, token: int) -> bool:
    """Feeds a sampled token to its matcher; True once the grammar is complete (then only end-of-sequence
    tokens are allowed)."""
    if not matcher.consume_token(token):
        logger.warning("constrained request left its grammar", extra={"error": matcher.get_error()[:200]})
    return bool(matcher.is_stopped())
