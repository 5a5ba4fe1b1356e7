"""Side by side with TRL: the same GRPO job trained by TRL's GRPOTrainer and by SeamlessFlow, one after the
other in one run, on this machine (issue 38).

Two workloads on the demo's calculator tasks:
- single-turn (the seed paper's §5.1.1): the answer in one reply, no tool offered (SeamlessFlow:
  `examples.calculator.agent:DirectAgent`, reward `examples.calculator.reward:correct`; TRL: a
  conversational dataset of the same [system, user] prompts and the same verifier on the reply);
- multi-turn tool (§5.1.2): the demo's job as it is (SeamlessFlow: the calculator agent, shaped reward, up to
  `agent.max_turns` calls); TRL: `tools=[calculator]` (the same tool runner and schema), its replies parsed
  with TRL's Qwen3 response template (read from the installed trl: the demo's ChatML writes tool calls in
  the Hermes/Qwen form, and its template is prefix-preserving, which TRL checks), and the same shaped reward
  computed from the conversation.
Both start from the demo's cached warm-up (one Hugging Face directory: weights, tokenizer, chat template),
and every setting TRL has is taken from the demo's run config (`job_settings`, `grpo_args`); what cannot be
matched is printed (`UNMATCHED`).

One evaluator for both (`HeldOutEvaluator`): greedy `transformers.generate` on the demo's held-out tasks,
applied in this process to the checkpoints each system wrote (TRL's `checkpoint-N`, SeamlessFlow's
`weights/<run>/v<N>`), each checkpoint timed by when it was written since its system's start. Printed per
system: held-out accuracy against wall time, wall time to reach `--target`, samples/s, generated tokens/s,
CPU seconds by process (this process's descendants only: the machine may be shared). Final lines:
`ratio time-to-accuracy TRL / SeamlessFlow (<workload>): N.NNx`, `ratio samples/s SeamlessFlow / TRL
(<workload>): N.NNx`, per workload.

    .venv/bin/python bench/vs_trl.py [--workload single-turn|multi-turn|both] [--steps 40] [--eval-every 5]
        [--target 0.8]

TRL runs in a child process (`--trl-worker`), with torch on both cores; SeamlessFlow runs as `sflow train`
does (infra.demo.run: engines pinned one per core, the trainer on r1's core) on one broker started first.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pipeline_e2e import PROGRAMS  # the job's processes by module, as pipeline_e2e's CPU table names them
from examples.calculator.agent import SYSTEM_PROMPT, EpisodeResult
from examples.calculator.reward import shaped_reward
from examples.calculator.tasks import ArithmeticTask
from examples.calculator.tool import CALCULATOR, CALCULATOR_TOOL, run_tool
from examples.calculator.verifier import verify
from infra.example import load_reference
from infra.run_config import RunConfig
from infra.run_inputs import task_rows

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "infra" / "configs" / "demo.yaml"
TOOL_CALL_MARK = "<tool_call>"
SINGLE, MULTI, THROUGHPUT = "single-turn", "multi-turn tool", "throughput"
WORKLOADS = {"single-turn": (SINGLE,), "multi-turn": (MULTI,), "both": (SINGLE, MULTI)}
# --throughput: a model where generation, not per-call bookkeeping, dominates (~30M parameters with the bpe
# vocabulary), untrained (no warm-up: nothing is learned), fixed-length replies (ignore_eos)
THROUGHPUT_SHAPE = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 10,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64}
THROUGHPUT_TOKENS = 256
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
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
UNMATCHED_MULTI = (
    "max tokens: SeamlessFlow's agent.max_tokens bounds each call; TRL's max_completion_length bounds the whole "
    "episode (model tokens and tool results): set to max_tokens x max_turns",
    "turns: SeamlessFlow's agent stops after agent.max_turns replies; TRL after max_tool_calling_iterations = "
    "max_turns - 1 tool rounds (the same number of replies)",
    "tool-call parsing: SeamlessFlow's capture proxy parses the replies; TRL (and this bench's evaluator) with "
    "transformers' parse_response and TRL's Qwen3 response template: a malformed call may be read differently",
)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+, -, *, /, //, %, **, parentheses).

    Args:
        expression: e.g. (12 + 7) * 3
    """
    return run_tool(CALCULATOR, json.dumps({"expression": expression}))[0]



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
    max_turns: int
    temperature: float
    steps: int
    seed: int
    workload: str
    ignore_eos: bool = False

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
        max_tokens=config.agent.max_tokens, max_turns=config.agent.max_turns, temperature=config.agent.temperature,
        steps=config.run.max_steps, seed=config.seed, ignore_eos=config.agent.ignore_eos,
        workload=THROUGHPUT if config.agent.ignore_eos else SINGLE if config.agent.max_turns == 1 else MULTI)


