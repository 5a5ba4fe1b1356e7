"""GPU smoke check: the native engine and one DeepSpeed train step on CUDA, and whether they agree.

A Qwen3 model with the shapes of Qwen3-0.6B (28 layers, hidden 1024, 16 query / 8 KV heads of 128,
MLP 3072, 151,936 embedding rows; ~0.6B parameters) is made here by `create_default_model`: random init,
the project's byte-level tokenizer, nothing downloaded. Then, in one process:

1. the native engine (`inference_svc.engine.NativeEngine`, bf16) samples `--requests` completions of
   `--new-tokens` tokens from random byte prompts: generated tokens/s;
2. the trainer (`trainer_svc.trainer.Trainer`: DeepSpeed, ZeRO `--zero-stage`, bf16 with fp32 master
   weights) recomputes the logprob of every sampled token with its own forward (`tree_pack.forward_logprobs`
   over the micro-batches `micro_batches.build_micro_batches` packs) and compares it with the logprob the
   engine reported: max / mean abs difference, the max asserted against `--tolerance`;
3. one GRPO train step on those samples as trajectories: its wall time and trained tokens/s.

Exit status 1 when the logprobs disagree beyond the tolerance or the step is not finite. A few minutes
on one H200 (most of it making and loading the model). Without a GPU, `--device cpu --tiny` runs the same
logic on a 2-layer model in fp32 (DeepSpeed's CPU accelerator, gloo), which is what the CPU test runs;
`--device auto` (the default) falls back to exactly that when torch sees no GPU, so `make bench` passes
on a CPU machine.

    .venv/bin/python bench/gpu_smoke.py                          # on a GPU machine
    .venv/bin/python bench/gpu_smoke.py --device cpu --tiny      # the logic, here
Last line: `ratio generation vs train-step tokens/s: X.XXx`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from rich.console import Console
from rich.table import Table

from inference_svc.default_model import DefaultModelSpec, create_default_model
from inference_svc.engine import NativeEngine
from schemas.events import Trajectory, TrajectoryNode
from schemas.inference.types import GenerationResult, SamplingOptions
from schemas.packed import Float32s, Int32s, UInt8s
from trainer_svc.config import EngineConfig, Precision, TrainerConfig
from trainer_svc.micro_batches import build_micro_batches
from trainer_svc.trainer import Trainer, pack_trajectory
from trainer_svc.tree_pack import forward_logprobs

QWEN3_0_6B = DefaultModelSpec(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    head_dim=128, max_position_embeddings=4096, initializer_range=0.02, vocab_size=151_936,
)
TINY = DefaultModelSpec(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=1024,
)
PROMPT_VOCAB = 256  # prompts are random bytes: valid tokens of the default tokenizer
GROUP_SIZE = 4
# bf16 keeps 8 bits of mantissa: over 28 layers a token's logprob from the engine's cached decode and from
# the trainer's packed full forward typically differ by a few hundredths; fp32 agrees to rounding.
TOLERANCE = {"bf16": 0.25, "fp32": 1e-3}
console = Console()


@dataclass(frozen=True)
class Args:
    device: Literal["cuda", "cpu"]
    tiny: bool
    precision: Precision
    requests: int
    prompt_len: int
    new_tokens: int
    zero_stage: Literal[0, 1, 2]
    tolerance: float
    threads: int | None
    work_dir: Path | None


def parse_args(argv: Sequence[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: cuda when torch sees a GPU, else cpu with --tiny")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model instead of the Qwen3-0.6B shapes")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=None,
                        help="engine dtype and trainer precision (default: bf16 on cuda, fp32 on cpu)")
    parser.add_argument("--requests", type=int, default=None, help="completions sampled (default 64; 4 on cpu)")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens per completion (default 256; 16 on cpu)")
    parser.add_argument("--zero-stage", type=int, choices=(0, 1, 2), default=1)
    parser.add_argument("--tolerance", type=float, default=None,
                        help="largest allowed abs logprob difference (default: 0.25 bf16, 1e-3 fp32)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the model is written (default: a temp dir)")
    ns = parser.parse_args(argv)
    device, tiny = ns.device, ns.tiny
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu" and not tiny:
            console.print("no CUDA GPU: running the CPU stand-in (--device cpu --tiny), not the GPU check")
            tiny = True
    on_cpu = device == "cpu"
    precision = cast(Precision, ns.precision or ("fp32" if on_cpu else "bf16"))
    return Args(
        device=cast(Literal["cuda", "cpu"], device), tiny=tiny, precision=precision,
        requests=ns.requests or (4 if on_cpu else 64), prompt_len=ns.prompt_len,
        new_tokens=ns.new_tokens or (16 if on_cpu else 256), zero_stage=cast(Literal[0, 1, 2], ns.zero_stage),
        tolerance=ns.tolerance if ns.tolerance is not None else TOLERANCE[precision], threads=ns.threads,
        work_dir=ns.work_dir,
    )


@dataclass(frozen=True)
class Generation:
    results: list[GenerationResult]
    tokens_per_s: float
    load_s: float


def generate(model_dir: Path, args: Args) -> Generation:
    """Samples every request at once through the engine (after a short warm-up request), then stops it."""
    started = time.perf_counter()
    dtype = "bfloat16" if args.precision == "bf16" else "float32"
    with NativeEngine(model_dir, device=args.device, dtype=dtype, max_running_requests=args.requests,
                      max_context=args.prompt_len + args.new_tokens + 1, seed=0,
                      kv_initial_tokens=args.prompt_len + args.new_tokens) as engine:
        load_s = time.perf_counter() - started
        engine.generate([1, 2, 3], SamplingOptions(max_new_tokens=4, ignore_eos=True, seed=0))
        rng = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, PROMPT_VOCAB, (args.requests, args.prompt_len), generator=rng).tolist()
        began = time.perf_counter()
        futures = [engine.submit(p, SamplingOptions(max_new_tokens=args.new_tokens, ignore_eos=True, seed=i))
                   for i, p in enumerate(prompts)]
        results = [f.result() for f in futures]
        elapsed = time.perf_counter() - began
    generated = sum(len(r.output_ids) for r in results)
    return Generation(results, generated / elapsed, load_s)


def as_trajectory(result: GenerationResult, index: int) -> Trajectory:
    """One sampled completion as a one-node session tree: the prompt given, the completion generated with
    the engine's logprobs and versions (what the capture proxy and trajectory processor would record).
    Rewards differ inside each group of GROUP_SIZE, so GRPO advantages are not zero."""
    prompt, output = result.prompt_ids, result.output_ids
    node = TrajectoryNode(
        node_id=0, parent=-1, token_ids=Int32s(prompt + output),
        loss_mask=UInt8s([0] * len(prompt) + [1] * len(output)),
        logprobs=Float32s([0.0] * len(prompt) + result.output_logprobs),
        versions=Int32s([-1] * len(prompt) + result.output_versions),
    )
    version = result.weight_version
    return Trajectory(
        trajectory_id=f"smoke-{index}", session_id=f"smoke-{index}", agent_id="gpu-smoke",
        group_id=f"g{index // GROUP_SIZE}", reward=float(index % GROUP_SIZE), status="completed", nodes=(node,),
        min_version=version, max_version=version, tokens_in_calls=len(prompt) + len(output),
        tokens_in_tree=len(prompt) + len(output),
    )


@dataclass(frozen=True)
class Agreement:
    max_abs: float
    mean_abs: float
    tokens: int


@torch.no_grad()
def logprob_agreement(trainer: Trainer, trajectories: Sequence[Trajectory]) -> Agreement:
    """The trainer's logprob of every generated token (its own packing and forward, current weights) against
    the engine's, over the tokens the loss would train on."""
    trees = [pack_trajectory(t) for t in trajectories]
    config = trainer.config
    diffs = []
    for mb in build_micro_batches(trees, trainer.version, config.engine.micro_batch_tokens,
                                  config.algorithm.max_staleness):
        ours = forward_logprobs(trainer.policy.engine, mb.batch).float().cpu()
        diffs.append((ours - mb.batch.behaviour_logprobs)[mb.train_mask].abs())
    every = torch.cat(diffs)
    return Agreement(float(every.max()), float(every.mean()), int(every.numel()))


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # The Makefile exports DS_ACCELERATOR=cpu for the CPU test suite; this check picks its device itself.
    os.environ["DS_ACCELERATOR"] = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = TINY if args.tiny else QWEN3_0_6B
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-", dir=args.work_dir) as tmp:
        started = time.perf_counter()
        model_dir = create_default_model(Path(tmp) / "model", spec)
        make_s = time.perf_counter() - started
        gen = generate(model_dir, args)
        trajectories = [as_trajectory(r, i) for i, r in enumerate(gen.results)]
        started = time.perf_counter()
        trainer = Trainer(TrainerConfig(
            model_path=str(model_dir),
            engine=EngineConfig(device=args.device, precision=args.precision, zero_stage=args.zero_stage,
                                micro_batch_tokens=8192, learning_rate=1e-5),
        ))
        trainer_s = time.perf_counter() - started
        agreement = logprob_agreement(trainer, trajectories)
        started = time.perf_counter()
        step = trainer.train_step(trajectories, policy_version=0)
        synchronize(args.device)
        step_s = time.perf_counter() - started
    params = sum(p.numel() for p in trainer.model.parameters())
    train_tps = step.num_tokens / step_s
    table = Table("measure", "value", title=f"GPU smoke: {params / 1e6:.1f}M-parameter Qwen3 on {args.device}, "
                                              f"{args.precision}, ZeRO {args.zero_stage}")
    for measure, value in (
        ("model made / engine loaded / trainer ready (s)", f"{make_s:.1f} / {gen.load_s:.1f} / {trainer_s:.1f}"),
        (f"generation: {args.requests} requests x {args.new_tokens} tokens", f"{gen.tokens_per_s:,.0f} tokens/s"),
        (f"logprob |engine - trainer| over {agreement.tokens} tokens: max / mean",
         f"{agreement.max_abs:.5f} / {agreement.mean_abs:.5f} (tolerance {args.tolerance:g})"),
        ("train step (wall s / trainer's ms)", f"{step_s:.2f} / {step.duration_ms:.0f}"),
        ("train step tokens/s", f"{train_tps:,.0f}"),
        ("loss / grad norm / kl(behaviour)", f"{step.loss:.4f} / {step.grad_norm:.4f} / {step.kl_behaviour:.2e}"),
    ):
        table.add_row(measure, value)
    console.print(table)
    print(f"max abs logprob diff engine vs trainer: {agreement.max_abs:.6f}")
    print(f"ratio generation vs train-step tokens/s: {gen.tokens_per_s / train_tps:.2f}x")
    failures = []
    if not agreement.max_abs <= args.tolerance:
        failures.append(f"logprobs disagree: max abs diff {agreement.max_abs:.5f} > tolerance {args.tolerance:g}")
    if not (torch.isfinite(torch.tensor([step.loss, step.grad_norm])).all() and step.new_version == 1):
        failures.append(f"train step not finite or no new version: loss {step.loss}, grad norm {step.grad_norm}")
    for failure in failures:
        console.print(f"[red]FAILED:[/] {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
