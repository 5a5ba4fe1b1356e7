"""GRPO through DeepSpeed learns a verifiable toy task: single-digit addition "a+b=" -> "c<|im_end|>".

The tiny default model is first warmed up with a few supervised steps (it learns the answer format
and some sums), then trained with GRPO on rewards it earns by sampling. Sampling runs one step ahead
of training (the batch trained at version v was sampled at v - 1), as in an asynchronous pipeline,
so the decoupled objective's importance weights and the staleness bookkeeping are exercised.
Evaluation: mean reward of 4 samples for each of the 100 problems, with a fixed sampling seed.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from torch import nn

from schemas.events import Trajectory, TrajectoryNode
from schemas.packed import Float32s, Int32s, UInt8s
from tests.factories import TINY_SPEC
from trainer_svc.config import AlgorithmConfig, EngineConfig, TrainerConfig
from trainer_svc.trainer import Trainer

pytestmark = pytest.mark.slow

PROBLEMS = [(a, b) for a in range(10) for b in range(10)]
MAX_NEW_TOKENS = 3
GROUP_SIZE = 8
PROMPTS_PER_STEP = 16
RL_STEPS = 500
MARGIN = 0.2  # sampled reward over 400 draws has a std of <= 0.025: 0.2 is 8 standard deviations


def prompt_ids(a: int, b: int) -> list[int]:
    return list(f"{a}+{b}=".encode())


def answer_ids(a: int, b: int, eos: int) -> list[int]:
    return [*str(a + b).encode(), eos]


@torch.no_grad()
def sample(model: nn.Module, problems: list[tuple[int, int]], eos: int,
           generator: torch.Generator) -> list[tuple[list[int], list[float], float]]:
    """Plain ancestral sampling at temperature 1; returns (tokens, logprobs, reward) per problem.

    Prompts all have 4 tokens, so the batch needs no padding; a row stops at its end-of-turn token.
    """
    was_training = model.training
    model.eval()
    sequences = torch.tensor([prompt_ids(a, b) for a, b in problems])
    outputs: list[list[int]] = [[] for _ in problems]
    logprobs: list[list[float]] = [[] for _ in problems]
    for _ in range(MAX_NEW_TOKENS):
        logp = torch.log_softmax(model(input_ids=sequences).logits[:, -1].float(), dim=-1)
        tokens = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
        for row, token in enumerate(tokens.tolist()):
            if not outputs[row] or outputs[row][-1] != eos:
                outputs[row].append(token)
                logprobs[row].append(float(logp[row, token]))
        sequences = torch.cat([sequences, tokens[:, None]], dim=1)
    model.train(was_training)
    return [(out, lp, float(out == answer_ids(a, b, eos)))
            for (a, b), out, lp in zip(problems, outputs, logprobs, strict=True)]


def evaluate(model: nn.Module, eos: int) -> float:
    results = sample(model, [p for p in PROBLEMS for _ in range(4)], eos, torch.Generator().manual_seed(1234))
    return sum(r for _, _, r in results) / len(results)


def warm_up(model: nn.Module, eos: int, steps: int, rng: random.Random) -> None:
    """Supervised steps on the answers (prompt tokens not in the loss)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        batch = rng.sample(PROBLEMS, 32)
        rows = [prompt_ids(a, b) + answer_ids(a, b, eos) for a, b in batch]
        width = max(map(len, rows))
        ids = torch.tensor([r + [eos] * (width - len(r)) for r in rows])
        labels = torch.tensor([[-100] * 4 + r[4:] + [-100] * (width - len(r)) for r in rows])
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def to_trajectories(step: int, problems: list[tuple[int, int]],
                    samples: list[tuple[list[int], list[float], float]], version: int) -> list[Trajectory]:
    trajectories = []
    for i, ((a, b), (tokens, logprobs, reward)) in enumerate(zip(problems, samples, strict=True)):
        prompt = prompt_ids(a, b)
        nodes = (
            TrajectoryNode(node_id=0, parent=-1, token_ids=Int32s(prompt), loss_mask=UInt8s([0] * len(prompt)),
                           logprobs=Float32s([0.0] * len(prompt)), versions=Int32s([-1] * len(prompt))),
            TrajectoryNode(node_id=1, parent=0, token_ids=Int32s(tokens), loss_mask=UInt8s([1] * len(tokens)),
                           logprobs=Float32s(logprobs), versions=Int32s([version] * len(tokens))),
        )
        trajectories.append(Trajectory(
            trajectory_id=f"{step}-{i}", session_id=f"{step}-{i}", agent_id="adder", task_id=f"{a}+{b}",
            group_id=f"{step}:{a}+{b}", reward=reward, status="completed", nodes=nodes,
            min_version=version, max_version=version, tokens_in_calls=len(prompt) + len(tokens),
            tokens_in_tree=len(prompt) + len(tokens),
        ))
    return trajectories


def test_grpo_raises_the_reward_on_toy_addition(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from inference_svc.default_model import IM_END, build_tokenizer, create_default_model

    torch.manual_seed(0)
    rng = random.Random(0)
    base = create_default_model(tmp_path / "base", TINY_SPEC)
    eos = build_tokenizer().convert_tokens_to_ids(IM_END)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    warm_up(model, eos, steps=40, rng=rng)
    warm = tmp_path / "warm"
    model.save_pretrained(warm)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (warm / name).write_bytes((base / name).read_bytes())

    config = TrainerConfig(
        model_path=str(warm),
        engine=EngineConfig(zero_stage=1, learning_rate=5e-4, micro_batch_tokens=1024, device="cpu"),
        algorithm=AlgorithmConfig(max_staleness=1),
    )
    trainer = Trainer(config)
    before = evaluate(trainer.model, eos)

    generator = torch.Generator().manual_seed(0)
    def draw(step: int) -> list[Trajectory]:
        problems = [p for p in rng.sample(PROBLEMS, PROMPTS_PER_STEP) for _ in range(GROUP_SIZE)]
        return to_trajectories(step, problems, sample(trainer.model, problems, eos, generator), trainer.version)

    pending = draw(0)
    histograms = []
    for step in range(RL_STEPS):
        ready, pending = pending, draw(step + 1)  # sampled before the update: one version stale next step
        result = trainer.train_step(ready, trainer.version)
        histograms.append(result.staleness_histogram)
    after = evaluate(trainer.model, eos)

    assert histograms[0][0] > 0 and all(h[1] > 0 and h[0] == 0 for h in histograms[1:])
    print(f"mean reward {before:.3f} -> {after:.3f}")
    assert after >= before + MARGIN, f"mean reward {before:.3f} -> {after:.3f}"