def grpo_args(s: JobSettings, output_dir: Path, save_every: int) -> dict[str, Any]:
    """trl.GRPOConfig's arguments for the same job: one train step = one generation batch = one optimizer update
    of groups_per_step groups of group_size samples; AdamW with the trainer's defaults (betas 0.9/0.999, eps
    1e-8, no weight decay, gradient norm clipped at 1.0: TRL's defaults too), constant learning rate."""
    batch = s.group_size * s.groups_per_step
    multi = {"max_tool_calling_iterations": s.max_turns - 1} if s.workload == MULTI else {}
    fixed_length = {"generation_kwargs": {"min_new_tokens": s.max_tokens}} if s.ignore_eos else {}
    return {**multi, **fixed_length,
        "output_dir": str(output_dir), "use_cpu": True, "report_to": "none", "disable_tqdm": True,
        "seed": s.seed, "max_steps": s.steps, "logging_steps": 1,
        "save_strategy": "steps", "save_steps": save_every, "save_only_model": True,
        "per_device_train_batch_size": batch, "gradient_accumulation_steps": 1, "num_generations": s.group_size,
        "generation_batch_size": batch, "num_iterations": 1,
        "learning_rate": s.learning_rate, "lr_scheduler_type": "constant", "warmup_steps": 0, "weight_decay": 0.0,
        "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0,
        "loss_type": s.trl_loss_type, "epsilon": s.clip_low, "epsilon_high": s.clip_high, "beta": s.kl_coef,
        "scale_rewards": "group" if s.normalize_std else "none", "mask_truncated_completions": s.overlong_mask,
        "max_completion_length": s.max_tokens * s.max_turns, "temperature": s.temperature, "top_p": 1.0,
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


def workload_config(base: RunConfig, workload: str, steps: int) -> RunConfig:
    """The demo's job for a workload: single-turn with the direct agent and the correctness reward, multi-turn
    as the demo runs it; evaluated here (not by the run's own evaluator), for `steps` train steps."""
    data = base.model_dump(mode="json")
    data["name"] = {SINGLE: "vs-trl-single", MULTI: "vs-trl-multi", THROUGHPUT: "vs-trl-throughput"}[workload]
    if workload == THROUGHPUT:
        data["model"] = {**data["model"], "shape": THROUGHPUT_SHAPE, "warmup_steps": 0}
        data["agent"] = {**data["agent"], "max_tokens": THROUGHPUT_TOKENS, "ignore_eos": True}
        # nothing to learn from an untrained model's fixed-length replies: every step trains its batch as it is
        data["trainer"]["algorithm"] = {**data["trainer"]["algorithm"], "dynamic_sampling": False,
                                        "overlong_mask": False, "max_response_tokens": THROUGHPUT_TOKENS}
        data["scheduler"] = {**data["scheduler"], "dynamic_sampling_extra_groups": 0}
    if workload in (SINGLE, THROUGHPUT):
        data["example"] = {**data["example"], "agent": "examples.calculator.agent:DirectAgent",
                           "reward": "examples.calculator.reward:correct"}
        data["agent"] = {**data["agent"], "max_turns": 1}
    data["eval"] = {**data["eval"], "enabled": False}  # evaluated here, on the checkpoints, as TRL's are
    data["run"] = {**data["run"], "max_steps": steps, "max_minutes": 60}
    return RunConfig.model_validate(data)


def episode_of(messages: Sequence[Mapping[str, Any]]) -> EpisodeResult:
    """The calculator agent's episode (what the shaped reward reads) from a conversation's generated part:
    assistant replies and tool results, as TRL's completions and this bench's evaluator hold them."""
    result = EpisodeResult("", "")
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else ("" if content is None else json.dumps(content))
        if message["role"] == "assistant":
            result.turns += 1
            if not message.get("tool_calls"):
                result.answer, result.answered = text, True
        elif message["role"] == "tool":
            ok = not (text.startswith("error") or text.startswith('{"error"') or text.startswith("{'error'"))
            result.tool_calls += 1
            result.tool_errors += 0 if ok else 1
            result.last_tool_output = text if ok else ""
    return result


def task_of(row: Mapping[str, Any]) -> ArithmeticTask:
    return ArithmeticTask(str(row.get("task_id", "")), str(row["question"]), float(row["answer"]))


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
    """Greedy held-out accuracy of a checkpoint, the same code for both systems' checkpoints. Single-turn: one
    batched `generate` over every held-out prompt (left padded), each reply cut at the chat format's end and
    scored by `reply_score`. Multi-turn: the calculator agent's loop (at most `max_turns` replies, the tool run
    on each parsed call) over every task at once, each turn one batched `generate`, the final answer scored by
    the verifier (the demo's held-out score, `examples.calculator.reward:correct`)."""

    def __init__(self, tokenizer_dir: Path, rows: Sequence[Mapping[str, Any]], max_tokens: int, workload: str = SINGLE,
                 max_turns: int = 1) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.tokenizer.padding_side = "left"
        if workload == MULTI:
            from trl.chat_template_utils import qwen3_template

            self.tokenizer.response_template = qwen3_template  # the parser TRL's tool loop uses
        self.rows, self.max_tokens, self.workload, self.max_turns = list(rows), max_tokens, workload, max_turns
        self.stop_ids: list[int] = cast(list[int], self.tokenizer.convert_tokens_to_ids(list(STOP_TOKENS)))

    def _generate(self, model: Any, conversations: Sequence[list[dict[str, Any]]]) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, reply ids cut before the end token) of each conversation's next reply, greedy."""
        import torch

        tools: list[dict[Any, Any] | Callable[..., Any]] | None = [CALCULATOR_TOOL] if self.workload == MULTI else None
        texts = [self.tokenizer.apply_chat_template(c, tools=tools, tokenize=False, add_generation_prompt=True)
                 for c in conversations]
        inputs = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**inputs, do_sample=False, max_new_tokens=self.max_tokens,
                                 eos_token_id=self.stop_ids, pad_token_id=self.tokenizer.pad_token_id)
        width = inputs["input_ids"].shape[1]
        pairs = []
        for row, mask, ids in zip(inputs["input_ids"].tolist(), inputs["attention_mask"].tolist(),
                                  out[:, width:].tolist(), strict=True):
            stop = next((i for i, t in enumerate(ids) if t in self.stop_ids), len(ids))
            pairs.append(([t for t, m in zip(row, mask, strict=True) if m], ids[:stop]))
        return pairs

    def _load(self, checkpoint: Path) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()

    def replies(self, checkpoint: Path) -> list[str]:
        pairs = self._generate(self._load(checkpoint), [prompt_of(r["question"]) for r in self.rows])
        return [str(self.tokenizer.decode(ids, skip_special_tokens=False)) for _, ids in pairs]

    def episodes(self, checkpoint: Path) -> list[EpisodeResult]:
        model = self._load(checkpoint)
        conversations: list[list[dict[str, Any]]] = [prompt_of(r["question"]) for r in self.rows]
        active = list(range(len(conversations)))
        for _ in range(self.max_turns):
            if not active:
                break
            pairs = self._generate(model, [conversations[i] for i in active])
            still = []
            for i, (prompt, reply) in zip(active, pairs, strict=True):
                message = self._parsed(prompt, reply)
                conversations[i].append(message)
                for call in message.get("tool_calls") or []:
                    function = call.get("function", {})
                    content, _ = run_tool(str(function.get("name")), json.dumps(function.get("arguments")))
                    conversations[i].append({"role": "tool", "name": str(function.get("name")), "content": content})
                if message.get("tool_calls"):
                    still.append(i)
            active = still
        return [episode_of(c[2:]) for c in conversations]

    def _parsed(self, prompt: list[int], reply: list[int]) -> dict[str, Any]:
        """A reply as TRL's tool loop reads it (transformers' parse_response, TRL's Qwen3 response template);
        one that does not parse is its text."""
        try:
            message = dict(self.tokenizer.parse_response([*reply, self.stop_ids[0]], prefix=prompt))
        except (ValueError, KeyError, TypeError):
            message = {"content": self.tokenizer.decode(reply, skip_special_tokens=True)}
        message["role"] = "assistant"
        return message

    def accuracy(self, checkpoint: Path) -> float:
        if self.workload == MULTI:
            scores = [verify(e.answer, task_of(r)) for e, r in zip(self.episodes(checkpoint), self.rows, strict=True)]
        else:
            scores = [reply_score(t, float(r["answer"])) for t, r in zip(self.replies(checkpoint), self.rows,
                                                                          strict=True)]
        return sum(scores) / len(scores)


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
                spent, cmdline = proc.cpu_times(), proc.cmdline()
            except psutil.Error:
                continue
            # by its latest command line (a child just forked still shows this process's; one exiting, none)
            label = program(cmdline) if cmdline else self._last.get(proc.pid, ("unidentified (exited)", 0.0))[0]
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
        return [reply_score(t.split(STOP_TOKENS[0])[0], a) for t, a in zip(texts, answer, strict=True)]

    def shaped(completions: list[list[dict[str, Any]]], answer: list[float], **_: Any) -> list[float | None]:
        return [shaped_reward(episode_of(c), ArithmeticTask("", "", a)) for c, a in zip(completions, answer,
                                                                                          strict=True)]

    multi = settings.workload == MULTI
    if multi:
        from trl.chat_template_utils import qwen3_template

        tokenizer.response_template = qwen3_template  # the demo's ChatML writes calls in the Qwen3/Hermes form

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

    trainer = GRPOTrainer(model=model, reward_funcs=shaped if multi else correct,
                          args=GRPOConfig(**spec["grpo_args"]), train_dataset=dataset, processing_class=tokenizer,
                          tools=[calculator] if multi else None, callbacks=[Timing()])
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
            f"steps, one epoch of updates per batch (num_iterations 1), same model (weights), tokenizer, chat "
            f"template, tasks, held-out tasks and reward", "not matched:",
            *(f"  - {u}" for u in (*UNMATCHED, *(UNMATCHED_MULTI if s.workload == MULTI else ())))]


