"""Side by side with TRL: the same GRPO job trained by TRL's GRPOTrainer and by SeamlessFlow, one after the
other in one run, on this machine (issue 38).

Single-turn workload (the seed paper's §5.1.1): the demo's calculator tasks answered in one reply, no tool
offered (SeamlessFlow: `examples.calculator.agent:DirectAgent`, reward `examples.calculator.reward:correct`;
TRL: a conversational dataset of the same [system, user] prompts and the same verifier on the reply).
Both start from the demo's cached warm-up (one Hugging Face directory: weights, tokenizer, chat template),
and every setting TRL has is taken from the demo's run config (`job_settings`, `grpo_args`); what cannot be
matched is printed (`UNMATCHED`).

One evaluator for both (`HeldOutEvaluator`): greedy `transformers.generate` on the demo's held-out tasks,
applied in this process to the checkpoints each system wrote (TRL's `checkpoint-N`, SeamlessFlow's
`weights/<run>/v<N>`), each checkpoint timed by when it was written since its system's start. Printed per
system: held-out accuracy against wall time, wall time to reach `--target`, samples/s, generated tokens/s,
CPU seconds by process (this process's descendants only: the machine may be shared). Final lines:
`ratio time-to-accuracy TRL / SeamlessFlow (single-turn): N.NNx`, `ratio samples/s SeamlessFlow / TRL
(single-turn): N.NNx`.

    .venv/bin/python bench/vs_trl.py [--steps 40] [--eval-every 5] [--target 0.3]

TRL runs in a child process (`--trl-worker`), with torch on both cores; SeamlessFlow runs as `sflow train`
does (infra.demo.run: engines pinned one per core, the trainer on r1's core) on one broker started first.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.calculator.agent import SYSTEM_PROMPT
from examples.calculator.tasks import ArithmeticTask
from examples.calculator.verifier import verify
from infra.example import load_reference
from infra.run_config import RunConfig
from infra.run_inputs import task_rows

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "infra" / "configs" / "demo.yaml"
TOOL_CALL_MARK = "<tool_call>"
WORKLOAD = "single-turn"
# SeamlessFlow's loss aggregation -> TRL's loss_type with the same normalisation when a train step is one
# TRL batch (gradient_accumulation_steps 1): "grpo" averages each sequence's token losses then the sequences
# (trl/trainer/grpo_trainer.py, `loss_type in ["grpo", "sapo"]`), "bnpo" divides by the batch's tokens,
# "dr_grpo" by sequences x max_completion_length.
TRL_LOSS_TYPE = {"seq_mean_token_mean": "grpo", "token_mean": "bnpo", "seq_mean_token_sum_norm": "dr_grpo"}
UNMATCHED = (
    "policy lag: SeamlessFlow is off-policy (scheduler.max_staleness samples may come from up to that many "
    "versions back, importance-weighted with iw_cap); TRL generates each step's batch with the current weights",
    "dynamic sampling: SeamlessFlow's trainer drops groups whose samples share one reward and the scheduler "
    "refills (up to train_batch_groups + dynamic_sampling_extra_groups groups a step); TRL trains every group "
    "(zero-variance groups get advantage 0 but count in the loss mean)",
    "task order: SeamlessFlow's scheduler dispatches the tasks file in its order; TRL's sampler shuffles it",
    "process layout: SeamlessFlow runs engines (one per core, 1 torch thread each), trainer (r1's core), "
    "capture proxy, Kafka broker, trajectory processor, scheduler, analytics; TRL one process, 2 torch threads",
    "generation: SeamlessFlow's native engine (continuous batching, KV cache, sampling seeded per engine); TRL "
    "transformers.generate on the whole step's batch (padded), its own RNG",
    "sampling RNG: the same seeds give different samples in the two systems",
)


@dataclass(frozen=True)
class JobSettings:
    """What both systems train with, from the run config."""

    group_size: int
    groups_per_step: int
    learning_rate: float
    aggregation: str
    clip_low: float
    clip_high: float
    kl_coef: float
    normalize_std: bool
    overlong_mask: bool
    max_tokens: int
    temperature: float
    steps: int
    seed: int

    @property
    def trl_loss_type(self) -> str:
        if self.aggregation not in TRL_LOSS_TYPE:
            raise ValueError(f"trainer.algorithm.aggregation={self.aggregation!r} has no TRL loss_type with the same "
                             f"normalisation (matched: {sorted(TRL_LOSS_TYPE)})")
        return TRL_LOSS_TYPE[self.aggregation]


def job_settings(config: RunConfig) -> JobSettings:
    algorithm = config.trainer.algorithm
    return JobSettings(
        group_size=config.scheduler.samples_per_task, groups_per_step=config.scheduler.train_batch_groups,
        learning_rate=config.trainer.learning_rate, aggregation=algorithm.aggregation, clip_low=algorithm.clip_eps,
        clip_high=algorithm.clip_eps_high or algorithm.clip_eps, kl_coef=algorithm.kl_coef,
        normalize_std=algorithm.normalize_std, overlong_mask=algorithm.overlong_mask,
        max_tokens=config.agent.max_tokens, temperature=config.agent.temperature, steps=config.run.max_steps,
        seed=config.seed)


def grpo_args(s: JobSettings, output_dir: Path, save_every: int) -> dict[str, Any]:
    """trl.GRPOConfig's arguments for the same job: one train step = one generation batch = one optimizer update
    of groups_per_step groups of group_size samples; AdamW with the trainer's defaults (betas 0.9/0.999, eps
    1e-8, no weight decay, gradient norm clipped at 1.0: TRL's defaults too), constant learning rate."""
    batch = s.group_size * s.groups_per_step
    return {
        "output_dir": str(output_dir), "use_cpu": True, "report_to": "none", "disable_tqdm": True,
        "seed": s.seed, "max_steps": s.steps, "logging_steps": 1,
        "save_strategy": "steps", "save_steps": save_every, "save_only_model": True,
        "per_device_train_batch_size": batch, "gradient_accumulation_steps": 1, "num_generations": s.group_size,
        "generation_batch_size": batch, "num_iterations": 1,
        "learning_rate": s.learning_rate, "lr_scheduler_type": "constant", "warmup_steps": 0, "weight_decay": 0.0,
        "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0,
        "loss_type": s.trl_loss_type, "epsilon": s.clip_low, "epsilon_high": s.clip_high, "beta": s.kl_coef,
        "scale_rewards": "group" if s.normalize_std else "none", "mask_truncated_completions": s.overlong_mask,
        "max_completion_length": s.max_tokens, "temperature": s.temperature, "top_p": 1.0,
        "use_vllm": False, "bf16": False, "dataloader_num_workers": 0,
    }


