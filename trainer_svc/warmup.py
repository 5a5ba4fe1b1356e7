"""Supervised warm-up on chat conversations: the short pre-training the default model gets
(docs/architecture.md, "Default model"), so an RL run starts from a policy that already emits the
task's format (tool calls, answers) and GRPO has reward variance to learn from.

Only assistant tokens are in the loss: each assistant turn's span is found by rendering the
conversation up to that turn with and without it through the model's own chat template, the same
rendering the capture proxy uses, so the warm-up teaches exactly the token sequences the agent will
produce.

The demonstrations are data: chat conversations with the tool schemas they are rendered with, from a
JSON Lines file (`python -m trainer_svc.warmup --model DIR --out DIR --demonstrations FILE --steps N`,
one `{"messages": [...], "tools": [...]}` per line) or from the records a run config's named callable
returns; the warm-up knows nothing of the task they teach.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer_svc.errors import TrainerError

log = logging.getLogger("sflow.trainer.warmup")

Conversation = list[dict[str, Any]]


@dataclass(frozen=True)
class Example:
    """One conversation as token ids with a mask of the assistant-written tokens."""

    input_ids: list[int]
    loss_mask: list[int]


@dataclass(frozen=True)
class Demonstrations:
    """The warm-up's data: conversations, and the tool schemas the chat template renders them with (one set
    for all: a warm-up teaches one agent's tools)."""

    conversations: list[Conversation]
    tools: list[dict[str, Any]] | None = None


def demonstrations_from_records(records: Iterable[object], source: str) -> Demonstrations:
    """Checks records shaped `{"messages": [...], "tools": [...]}` (a file's lines, or what a named
    callable returned); errors name the source and the record."""
    conversations: list[Conversation] = []
    tools: list[dict[str, Any]] | None = None
    for i, record in enumerate(records):
        if not isinstance(record, Mapping) or not _is_conversation(record.get("messages")):
            raise TrainerError(f"{source}, record {i}: expected {{'messages': [{{'role': ...}}, ...]}}, "
                               f"got {str(record)[:120]!r}")
        record_tools = list(record.get("tools") or []) or None
        if i > 0 and record_tools != tools:
            raise TrainerError(f"{source}, record {i}: its tools differ from record 0's (one tool set per warm-up)")
        tools = record_tools
        conversations.append([dict(m) for m in record["messages"]])
    if not conversations:
        raise TrainerError(f"{source}: no demonstrations")
    return Demonstrations(conversations, tools)


def _is_conversation(messages: object) -> bool:
    return isinstance(messages, list) and bool(messages) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages)


def read_demonstrations(path: Path) -> Demonstrations:
    """A JSON Lines file of demonstration records (blank lines skipped)."""
    source = f"demonstrations={str(path)!r}"
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise TrainerError(f"{source} cannot be read: {e}") from e
    records = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as e:
                raise TrainerError(f"{source}: line {number} is not JSON: {e}") from e
    return demonstrations_from_records(records, source)


def _render(tokenizer: Any, messages: Conversation, tools: Sequence[dict[str, Any]] | None, gen: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=gen, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def to_example(tokenizer: Any, messages: Conversation, tools: Sequence[dict[str, Any]] | None) -> Example:
    full = _render(tokenizer, messages, tools, gen=False)
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(_render(tokenizer, messages[:i], tools, gen=True))
        upto = full if i == len(messages) - 1 else _render(tokenizer, messages[: i + 1], tools, gen=False)
        end = len(upto) if full[: len(upto)] == upto else _turn_end(tokenizer, full, start)
        for k in range(start, end):
            mask[k] = 1
    return Example(full, mask)


def _turn_end(tokenizer: Any, full: Sequence[int], start: int) -> int:
    """Where the assistant turn that starts at `start` ends (its end-of-turn token included), for
    templates that render a turn otherwise when it is the last one (Qwen3 gives the last assistant turn
    an empty think block): the conversation up to that turn is then no prefix of the whole."""
    eos = tokenizer.eos_token_id
    if eos is None or eos not in full[start:]:
        raise TrainerError("chat template is not prefix-stable: cannot locate assistant tokens")
    return full.index(eos, start) + 1


def learning_rate_factor(step: int, steps: int, warmup_fraction: float = 0.1, floor: float = 0.1) -> float:
    """Linear warm-up then cosine decay to `floor`: a constant rate this high leaves a small model
    oscillating, and sampled at temperature 1 every wobble shows up as broken tool-call syntax."""
    warmup = max(1, int(steps * warmup_fraction))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _padded(batch: Sequence[Example], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, loss mask, attention mask) of a batch, right-padded to its longest example."""
    width = max(len(e.input_ids) for e in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.float32)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, e in enumerate(batch):
        n = len(e.input_ids)
        ids[row, :n] = torch.tensor(e.input_ids)
        mask[row, :n] = torch.tensor(e.loss_mask, dtype=torch.float32)
        attention[row, :n] = 1
    return ids, mask, attention


def supervised_warmup(
    model_dir: Path,
    out_dir: Path,
    conversations: Sequence[Conversation],
    tools: Sequence[dict[str, Any]] | None = None,
    steps: int = 200,
    batch_size: int = 8,
    lr: float = 2e-3,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> Path:
    """Trains on the assistant tokens of `conversations` and saves an HF directory at `out_dir`.

    `on_step(step, loss)` is called after every optimizer step (progress bars live in the caller).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if steps < 1 or batch_size < 1:
        raise TrainerError(f"steps and batch_size must be >= 1, got steps={steps} batch_size={batch_size}")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    examples = [to_example(tokenizer, c, tools) for c in conversations]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate_factor(step, steps))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for step in range(steps):
        ids, mask, attention = _padded([examples[rng.randrange(len(examples))] for _ in range(batch_size)], pad)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        target = ids[:, 1:]
        token_loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="none"
        ).view_as(target)
        weights = mask[:, 1:]
        loss = (token_loss * weights).sum() / weights.sum().clamp(min=1.0)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if on_step is not None:
            on_step(step, float(loss.detach()))
        if step % 50 == 0 or step == steps - 1:
            log.info("warm-up step", extra={"step": step, "loss": round(float(loss.detach()), 4)})
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    for name in ("generation_config.json",):
        if (model_dir / name).exists() and not (out_dir / name).exists():
            shutil.copy(model_dir / name, out_dir / name)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer_svc.warmup", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--demonstrations", type=Path, required=True,
                        help='JSON Lines: one {"messages": [...], "tools": [...]} per line')
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO")
    data = read_demonstrations(args.demonstrations)
    supervised_warmup(args.model, args.out, data.conversations, data.tools, steps=args.steps,
                      batch_size=args.batch_size, lr=args.lr, seed=args.seed)


if __name__ == "__main__":
    main()
