"""Constrained decoding on the native engine: every output follows its grammar, in a mixed batch, across
pause / retract / abort-and-resume, and its logprobs are those of the masked distribution."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from pydantic import ValidationError

from inference_svc.engine import NativeEngine
from inference_svc.grammar import GrammarCompiler
from schemas.inference.errors import InvalidRequestError
from schemas.inference.protocol import SamplingParams
from schemas.inference.types import GenerationResult, SamplingOptions
from tests.inference.test_inference_engine import PROMPTS, ForwardFn, long_run, wait_for_tokens

pytestmark = pytest.mark.unit

# Bounded everywhere (lengths, items, enum, integer range), so a random-weights model always finishes it.
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "hourly": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
LARK = 'start: "call(" NAME ")"\nNAME: /[a-z]{1,5}/\n'


def constrained(seed: int, **grammar: str) -> SamplingOptions:
    return SamplingOptions(max_new_tokens=200, seed=seed, **grammar)  # type: ignore[arg-type]


def body_text(engine: NativeEngine, result: GenerationResult) -> str:
    """The output without its end token, which a finished constrained output always has (the tiny model's
    tokenizer is byte-level: ids below 256 are bytes)."""
    assert result.finish_reason is not None and result.finish_reason.type == "stop", result.finish_reason
    assert result.output_ids[-1] in engine.eos_token_ids
    return bytes(result.output_ids[:-1]).decode("utf-8")


def follows(engine: NativeEngine, sampling: SamplingOptions, output_ids: list[int]) -> bool:
    """A fresh matcher of the same grammar takes the whole output and ends (the grammar parses it)."""
    matcher = GrammarCompiler(engine.model_path, engine.vocab_size, engine.eos_token_ids).matcher(sampling, [])
    return bool(matcher.consume_tokens(output_ids)) and bool(matcher.is_stopped())


def test_every_output_follows_its_grammar_in_a_mixed_batch(
    engine: NativeEngine, reference_models: dict[int, torch.nn.Module], full_forward_logprobs: ForwardFn
) -> None:
    free_alone = engine.generate(PROMPTS[3], long_run(seed=99, max_new_tokens=40))
    kinds = [{"json_schema": json.dumps(SCHEMA)}, {"regex": r"(yes|no)[0-9]{1,3}"}, {"ebnf": LARK}]
    requests = [(PROMPTS[seed % len(PROMPTS)], constrained(seed, **kinds[seed % 3])) for seed in range(9)]
    futures = [engine.submit(p, s) for p, s in requests]
    free_in_batch = engine.submit(PROMPTS[3], long_run(seed=99, max_new_tokens=40))
    for (prompt, sampling), future in zip(requests, futures, strict=True):
        result = future.result(timeout=60)
        text = body_text(engine, result)
        assert follows(engine, sampling, result.output_ids), text
        if sampling.json_schema:
            jsonschema.validate(json.loads(text), SCHEMA)
            assert text == json.dumps(json.loads(text), ensure_ascii=False)  # compact: no free whitespace
        # logprobs are under the masked (renormalised) distribution: never below the unmasked ones
        unmasked = full_forward_logprobs(reference_models[0], prompt, result.output_ids)
        assert all(lp <= 0 and lp >= free - 1e-4 for lp, free in zip(result.output_logprobs, unmasked, strict=True))
    assert free_in_batch.result(timeout=60).output_ids == free_alone.output_ids  # masks stay on their rows


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_paused_constrained_requests_resume_on_their_grammar(engine: NativeEngine, mode: str) -> None:
    samplings = [constrained(seed, json_schema=json.dumps(SCHEMA)) for seed in range(3)]
    futures = [engine.submit(PROMPTS[i], s) for i, s in enumerate(samplings)]
    wait_for_tokens(engine, 3, at_least=4)
    engine.pause(mode)
    engine.resume()
    for sampling, future in zip(samplings, futures, strict=True):
        result = future.result(timeout=60)
        jsonschema.validate(json.loads(body_text(engine, result)), SCHEMA)
        assert follows(engine, sampling, result.output_ids)


def test_an_aborted_call_resumes_from_its_partial_output(engine: NativeEngine) -> None:
    """Pause with abort, then prompt + partial output elsewhere: the matcher is rebuilt from those tokens."""
    sampling = constrained(5, json_schema=json.dumps(SCHEMA))
    future = engine.submit(PROMPTS[1], sampling)
    wait_for_tokens(engine, 1, at_least=6)
    engine.pause("abort")
    engine.resume()
    partial = future.result(timeout=30)
    assert partial.finish_reason is not None and partial.finish_reason.type == "abort" and partial.output_ids
    rest = engine.generate(PROMPTS[1] + partial.output_ids, SamplingOptions(
        max_new_tokens=200, seed=6, json_schema=sampling.json_schema, grammar_prefix_tokens=len(partial.output_ids)))
    whole = partial.output_ids + rest.output_ids
    assert follows(engine, sampling, whole)
    jsonschema.validate(json.loads(bytes(whole[:-1]).decode("utf-8")), SCHEMA)


def test_bad_grammars_are_refused_at_submit(engine: NativeEngine, tiny_model_dir: Path) -> None:
    with pytest.raises(InvalidRequestError, match="ebnf"):
        engine.submit(PROMPTS[0], constrained(0, ebnf="start: undefined_rule\n"))
    with pytest.raises(InvalidRequestError, match="grammar_prefix_tokens"):
        engine.submit([1, 2, ord("x")], SamplingOptions(json_schema='{"type": "object"}', grammar_prefix_tokens=1))
    with pytest.raises(InvalidRequestError, match="structural_tag"):
        engine.submit(PROMPTS[0], SamplingOptions(structural_tag="{}"))
    with pytest.raises(ValidationError, match="at most one grammar"):
        SamplingParams(json_schema="{}", regex="a")
    with pytest.raises(ValidationError, match="without a grammar"):
        SamplingParams(grammar_prefix_tokens=3)
    assert SamplingParams(ebnf=LARK, grammar_prefix_tokens=2).to_options().grammar_prefix_tokens == 2
