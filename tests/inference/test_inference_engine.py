"""The native engine: exactness of batched incremental decoding, seeded sampling, partial rollout."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from inference_svc.engine import NativeEngine
from inference_svc.model_runner import BatchRunner, SlotKVCache, model_shape
from schemas.inference.errors import InvalidRequestError, WeightLoadError
from schemas.inference.types import SamplingOptions

pytestmark = pytest.mark.unit

ForwardFn = Callable[[torch.nn.Module, list[int], list[int]], list[float]]
PROMPTS = [[1, 2, 3], [40, 41, 42, 43, 44, 45, 46], [100], [7, 8, 9, 10, 11], [200, 201], [5] * 12, [9, 9], [77] * 4]


def wait_for_tokens(engine: NativeEngine, n_requests: int, at_least: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = engine.snapshot()
        if len(snap) == n_requests and all(len(s.output_ids) >= at_least for s in snap):
            return
        time.sleep(0.002)
    raise AssertionError(f"requests did not reach {at_least} tokens in {timeout_s}s")


def long_run(seed: int, max_new_tokens: int = 300) -> SamplingOptions:
    return SamplingOptions(max_new_tokens=max_new_tokens, ignore_eos=True, seed=seed)


def test_batched_extend_matches_full_forward(reference_models: dict[int, torch.nn.Module]) -> None:
    """Prefill, decode and offset-extend of mixed rows give the logits of a full forward (<= 1e-4)."""
    model = reference_models[0]
    cache = SlotKVCache(model_shape(model), 4, 8, 256, torch.float32, torch.device("cpu"))
    runner = BatchRunner(model, cache)
    seqs = [PROMPTS[1] + [3, 4, 5, 6], PROMPTS[0] + list(range(20, 40)), PROMPTS[5]]
    with torch.no_grad():
        runner.extend([0, 1, 2], [0, 0, 0], [s[:2] for s in seqs])
        for pos in range(2, max(len(s) for s in seqs)):
            rows = [i for i, s in enumerate(seqs) if pos < len(s)]
            logits = runner.extend(rows, [pos] * len(rows), [[seqs[i][pos]] for i in rows])
            for j, i in enumerate(rows):
                full = model(torch.tensor([seqs[i][: pos + 1]])).logits[0, -1]
                assert torch.allclose(logits[j], full, atol=1e-4), (i, pos)
        logits = runner.extend([1, 0], [5, 3], [[1, 2, 3], [4]])  # extend from a kept prefix
        assert torch.allclose(logits[0], model(torch.tensor([[*seqs[1][:5], 1, 2, 3]])).logits[0, -1], atol=1e-4)
        assert torch.allclose(logits[1], model(torch.tensor([[*seqs[0][:3], 4]])).logits[0, -1], atol=1e-4)


def test_one_row_prefill_from_position_zero_matches_full_forward(reference_models: dict[int, torch.nn.Module]) -> None:
    """The unmasked (plain causal) prefill path, then decode steps over the KV it wrote."""
    model = reference_models[0]
    cache = SlotKVCache(model_shape(model), 2, 8, 512, torch.float32, torch.device("cpu"))
    runner = BatchRunner(model, cache)
    seq = [(7 * i) % 250 for i in range(300)]
    with torch.no_grad():
        logits = runner.extend([1], [0], [seq[:297]])
        assert torch.allclose(logits[0], model(torch.tensor([seq[:297]])).logits[0, -1], atol=1e-4)
        for pos in range(297, 300):
            logits = runner.extend([1], [pos], [[seq[pos]]])
            assert torch.allclose(logits[0], model(torch.tensor([seq[: pos + 1]])).logits[0, -1], atol=1e-4)


def test_incremental_decode_logprobs_equal_full_forward(
    engine: NativeEngine, reference_models: dict[int, torch.nn.Module], full_forward_logprobs: ForwardFn
) -> None:
    futures = [engine.submit(p, long_run(seed=i, max_new_tokens=40)) for i, p in enumerate(PROMPTS)]
    for prompt, future in zip(PROMPTS, futures, strict=True):
        result = future.result(timeout=30)
        assert len(result.output_ids) == 40 and result.finish_reason is not None
        assert result.finish_reason.type == "length"
        expected = full_forward_logprobs(reference_models[0], prompt, result.output_ids)
        assert max(abs(a - b) for a, b in zip(expected, result.output_logprobs, strict=True)) <= 1e-4


def test_seeded_sampling_is_reproducible_and_batch_independent(engine: NativeEngine) -> None:
    alone = engine.generate(PROMPTS[3], long_run(seed=1234, max_new_tokens=30))
    again = engine.generate(PROMPTS[3], long_run(seed=1234, max_new_tokens=30))
    crowd = [engine.submit(p, long_run(seed=i, max_new_tokens=30)) for i, p in enumerate(PROMPTS)]
    in_batch = engine.submit(PROMPTS[3], long_run(seed=1234, max_new_tokens=30)).result(timeout=30)
    other_seed = engine.generate(PROMPTS[3], long_run(seed=4321, max_new_tokens=30))
    for f in crowd:
        f.result(timeout=30)
    assert alone.output_ids == again.output_ids == in_batch.output_ids
    assert alone.output_logprobs == again.output_logprobs
    assert other_seed.output_ids != alone.output_ids


def test_greedy_follows_argmax_with_point_mass_logprobs(
    engine: NativeEngine, reference_models: dict[int, torch.nn.Module]
) -> None:
    result = engine.generate(PROMPTS[1], SamplingOptions(max_new_tokens=12, temperature=0.0, ignore_eos=True))
    tokens = list(PROMPTS[1])
    with torch.no_grad():
        for produced in result.output_ids:
            assert produced == int(reference_models[0](torch.tensor([tokens])).logits[0, -1].argmax())
            tokens.append(produced)
    assert result.output_logprobs == [0.0] * 12


def test_top_k_top_p_logprobs_are_under_the_truncated_distribution(
    engine: NativeEngine, reference_models: dict[int, torch.nn.Module]
) -> None:
    sampling = SamplingOptions(max_new_tokens=20, temperature=0.7, top_k=8, top_p=0.9, ignore_eos=True, seed=5)
    result = engine.generate(PROMPTS[0], sampling)
    tokens = list(PROMPTS[0])
    with torch.no_grad():
        for tok, logprob in zip(result.output_ids, result.output_logprobs, strict=True):
            scaled = reference_models[0](torch.tensor([tokens])).logits[0, -1] / 0.7
            top = torch.topk(scaled, 8)
            probs = torch.softmax(top.values, dim=-1)
            keep = (probs.cumsum(0) - probs) < 0.9
            kept_ids = top.indices[keep].tolist()
            assert tok in kept_ids
            renormalised = torch.log_softmax(top.values[keep], dim=-1)
            assert abs(renormalised[kept_ids.index(tok)].item() - logprob) <= 1e-4
            tokens.append(tok)


def test_pause_swap_resume_continues_every_request_with_versions_switching_at_the_swap(
    engine: NativeEngine,
    perturbed_model_dir: Path,
    reference_models: dict[int, torch.nn.Module],
    full_forward_logprobs: ForwardFn,
) -> None:
    futures = [engine.submit(p, long_run(seed=i), rid=f"r{i}") for i, p in enumerate(PROMPTS)]
    wait_for_tokens(engine, len(PROMPTS), at_least=5)
    assert engine.pause("in_place") == len(PROMPTS)
    before = {s.rid: s for s in engine.snapshot()}
    time.sleep(0.05)
    assert {s.rid: s.output_ids for s in engine.snapshot()} == {r: s.output_ids for r, s in before.items()}
    update = engine.update_weights_from_disk(perturbed_model_dir, weight_version=1)
    assert update.success and update.weight_version == 1 and update.num_paused_requests == len(PROMPTS)
    engine.resume()
    for i, (prompt, future) in enumerate(zip(PROMPTS, futures, strict=True)):
        result = future.result(timeout=60)
        cut = len(before[f"r{i}"].output_ids)
        assert len(result.output_ids) == 300 and result.finish_reason is not None
        assert result.output_ids[:cut] == before[f"r{i}"].output_ids
        assert result.output_versions == [0] * cut + [1] * (300 - cut)
        old = full_forward_logprobs(reference_models[0], prompt, result.output_ids)
        new = full_forward_logprobs(reference_models[1], prompt, result.output_ids)
        assert max(abs(a - b) for a, b in zip(old[:cut], result.output_logprobs[:cut], strict=True)) <= 1e-4
        assert max(abs(a - b) for a, b in zip(new[cut:], result.output_logprobs[cut:], strict=True)) <= 1e-4
        assert max(abs(a - b) for a, b in zip(new[:cut], result.output_logprobs[:cut], strict=True)) > 1e-3
    assert engine.weight_version == 1


def test_swap_while_running_applies_at_a_token_boundary(
    engine: NativeEngine,
    perturbed_model_dir: Path,
    reference_models: dict[int, torch.nn.Module],
    full_forward_logprobs: ForwardFn,
) -> None:
    futures = [engine.submit(p, long_run(seed=i, max_new_tokens=150)) for i, p in enumerate(PROMPTS[:4])]
    wait_for_tokens(engine, 4, at_least=3)
    engine.update_weights_from_disk(perturbed_model_dir)  # no pause: the loop swaps between two steps
    assert engine.weight_version == 1
    for prompt, future in zip(PROMPTS[:4], futures, strict=True):
        result = future.result(timeout=60)
        cut = result.output_versions.index(1)
        assert result.output_versions == [0] * cut + [1] * (150 - cut)
        new = full_forward_logprobs(reference_models[1], prompt, result.output_ids)
        assert max(abs(a - b) for a, b in zip(new[cut:], result.output_logprobs[cut:], strict=True)) <= 1e-4


def test_abort_returns_partials_that_finish_when_resubmitted(
    engine: NativeEngine, reference_models: dict[int, torch.nn.Module], full_forward_logprobs: ForwardFn
) -> None:
    futures = [engine.submit(p, long_run(seed=i, max_new_tokens=120)) for i, p in enumerate(PROMPTS[:4])]
    wait_for_tokens(engine, 4, at_least=5)
    assert engine.pause("abort") == 4
    partials = [f.result(timeout=10) for f in futures]
    late = engine.submit(PROMPTS[4], long_run(seed=99, max_new_tokens=10))  # arrives while paused: it waits
    time.sleep(0.1)
    assert not late.done()
    engine.resume()
    assert late.result(timeout=30).finish_reason is not None
    for prompt, partial in zip(PROMPTS[:4], partials, strict=True):
        assert partial.finish_reason is not None and partial.finish_reason.type == "abort"
        k = len(partial.output_ids)
        assert 5 <= k < 120 and len(partial.output_logprobs) == k and partial.output_versions == [0] * k
        rest = engine.generate(prompt + partial.output_ids, long_run(seed=7, max_new_tokens=120 - k))
        assert rest.finish_reason is not None and rest.finish_reason.type == "length"
        assert len(partial.output_ids) + len(rest.output_ids) == 120
        whole = partial.output_ids + rest.output_ids
        expected = full_forward_logprobs(reference_models[0], prompt, whole)
        got = partial.output_logprobs + rest.output_logprobs
        assert max(abs(a - b) for a, b in zip(expected, got, strict=True)) <= 1e-4


def test_abort_before_any_token_and_single_rid(engine: NativeEngine) -> None:
    engine.pause("in_place")
    queued = engine.submit(PROMPTS[0], long_run(seed=1), rid="queued")
    assert engine.abort("queued") and not engine.abort("unknown")
    result = queued.result(timeout=10)
    assert result.finish_reason is not None and result.finish_reason.message == "Abort before prefill"
    assert result.output_ids == []
    engine.resume()
    running = engine.submit(PROMPTS[1], long_run(seed=2), rid="running")
    wait_for_tokens(engine, 1, at_least=3)
    assert engine.abort("running")
    assert running.result(timeout=10).finish_reason.type == "abort"  # type: ignore[union-attr]


def test_retract_drops_kv_and_continues_exactly(
    engine: NativeEngine, reference_models: dict[int, torch.nn.Module], full_forward_logprobs: ForwardFn
) -> None:
    futures = [engine.submit(p, long_run(seed=i, max_new_tokens=60)) for i, p in enumerate(PROMPTS[:3])]
    wait_for_tokens(engine, 3, at_least=4)
    engine.pause("retract")
    engine.resume()
    for prompt, future in zip(PROMPTS[:3], futures, strict=True):
        result = future.result(timeout=30)
        expected = full_forward_logprobs(reference_models[0], prompt, result.output_ids)
        assert max(abs(a - b) for a, b in zip(expected, result.output_logprobs, strict=True)) <= 1e-4


def test_bad_checkpoints_leave_the_old_weights_live(engine: NativeEngine, tmp_path: Path) -> None:
    before = engine.generate(PROMPTS[0], long_run(seed=3, max_new_tokens=15))
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(wrong / "model.safetensors"))
    empty = tmp_path / "empty"
    empty.mkdir()
    for bad in (tmp_path / "missing", wrong, empty):
        with pytest.raises(WeightLoadError):
            engine.update_weights_from_disk(bad, weight_version=9)
    assert engine.weight_version == 0
    after = engine.generate(PROMPTS[0], long_run(seed=3, max_new_tokens=15))
    assert after.output_ids == before.output_ids and after.output_versions == [0] * 15


def test_stop_tokens_queueing_and_zero_budget(tiny_model_dir: Path) -> None:
    with NativeEngine(tiny_model_dir, max_running_requests=2, max_context=256) as small:
        greedy = SamplingOptions(max_new_tokens=20, temperature=0.0, ignore_eos=True)
        free_run = small.generate(PROMPTS[1], greedy)
        stop_at = free_run.output_ids[4]
        first = free_run.output_ids.index(stop_at)
        stopped = small.generate(PROMPTS[1], SamplingOptions(**{**greedy.__dict__, "stop_token_ids": (stop_at,)}))
        assert stopped.output_ids == free_run.output_ids[: first + 1]
        assert stopped.finish_reason is not None and stopped.finish_reason.to_json() == {
            "type": "stop",
            "matched": stop_at,
        }
        many = [small.submit(p, long_run(seed=i, max_new_tokens=8)) for i, p in enumerate(PROMPTS)]
        assert all(len(f.result(timeout=30).output_ids) == 8 for f in many)  # 8 requests through 2 slots
        empty = small.generate(PROMPTS[0], SamplingOptions(max_new_tokens=0))
        assert empty.output_ids == [] and empty.finish_reason is not None and empty.finish_reason.type == "length"
        default_budget = small.generate([1] * 200, SamplingOptions(ignore_eos=True, temperature=0.0))
        assert len(default_budget.output_ids) == 56  # min(128, 256 - 200)


@pytest.mark.parametrize(
    ("ids", "sampling", "fragment"),
    [
        ([], SamplingOptions(), "empty"),
        ([1, 266], SamplingOptions(), "input_ids[1]=266"),
        ([-1], SamplingOptions(), "input_ids[0]=-1"),
        ([1] * 10, SamplingOptions(max_new_tokens=1020), "exceeds the context length 1024"),
        ([1] * 1024, SamplingOptions(), "context length is 1024"),
        ([1], SamplingOptions(temperature=-0.5), "temperature"),
        ([1], SamplingOptions(top_p=0.0), "top_p"),
        ([1], SamplingOptions(top_k=0), "top_k"),
        ([1], SamplingOptions(stop_token_ids=(999,)), "stop_token_ids"),
    ],
)
def test_invalid_requests_are_refused_and_the_engine_keeps_serving(
    engine: NativeEngine, ids: list[int], sampling: SamplingOptions, fragment: str
) -> None:
    with pytest.raises(InvalidRequestError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        engine.submit(ids, sampling)
    assert len(engine.generate([1, 2], SamplingOptions(max_new_tokens=2)).output_ids) == 2


def test_requests_leaving_mid_flight_keep_the_others_exact(
    tiny_model_dir: Path, reference_models: dict[int, torch.nn.Module], full_forward_logprobs: ForwardFn
) -> None:
    """Different lengths: finished rows leave, the last row moves into their slot, the cache grows."""
    budgets = [10, 50, 25, 80, 5, 60, 33, 1]
    with NativeEngine(tiny_model_dir, max_running_requests=8, max_context=256, kv_initial_tokens=16) as small:
        futures = [
            small.submit(p, long_run(seed=i, max_new_tokens=n))
            for i, (p, n) in enumerate(zip(PROMPTS, budgets, strict=True))
        ]
        for prompt, budget, future in zip(PROMPTS, budgets, futures, strict=True):
            result = future.result(timeout=30)
            assert len(result.output_ids) == budget
            expected = full_forward_logprobs(reference_models[0], prompt, result.output_ids)
            assert max(abs(a - b) for a, b in zip(expected, result.output_logprobs, strict=True)) <= 1e-4
        assert small.stats().running == 0


def test_bfloat16_engine_tracks_a_bfloat16_forward(tiny_model_dir: Path, full_forward_logprobs: ForwardFn) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16).eval()
    with NativeEngine(tiny_model_dir, dtype="bfloat16", max_context=256) as half:
        result = half.generate(PROMPTS[1], long_run(seed=2, max_new_tokens=30))
    expected = full_forward_logprobs(reference, PROMPTS[1], result.output_ids)
    assert max(abs(a - b) for a, b in zip(expected, result.output_logprobs, strict=True)) <= 0.05


def test_prefix_cache_reuses_a_previous_call_exactly(
    tiny_model_dir: Path,
    perturbed_model_dir: Path,
    reference_models: dict[int, torch.nn.Module],
    full_forward_logprobs: ForwardFn,
) -> None:
    """An agent's next turn extends its previous call: only the new tokens are prefilled."""
    with NativeEngine(tiny_model_dir, max_running_requests=4, max_context=512, prefix_cache_slots=2) as cached:
        first_prompt = list(range(10, 60))
        first = cached.generate(first_prompt, long_run(seed=1, max_new_tokens=30))
        assert first.cached_tokens == 0
        turn = first_prompt + first.output_ids + [258, 10, 257, 97, 98]
        second = cached.generate(turn, long_run(seed=2, max_new_tokens=20))
        assert second.cached_tokens == len(first_prompt) + 30 - 1  # the last sampled token was never fed
        expected = full_forward_logprobs(reference_models[0], turn, second.output_ids)
        assert max(abs(a - b) for a, b in zip(expected, second.output_logprobs, strict=True)) <= 1e-4
        other = cached.generate([5] * 40, long_run(seed=3, max_new_tokens=5))
        assert other.cached_tokens == 0
        assert cached.flush_cache()
        assert cached.generate(turn, long_run(seed=2, max_new_tokens=20)).cached_tokens == 0
        cached.generate(turn, long_run(seed=2, max_new_tokens=20))
        cached.update_weights_from_disk(perturbed_model_dir, 1)  # old-weight KV must not be reused
        after_swap = cached.generate([*turn, 1, 2], long_run(seed=2, max_new_tokens=5))
        assert after_swap.cached_tokens == 0
        expected = full_forward_logprobs(reference_models[1], [*turn, 1, 2], after_swap.output_ids)
        assert max(abs(a - b) for a, b in zip(expected, after_swap.output_logprobs, strict=True)) <= 1e-4


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_other_llama_family_models_decode_exactly(arch: str, tmp_path: Path, full_forward_logprobs: ForwardFn) -> None:
    """No q/k norm (scale applied to q), qkv bias (Qwen2): the same batched path, checked against transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape: dict[str, Any] = dict(
        vocab_size=120, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=0,
    )
    torch.manual_seed(0)
    model = (Qwen2ForCausalLM(Qwen2Config(**shape)) if arch == "qwen2" else LlamaForCausalLM(LlamaConfig(**shape)))
    model.save_pretrained(tmp_path)
    model.eval()
    with NativeEngine(tmp_path, max_running_requests=4, max_context=256) as other:
        futures = [other.submit(p, long_run(seed=i, max_new_tokens=25)) for i, p in enumerate([[1, 2, 3], [50] * 9])]
        for prompt, future in zip([[1, 2, 3], [50] * 9], futures, strict=True):
            result = future.result(timeout=30)
            expected = full_forward_logprobs(model, prompt, result.output_ids)
            assert max(abs(a - b) for a, b in zip(expected, result.output_logprobs, strict=True)) <= 1e-4
