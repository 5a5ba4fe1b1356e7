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
import queue
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
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


@dataclass(frozen=True)
class WarmupPlan:
    """What a warm-up trains on and how: every worker process gets the same plan and draws the same batches."""

    model_dir: Path
    conversations: Sequence[Conversation]
    tools: Sequence[dict[str, Any]] | None
    steps: int
    batch_size: int
    lr: float
    seed: int


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
    workers: int = 1,
) -> Path:
    """Trains on the assistant tokens of `conversations` and saves an HF directory at `out_dir`.

    `on_step(step, loss)` is called after every optimizer step (progress bars live in the caller).
    `workers` > 1 splits every batch over that many processes, their gradients summed by a gloo all-reduce:
    the same batches, loss and optimizer steps as one process (up to float summation order), on more cores.
    """
    if steps < 1 or batch_size < 1 or workers < 1:
        raise TrainerError(f"steps, batch_size and workers must be >= 1, got steps={steps} "
                           f"batch_size={batch_size} workers={workers}")
    plan = WarmupPlan(model_dir, conversations, tools, steps, batch_size, lr, seed)
    if workers == 1:
        model, tokenizer = _train(plan, 0, 1, on_step)
        _save(model, tokenizer, model_dir, out_dir)
    else:
        _train_in_processes(plan, workers, out_dir, on_step)
    return out_dir


def _train(plan: WarmupPlan, rank: int, world: int,
           on_step: Callable[[int, float], None] | None) -> tuple[torch.nn.Module, Any]:
    """The warm-up's loop on this rank's share of each batch (all of it with one worker)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(plan.seed)
    rng = random.Random(plan.seed)
    tokenizer = AutoTokenizer.from_pretrained(plan.model_dir)
    model = AutoModelForCausalLM.from_pretrained(plan.model_dir, dtype=torch.float32)
    model.train()
    examples = [to_example(tokenizer, c, plan.tools) for c in plan.conversations]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=plan.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate_factor(step, plan.steps))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for step in range(plan.steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(plan.batch_size)]
        trained_tokens = max(1, sum(sum(e.loss_mask[1:]) for e in batch))  # the whole batch's, on every rank
        share = batch[rank::world]
        loss = assistant_loss_sum(model, share, pad) / trained_tokens if share else torch.zeros(())
        optimizer.zero_grad()
        if share:
            loss.backward()
        batch_loss = _summed_over_ranks(params, loss.detach(), world)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        if on_step is not None:
            on_step(step, batch_loss)
        if step % 50 == 0 or step == plan.steps - 1:
            log.info("warm-up step", extra={"step": step, "loss": round(batch_loss, 4)})
    return model, tokenizer


def assistant_loss_sum(model: torch.nn.Module, batch: Sequence[Example], pad: int) -> torch.Tensor:
    """Summed cross-entropy of the batch's assistant tokens (each predicted from the tokens before it)."""
    ids, mask, attention = _padded(batch, pad)
    selected = mask[:, 1:].bool()
    return torch.nn.functional.cross_entropy(
        _assistant_logits(model, ids, attention, selected), ids[:, 1:][selected], reduction="sum")


# Config fields of families whose output layer is more than a linear map of the last hidden state.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _assistant_logits(model: Any, ids: torch.Tensor, attention: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """Logits of the positions in the loss only: the output layer and its softmax over every position were
    ~40 % of a demo warm-up step, and ~86 % of each conversation's tokens (the system prompt with its tool
    schemas, the user's question) are not trained."""
    if any(getattr(model.config, name, None) is not None for name in _LOGIT_TRANSFORMS):
        return model(input_ids=ids, attention_mask=attention).logits[:, :-1][selected]
    hidden = model.base_model(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1]
    return model.get_output_embeddings()(hidden[selected])


def _summed_over_ranks(params: Sequence[torch.nn.Parameter], loss: torch.Tensor, world: int) -> float:
    """Sums every rank's gradients (and loss share) into each rank's: one all-reduce of one flat buffer."""
    if world == 1:
        return float(loss)
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                     + [loss.reshape(1)])
    torch.distributed.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return float(flat[-1])


def _save(model: Any, tokenizer: Any, model_dir: Path, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    for name in ("generation_config.json",):
        if (model_dir / name).exists() and not (out_dir / name).exists():
            shutil.copy(model_dir / name, out_dir / name)


def _train_in_processes(plan: WarmupPlan, workers: int, out_dir: Path,
                        on_step: Callable[[int, float], None] | None) -> None:
    """Runs `workers` ranks as spawned processes; rank 0 reports each step and saves. A rank that fails
    ends the warm-up with its error (the others are killed, not left waiting in an all-reduce)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    reports = context.Queue()
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="sflow-warmup-") as rendezvous:
        ranks = [context.Process(target=_rank_main, name=f"warmup-rank{rank}", daemon=True, args=(
            plan, rank, workers, str(Path(rendezvous) / "store"), out_dir, reports, threads))
            for rank in range(workers)]
        for process in ranks:
            process.start()
        try:
            _follow_ranks(ranks, reports, on_step)
            for process in ranks:
                process.join(timeout=60)
        finally:
            for process in ranks:
                if process.is_alive():
                    process.kill()
                    process.join()


def _follow_ranks(ranks: Sequence[Any], reports: Any, on_step: Callable[[int, float], None] | None) -> None:
    while True:
        try:
            report = reports.get(timeout=1.0)
        except queue.Empty:
            if failed := [p for p in ranks if p.exitcode not in (None, 0)]:
                raise TrainerError(f"warm-up worker {failed[0].name} exited with status {failed[0].exitcode}") from None
            continue
        if report[0] == "step" and on_step is not None:
            on_step(report[1], report[2])
        elif report[0] == "error":
            raise TrainerError(f"warm-up worker rank {report[1]} failed: {report[2]}")
        elif report[0] == "done":
            return


def _rank_main(plan: WarmupPlan, rank: int, world: int, store_path: str, out_dir: Path, reports: Any,
               threads: int) -> None:
    """A warm-up worker process: joins the gloo group, trains its share, rank 0 saves the result."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(threads)
    try:
        store = torch.distributed.FileStore(store_path, world)
        torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                             timeout=timedelta(minutes=5))
        report = (lambda step, loss: reports.put(("step", step, loss))) if rank == 0 else None
        model, tokenizer = _train(plan, rank, world, report)
        if rank == 0:
            _save(model, tokenizer, plan.model_dir, out_dir)
            reports.put(("done",))
    except Exception as e:
        reports.put(("error", rank, f"{type(e).__name__}: {e}"))
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


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
    parser.add_argument("--workers", type=int, default=1, help="processes sharing each batch (one core each)")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO")
    data = read_demonstrations(args.demonstrations)
    supervised_warmup(args.model, args.out, data.conversations, data.tools, steps=args.steps,
                      batch_size=args.batch_size, lr=args.lr, seed=args.seed, workers=args.workers)


if __name__ == "__main__":
    main()