def ratio_lines(trl: SystemRun, sflow: SystemRun, target: float, workload: str) -> list[str]:
    """The closing lines. A system that never reached the target is counted at its whole run's wall time (a
    bound, said in the line before)."""
    lines = []
    t_trl, t_sf = trl.time_to(target), sflow.time_to(target)
    for run, t in ((trl, t_trl), (sflow, t_sf)):
        if t is None:
            lines.append(f"note: {run.name} did not reach held-out accuracy {target:.2f}; its wall time "
                         f"{run.wall_s:.0f} s is used, so the time ratio is a bound")
    time_ratio = (t_trl if t_trl is not None else trl.wall_s) / max(t_sf if t_sf is not None else sflow.wall_s, 1e-9)
    lines.append(f"ratio time-to-accuracy TRL / SeamlessFlow ({workload}): {time_ratio:.2f}x")
    lines.append(f"ratio samples/s SeamlessFlow / TRL ({workload}): "
                 f"{sflow.samples_per_s / max(trl.samples_per_s, 1e-9):.2f}x")
    return lines


def parameters(model: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), "pt") as weights:
        return sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118


def cpu_text(run: SystemRun) -> str:
    spent = ", ".join(f"{p} {s:.1f}" for p, s in sorted(run.cpu.items(), key=lambda kv: -kv[1]))
    return f"{spent} (total {sum(run.cpu.values()):.1f})"