def reply_score(text: str, answer: float) -> float:
    """A single-turn reply's score, the same for training and evaluation in both systems: the verifier on its
    text; a reply that writes a tool call answers nothing (SeamlessFlow's proxy parses it into tool_calls)."""
    if TOOL_CALL_MARK in text:
        return 0.0
    return verify(text, ArithmeticTask("", "", answer))


def prompt_of(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def single_turn_config(base: RunConfig, steps: int) -> RunConfig:
    data = base.model_dump(mode="json")
    data["name"] = "vs-trl-single"
    data["example"] = {**data["example"], "agent": "examples.calculator.agent:DirectAgent",
                       "reward": "examples.calculator.reward:correct"}
    data["agent"] = {**data["agent"], "max_turns": 1}
    data["eval"] = {**data["eval"], "enabled": False}  # evaluated here, on the checkpoints, as TRL's are
    data["run"] = {**data["run"], "max_steps": steps, "max_minutes": 60}
    return RunConfig.model_validate(data)


def train_rows(config: RunConfig) -> list[dict[str, Any]]:
    example = config.example
    assert example.tasks is not None
    tasks = load_reference(example.tasks)(config.tasks.count, config.tasks.seed, **example.tasks_options)
    return task_rows(tasks, f"example.tasks={example.tasks!r}")


def eval_rows(config: RunConfig) -> list[dict[str, Any]]:
    """The run's held-out tasks, as infra.run_inputs.write_eval_tasks makes them."""
    from infra.evaluation import held_out_rows

    example = config.example
    assert example.tasks is not None
    generator = load_reference(example.tasks)
    source = f"example.tasks={example.tasks!r}"
    return held_out_rows(lambda n, seed: task_rows(generator(n, seed, **example.tasks_options), source),
                         config.eval.tasks, config.eval.seed, train_rows(config))


class HeldOutEvaluator:
    """Greedy held-out accuracy of a checkpoint: one batched `generate` over every held-out prompt (left
    padded), each reply cut at the chat format's end token and scored by `reply_score`."""

    def __init__(self, tokenizer_dir: Path, rows: Sequence[Mapping[str, Any]], max_tokens: int) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.tokenizer.padding_side = "left"
        self.rows = list(rows)
        self.max_tokens = max_tokens
        texts = [self.tokenizer.apply_chat_template(prompt_of(r["question"]), tokenize=False,
                                                    add_generation_prompt=True) for r in self.rows]
        self.inputs = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        self.stop_ids = [i for t in ("<|im_end|>", "<|endoftext|>")
                         if (i := self.tokenizer.convert_tokens_to_ids(t)) is not None]

    def replies(self, checkpoint: Path) -> list[str]:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
        with torch.inference_mode():
            out = model.generate(**self.inputs, do_sample=False, max_new_tokens=self.max_tokens,
                                 eos_token_id=self.stop_ids, pad_token_id=self.tokenizer.pad_token_id)
        generated = out[:, self.inputs["input_ids"].shape[1]:]
        return [self._reply(ids) for ids in generated.tolist()]

    def _reply(self, ids: list[int]) -> str:
        for i, token in enumerate(ids):
            if token in self.stop_ids:
                ids = ids[:i]
                break
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def accuracy(self, checkpoint: Path) -> float:
        replies = self.replies(checkpoint)
        return sum(reply_score(t, float(r["answer"])) for t, r in zip(replies, self.rows, strict=True)) / len(replies)


@dataclass
class SystemRun:
    """What one system's run left: its checkpoints (step -> directory, seconds since its start when written),
    its throughput and its CPU by process."""

    name: str
    wall_s: float
    checkpoints: dict[int, tuple[Path, float]]
    samples: int
    tokens: int
    loop_s: float  # the span samples/s and tokens/s are measured on
    cpu: dict[str, float] = field(default_factory=dict)
    accuracy: dict[int, float] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / max(self.loop_s, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.loop_s, 1e-9)

    def time_to(self, target: float) -> float | None:
        """Seconds since start of the first checkpoint whose held-out accuracy reaches `target` (None: none)."""
        reached = [self.checkpoints[s][1] for s in sorted(self.accuracy) if self.accuracy[s] >= target - 1e-9]
        return min(reached) if reached else None


# ---------------------------------------------------------------------------------------------- CPU by process
PROGRAMS = {"inference_svc": "engines", "trainer_svc": "trainer", "agents_adapter.proxy": "proxy",
            "agents_adapter.processor": "processor", "scheduler_svc": "scheduler", "infra.analytics": "analytics",
            "infra.rollout_workers": "agents"}


def program(args: Sequence[str]) -> str:
    if "--trl-worker" in args:
        return "TRL (trainer process)"
    if "-m" in args[:-1]:
        module = args[list(args).index("-m") + 1]
        return PROGRAMS.get(module, module)
    if any(a.endswith("kafka.Kafka") for a in args):
        return "broker"
    return "driver (sflow train's process: run monitor)"


class ProcessCpu:
    """CPU seconds of this process and its descendants by program, sampled in the background (a process that
    exited keeps its last count); `totals()` at two instants gives what each program spent between them."""

    def __init__(self, every_s: float = 0.5) -> None:
        self._last: dict[int, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def __enter__(self) -> ProcessCpu:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.sample()

    def sample(self) -> None:
        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            try:
                spent = proc.cpu_times()
                label = program(proc.cmdline())
            except psutil.Error:
                continue
            with self._lock:
                self._last[proc.pid] = (label, spent.user + spent.system)

    def totals(self) -> dict[str, float]:
        self.sample()
        out: defaultdict[str, float] = defaultdict(float)
        with self._lock:
            for label, seconds in self._last.values():
                out[label] += seconds
        return dict(out)


def spent_between(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {p: s - before.get(p, 0.0) for p, s in after.items() if s - before.get(p, 0.0) >= 0.05}


# ---------------------------------------------------------------------------------------------------- TRL side
def trl_worker(spec_file: Path) -> None:
    """The TRL run (a child process): GRPOTrainer on the job; writes when each checkpoint was saved and each
    step's completion lengths to `result.json` beside its checkpoints."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    t0 = time.monotonic()
    spec = json.loads(spec_file.read_text())
    torch.set_num_threads(spec["threads"])
    settings = JobSettings(**spec["settings"])
    out = Path(spec["output_dir"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    dataset = Dataset.from_list([{"prompt": prompt_of(r["question"]), "answer": float(r["answer"])}
                                 for r in spec["train_rows"]])

    def correct(completion_ids: list[list[int]], answer: list[float], **_: Any) -> list[float | None]:
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=False)
        return [reply_score(t.split("<|im_end|>")[0], a) for t, a in zip(texts, answer, strict=True)]

    record: dict[str, Any] = {"saved": {}, "tokens": 0, "samples": 0}

    class Timing(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            record["loop_start_s"] = time.monotonic() - t0

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs = kwargs.get("logs") or {}
            if "completions/mean_length" in logs:
                batch = settings.group_size * settings.groups_per_step
                record["tokens"] += round(logs["completions/mean_length"] * batch)
                record["samples"] += batch

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            record["saved"][state.global_step] = time.monotonic() - t0

    trainer = GRPOTrainer(model=model, reward_funcs=correct, args=GRPOConfig(**spec["grpo_args"]),
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[Timing()])
    trainer.train()
    record["loop_end_s"] = time.monotonic() - t0
    (out / "result.json").write_text(json.dumps(record))


def run_trl(settings: JobSettings, model: Path, rows: list[dict[str, Any]], out: Path, save_every: int,
            cpu: ProcessCpu) -> SystemRun:
    spec = {"threads": len(os.sched_getaffinity(0)), "settings": asdict(settings), "output_dir": str(out),
            "model": str(model), "train_rows": rows, "grpo_args": grpo_args(settings, out, save_every)}
    out.mkdir(parents=True, exist_ok=True)
    spec_file = out / "spec.json"
    spec_file.write_text(json.dumps(spec))
    before, t0 = cpu.totals(), time.monotonic()
    with (out / "trl.log").open("w") as log:  # its per-step logs: a file, not this table
        subprocess.run([sys.executable, __file__, "--trl-worker", str(spec_file)], check=True, stdout=log,
                       stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    record = json.loads((out / "result.json").read_text())
    checkpoints = {int(step): (out / f"checkpoint-{step}", float(s)) for step, s in record["saved"].items()}
    return SystemRun("TRL", wall, checkpoints, record["samples"], record["tokens"],
                     record["loop_end_s"] - record["loop_start_s"], spent_between(before, cpu.totals()))


# ------------------------------------------------------------------------------------------- SeamlessFlow side
def run_seamlessflow(config: RunConfig, runs_root: Path, save_every: int, cpu: ProcessCpu) -> SystemRun:
    from infra.demo import run
    from infra.kafka.cluster import KafkaCluster, free_base_port

    cluster = KafkaCluster(runs_root / "kafka", nodes=1, base_port=free_base_port())
    cluster.start()  # before the clock: a broker is long-lived infrastructure, as TRL's machine is
    try:
        before, t0, t0_wall = cpu.totals(), time.monotonic(), time.time()
        result = run(config, runs_root=runs_root, cluster=cluster)
        wall = time.monotonic() - t0
        spent = spent_between(before, cpu.totals())
    finally:
        cluster.stop()
    weights = result.root / "weights" / config.name
    checkpoints = {}
    for step in range(save_every, config.run.max_steps + 1, save_every):
        directory = weights / f"v{step:06d}"  # trainer_svc.service.checkpoint_dir
        if (directory / "model.safetensors").exists():
            checkpoints[step] = (directory, (directory / "model.safetensors").stat().st_mtime - t0_wall)
    state = result.state
    first = state.output_tokens[0][0] if state.output_tokens else state.end_ms
    return SystemRun("SeamlessFlow", wall, checkpoints, state.trajectories, sum(n for _, n in state.output_tokens),
                     (state.end_ms - first) / 1000, spent)


# --------------------------------------------------------------------------------------------------- reporting
def settings_lines(s: JobSettings) -> list[str]:
    return [f"matched: group size (num_generations) {s.group_size}, groups per step {s.groups_per_step}, "
            f"learning rate {s.learning_rate} (constant AdamW, betas 0.9/0.999, eps 1e-8, no weight decay, "
            f"grad-norm clip 1.0), aggregation {s.aggregation} = TRL loss_type {s.trl_loss_type!r}, clip "
            f"[{s.clip_low}, {s.clip_high}] (epsilon, epsilon_high), KL {s.kl_coef} (beta), std-normalised "
            f"advantages {s.normalize_std} (scale_rewards), truncated completions masked {s.overlong_mask} "
            f"(mask_truncated_completions), max tokens {s.max_tokens}, temperature {s.temperature}, {s.steps} "
            f"steps, one epoch of updates per batch (num_iterations 1), same warmed model, tokenizer, chat "
            f"template, tasks, held-out tasks and reward", "not matched:", *(f"  - {u}" for u in UNMATCHED)]


def ratio_lines(trl: SystemRun, sflow: SystemRun, target: float) -> list[str]:
    """The closing lines. A system that never reached the target is counted at its whole run's wall time (a
    bound, said in the line before)."""
    lines = []
    t_trl, t_sf = trl.time_to(target), sflow.time_to(target)
    for run, t in ((trl, t_trl), (sflow, t_sf)):
        if t is None:
            lines.append(f"note: {run.name} did not reach held-out accuracy {target:.2f}; its wall time "
                         f"{run.wall_s:.0f} s is used, so the time ratio is a bound")
    time_ratio = (t_trl if t_trl is not None else trl.wall_s) / max(t_sf if t_sf is not None else sflow.wall_s, 1e-9)
    lines.append(f"ratio time-to-accuracy TRL / SeamlessFlow ({WORKLOAD}): {time_ratio:.2f}x")
    lines.append(f"ratio samples/s SeamlessFlow / TRL ({WORKLOAD}): "
                 f"{sflow.samples_per_s / max(trl.samples_per_s, 1e-9):.2f}x")
    return lines


def print_report(runs: Sequence[SystemRun], start_accuracy: float, target: float) -> None:
    print(f"\nheld-out accuracy (greedy, one evaluator) against wall time; both start at {start_accuracy:.3f}")
    for r in runs:
        points = "  ".join(f"step {s}: {r.accuracy[s]:.3f} @ {r.checkpoints[s][1]:.0f}s" for s in sorted(r.accuracy))
        print(f"  {r.name:>12}: {points}")
    print(f"\n{'system':>12}  {'wall s':>7}  {'to ' + format(target, '.2f') + ' s':>9}  {'samples':>7}  "
          f"{'samples/s':>9}  {'tokens/s':>8}  CPU s by process")
    for r in runs:
        t = r.time_to(target)
        cpu = ", ".join(f"{p} {s:.1f}" for p, s in sorted(r.cpu.items(), key=lambda kv: -kv[1]))
        print(f"{r.name:>12}  {r.wall_s:>7.1f}  {'-' if t is None else format(t, '.1f'):>9}  {r.samples:>7}  "
              f"{r.samples_per_s:>9.2f}  {r.tokens_per_s:>8.1f}  {cpu} (total {sum(r.cpu.values()):.1f})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="train steps of each system")
    parser.add_argument("--eval-every", type=int, default=5, help="checkpoints evaluated every this many steps")
    parser.add_argument("--target", type=float, default=0.3, help="held-out accuracy whose wall time is compared")
    parser.add_argument("--config", type=Path, default=DEMO_CONFIG)
    parser.add_argument("--trl-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trl_worker is not None:
        trl_worker(args.trl_worker)
        return
    from infra.launcher import stop_on_sigterm
    from infra.run_inputs import RunPaths, prepare_model

    logging.basicConfig(level="WARNING")
    stop_on_sigterm()
    config = single_turn_config(RunConfig.load(args.config), args.steps)
    settings = job_settings(config)
    print(f"trl {metadata.version('trl')}, transformers {metadata.version('transformers')}, "
          f"torch {metadata.version('torch')}; workload {WORKLOAD}; {os.cpu_count()} cores")
    print("\n".join(settings_lines(settings)))
    with tempfile.TemporaryDirectory() as tmp, ProcessCpu() as cpu:
        root = Path(tmp)
        model = prepare_model(config, RunPaths(root / "warm"))  # the demo's cached warm-up, shared by both
        evaluator = HeldOutEvaluator(model, eval_rows(config), settings.max_tokens)
        runs = [run_trl(settings, model, train_rows(config), root / "trl", args.eval_every, cpu),
                run_seamlessflow(config, root / "sflow", args.eval_every, cpu)]
        start_accuracy = evaluator.accuracy(model)
        for r in runs:
            r.accuracy = {step: evaluator.accuracy(path) for step, (path, _) in r.checkpoints.items()}
    print_report(runs, start_accuracy, args.target)
    print("\n".join(ratio_lines(runs[0], runs[1], args.target)))


if __name__ == "__main__":
    main()
