"""The supervised warm-up: its data (mixed demonstrations), its loss mask and its schedule; and that a
short warm-up on the tool-using demonstrations lowers their loss on the real default model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.calculator.tasks import make_arithmetic_tasks
from examples.calculator.tool import CALCULATOR_TOOL, run_tool
from examples.calculator.warmup import direct_conversation, tool_conversation, warmup_conversations
from inference_svc.default_model import build_tokenizer
from trainer_svc.errors import TrainerError
from trainer_svc.warmup import learning_rate_factor, supervised_warmup, to_example

pytestmark = pytest.mark.unit
TASKS = make_arithmetic_tasks(200, seed=3, max_operand=9)


def test_demonstrations_are_right_and_mixed_in_the_asked_proportion() -> None:
    mixed = warmup_conversations(TASKS, 0.5, seed=1)
    direct = [c for c in mixed if len(c) == 3]
    assert 70 < len(direct) < 130 and len(mixed) == len(TASKS)
    assert warmup_conversations(TASKS, 0.5, seed=1) == mixed  # seeded
    assert all(len(c) == 5 for c in warmup_conversations(TASKS, 0.0, seed=1))
    for task in TASKS[:20]:
        call = tool_conversation(task)[2]["tool_calls"][0]["function"]
        output, ok = run_tool(call["name"], call["arguments"])
        assert ok and float(output) == task.answer == float(tool_conversation(task)[-1]["content"])
        assert float(direct_conversation(task)[-1]["content"]) == task.answer
    with pytest.raises(ValueError, match="direct_fraction"):
        warmup_conversations(TASKS, 1.5, seed=0)


def test_loss_mask_covers_exactly_the_assistant_turns() -> None:
    tokenizer = build_tokenizer()
    example = to_example(tokenizer, tool_conversation(TASKS[0]), [CALCULATOR_TOOL])
    trained = tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m])
    expression = json.loads(tool_conversation(TASKS[0])[2]["tool_calls"][0]["function"]["arguments"])["expression"]
    answer = tool_conversation(TASKS[0])[-1]["content"]
    assert trained == (f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n'
                       f"</tool_call><|im_end|>\n{answer}<|im_end|>\n")


def test_loss_mask_of_qwen3s_format_where_the_last_turn_renders_otherwise() -> None:
    """Qwen3 writes an empty think block in the last assistant turn only: a tool call rendered as the
    last turn is no prefix of the whole conversation; its span ends at its <|im_end|>."""
    tokenizer = build_tokenizer("bpe", "qwen3")
    conversation = tool_conversation(TASKS[0])
    example = to_example(tokenizer, conversation, [CALCULATOR_TOOL])
    trained = tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m])
    arguments = conversation[2]["tool_calls"][0]["function"]["arguments"]
    assert trained == (f'<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call><|im_end|>'
                       f"<think>\n\n</think>\n\n{conversation[-1]['content']}<|im_end|>\n")


@pytest.mark.parametrize("steps", [1, 10, 1200])
def test_schedule_warms_up_then_decays_to_the_floor(steps: int) -> None:
    factors = [learning_rate_factor(s, steps) for s in range(steps)]
    assert max(factors) == pytest.approx(1.0)
    assert all(0.0 < f <= 1.0 for f in factors)
    peak = factors.index(max(factors))
    assert all(f >= 0.1 - 1e-9 for f in factors[peak:])  # the decay stops at the floor
    assert factors[:peak + 1] == sorted(factors[:peak + 1]) and factors[peak:] == sorted(factors[peak:], reverse=True)


def test_short_warmup_lowers_the_loss_of_the_demonstrations(tiny_model_dir: Path, tmp_path: Path) -> None:
    conversations = warmup_conversations(TASKS[:16], 0.5, seed=0)
    losses: list[float] = []
    out = supervised_warmup(tiny_model_dir, tmp_path / "warm", conversations, [CALCULATOR_TOOL], steps=30,
                            batch_size=4, lr=3e-3, on_step=lambda step, loss: losses.append(loss))
    assert len(losses) == 30 and sum(losses[-5:]) < 0.7 * sum(losses[:5])
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    with pytest.raises(TrainerError, match="steps"):
        supervised_warmup(tiny_model_dir, tmp_path / "bad", conversations, steps=0)


def test_the_loss_over_assistant_positions_equals_the_full_logits_loss(tiny_model_dir: Path) -> None:
    """The output layer runs on the trained positions only: the same loss as masking the full logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_svc.warmup import _padded, assistant_loss_sum

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    batch = [to_example(tokenizer, c, [CALCULATOR_TOOL]) for c in warmup_conversations(TASKS[:6], 0.5, seed=2)]
    ids, mask, attention = _padded(batch, tokenizer.pad_token_id)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    full = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1),
                                             reduction="none").view_as(ids[:, 1:])
    expected = (full * mask[:, 1:]).sum()
    got = assistant_loss_sum(model, batch, tokenizer.pad_token_id).detach()
    assert float(got) == pytest.approx(float(expected.detach()), rel=1e-5)


@pytest.mark.slow
def test_two_workers_train_the_same_model_as_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Each batch split over two processes (gloo all-reduce): the same steps, losses and weights as one
    process, up to float summation order."""
    from safetensors.torch import load_file

    conversations = warmup_conversations(TASKS[:16], 0.5, seed=0)
    runs: dict[int, list[float]] = {1: [], 2: []}
    for workers, losses in runs.items():
        supervised_warmup(tiny_model_dir, tmp_path / f"w{workers}", conversations, [CALCULATOR_TOOL], steps=4,
                          batch_size=5, lr=3e-3, workers=workers, on_step=lambda _, loss, got=losses: got.append(loss))
    assert runs[2] == pytest.approx(runs[1], rel=1e-5) and len(runs[2]) == 4
    one, two = load_file(tmp_path / "w1" / "model.safetensors"), load_file(tmp_path / "w2" / "model.safetensors")
    assert one.keys() == two.keys()
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 1e-4
    assert (tmp_path / "w2" / "tokenizer.json").exists()


def test_a_failing_worker_ends_the_warmup_with_its_error(tmp_path: Path) -> None:
    with pytest.raises(TrainerError, match=r"rank [01] failed"):
        supervised_warmup(tmp_path / "no-such-model", tmp_path / "out", warmup_conversations(TASKS[:4], 0.5, seed=0),
                          steps=2, workers=2)