def print_throughput(runs: Sequence[SystemRun]) -> None:
    print(f"\n{'system':>12}  {'wall s':>7}  {'loop s':>7}  {'samples':>7}  {'samples/s':>9}  {'tokens/s':>8}  "
          "CPU s by process")
    for r in runs:
        print(f"{r.name:>12}  {r.wall_s:>7.1f}  {r.loop_s:>7.1f}  {r.samples:>7}  {r.samples_per_s:>9.2f}  "
              f"{r.tokens_per_s:>8.1f}  {cpu_text(r)}")


def print_report(runs: Sequence[SystemRun], start_accuracy: float, target: float) -> None:
    print(f"\nheld-out accuracy (greedy, one evaluator) against wall time; both start at {start_accuracy:.3f}")
    for r in runs:
        points = "  ".join(f"step {s}: {r.accuracy[s]:.3f} @ {r.checkpoints[s][1]:.0f}s" for s in sorted(r.accuracy))
        print(f"  {r.name:>12}: {points}")
    print(f"\n{'system':>12}  {'wall s':>7}  {'to ' + format(target, '.2f') + ' s':>9}  {'samples':>7}  "
          f"{'samples/s':>9}  {'tokens/s':>8}  CPU s by process")
    for r in runs:
        t = r.time_to(target)
        print(f"{r.name:>12}  {r.wall_s:>7.1f}  {'-' if t is None else format(t, '.1f'):>9}  {r.samples:>7}  "
              f"{r.samples_per_s:>9.2f}  {r.tokens_per_s:>8.1f}  {cpu_text(r)}")


def compare(base: RunConfig, workload: str, args: argparse.Namespace, root: Path, cpu: ProcessCpu) -> list[str]:
    """One workload trained by both systems and evaluated; prints its report and returns its closing lines."""
    from infra.run_inputs import RunPaths, prepare_model

    config = workload_config(base, workload, args.steps)
    settings = job_settings(config)
    print(f"\n=== {workload}: {settings.steps} steps each ===")
    print("\n".join(settings_lines(settings)))
    model = prepare_model(config, RunPaths(root / f"model-{config.name}"))  # cached warm-up, shared by both
    print(f"model: {parameters(model) / 1e6:.1f}M parameters")
    runs = [run_trl(settings, model, train_rows(config), root / f"trl-{config.name}", args.eval_every, cpu),
            run_seamlessflow(config, root / f"sflow-{config.name}", args.eval_every, cpu)]
    if workload == THROUGHPUT:
        print_throughput(runs)
        return [f"ratio samples/s SeamlessFlow / TRL ({workload}): "
                f"{runs[1].samples_per_s / max(runs[0].samples_per_s, 1e-9):.2f}x"]
    evaluator = HeldOutEvaluator(model, eval_rows(config), settings.max_tokens, workload, settings.max_turns)
    start_accuracy = evaluator.accuracy(model)
    for r in runs:
        r.accuracy = {step: evaluator.accuracy(path) for step, (path, _) in r.checkpoints.items()}
    print_report(runs, start_accuracy, args.target)
    return ratio_lines(runs[0], runs[1], args.target, workload)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="both")
    parser.add_argument("--throughput", action="store_true", help=(
        f"throughput mode instead: a ~30M-parameter untrained model, {THROUGHPUT_TOKENS}-token replies (ignore_eos), "
        "--steps fixed steps, no evaluation; final line: ratio samples/s SeamlessFlow / TRL (throughput)"))
    parser.add_argument("--steps", type=int, default=40, help="train steps of each system")
    parser.add_argument("--eval-every", type=int, default=5, help="checkpoints evaluated every this many steps")
    parser.add_argument("--target", type=float, default=0.8, help="held-out accuracy whose wall time is compared")
    parser.add_argument("--config", type=Path, default=DEMO_CONFIG)
    parser.add_argument("--trl-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trl_worker is not None:
        trl_worker(args.trl_worker)
        return
    from infra.launcher import stop_on_sigterm

    logging.basicConfig(level="WARNING")
    stop_on_sigterm()
    print(f"trl {metadata.version('trl')}, transformers {metadata.version('transformers')}, "
          f"torch {metadata.version('torch')}; {os.cpu_count()} cores")
    base = RunConfig.load(args.config)
    lines = []
    with tempfile.TemporaryDirectory() as tmp, ProcessCpu() as cpu:
        for workload in (THROUGHPUT,) if args.throughput else WORKLOADS[args.workload]:
            lines += compare(base, workload, args, Path(tmp), cpu)
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
