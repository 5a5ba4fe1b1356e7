"""Trainer benchmark: tree-packed vs per-branch training of agent sessions, and ZeRO stage step times.

Workload: multi-turn agent sessions with shared prefixes. A session opens with a 200-300-token given
system+task prompt; every turn is an assistant reply (30-60 generated tokens) followed by a tool
result (20-60 given tokens), `--turns` turns deep. At each turn the session forks with probability
`--fork` (a retry or an edited history): the fork re-generates from the same prefix and runs a few
turns of its own. Sessions come in GRPO groups of 4 with different rewards.

Both modes run the same `Trainer.train_step` (forward, decoupled loss, backward, DeepSpeed step) on the
same sessions, same micro-batch token budget:
  - tree-packed: one trajectory per session, its whole prefix tree in one sequence (tree mask);
  - per-branch: every root-to-leaf branch of every session as a trajectory of its own (causal mask),
    i.e. what a trainer without prefix trees does: shared prefixes are recomputed per branch.
Throughput is reported as *session tokens per second*, where a session's tokens are its branch tokens
(the data a per-branch trainer consumes), so both modes are measured on the same amount of data;
the FLOP saving is branch tokens / tree tokens (linear layers dominate at these lengths).

    .venv/bin/python bench/trainer_bench.py [--sessions 8] [--steps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from rich.console import Console
from rich.table import Table

from schemas.events import Trajectory, TrajectoryNode
from schemas.packed import Float32s, Int32s, UInt8s
from trainer_svc.config import AlgorithmConfig, EngineConfig, TrainerConfig
from trainer_svc.trainer import Trainer
from trainer_svc.tree_pack import pack_tree

VOCAB = 256
GROUP_SIZE = 4


def _tokens(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(rng.randint(low, high))]


def session_nodes(rng: random.Random, turns: int, fork: float, version: int) -> tuple[TrajectoryNode, ...]:
    nodes: list[TrajectoryNode] = []

    def add(parent: int, generated: list[int], given: list[int]) -> int:
        index = len(nodes)
        tokens = generated + given
        mask = [1] * len(generated) + [0] * len(given)
        nodes.append(TrajectoryNode(
            node_id=index, parent=parent, token_ids=Int32s(tokens), loss_mask=UInt8s(mask),
            logprobs=Float32s([-rng.uniform(0.1, 4.0) if m else 0.0 for m in mask]),
            versions=Int32s([version if m else -1 for m in mask]),
        ))
        return index

    def grow(parent: int, turns_left: int) -> None:
        here = add(parent, _tokens(rng, 30, 60), _tokens(rng, 20, 60))
        if turns_left > 1:
            grow(here, turns_left - 1)
        if rng.random() < fork:  # a second reply from the same prefix, continued on its own
            grow(parent, rng.randint(1, max(1, turns_left - 1)))

    root = add(-1, [], _tokens(rng, 200, 300))
    grow(root, turns)
    return tuple(nodes)


def make_sessions(count: int, turns: int, fork: float, seed: int) -> list[Trajectory]:
    rng = random.Random(seed)
    sessions = []
    for i in range(count):
        nodes = session_nodes(rng, turns, fork, version=0)
        sessions.append(Trajectory(
            trajectory_id=f"s{i}", session_id=f"s{i}", agent_id="bench", group_id=f"g{i // GROUP_SIZE}",
            reward=float(i % GROUP_SIZE), status="completed", nodes=nodes, min_version=0, max_version=0,
            tokens_in_calls=0, tokens_in_tree=sum(len(n.token_ids) for n in nodes),
        ))
    return sessions


def per_branch(sessions: list[Trajectory]) -> list[Trajectory]:
    """Every root-to-leaf branch as a one-node trajectory with the session's group and reward."""
    branches = []
    for session in sessions:
        tree = pack_tree(session.nodes)
        for k, indices in enumerate(tree.branch_token_indices()):
            node = TrajectoryNode(
                node_id=0, parent=-1,
                token_ids=Int32s(tree.token_ids[indices].numpy()),
                loss_mask=UInt8s(tree.loss_mask[indices].to(torch.uint8).numpy()),
                logprobs=Float32s(tree.behaviour_logprobs[indices].numpy()),
                versions=Int32s(tree.versions[indices].numpy()),
            )
            branches.append(Trajectory(
                trajectory_id=f"{session.trajectory_id}/b{k}", session_id=session.session_id,
                agent_id=session.agent_id, group_id=session.group_id, reward=session.reward,
                status=session.status, nodes=(node,), min_version=0, max_version=0, tokens_in_calls=0,
                tokens_in_tree=len(node.token_ids),
            ))
    return branches


Run = tuple[Trainer, list[Trajectory]]


def time_interleaved(runs: dict[str, Run], steps: int) -> dict[str, tuple[float, int, int]]:
    """Median seconds of a train step per run, with the runs' steps interleaved so that load from other
    processes on the machine hits every run alike; also forwarded tokens and micro-batches of a step."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    shape: dict[str, tuple[int, int]] = {}
    for name, (trainer, batch) in runs.items():  # warm-up step
        result = trainer.train_step(batch, trainer.version)
        shape[name] = (result.num_tokens, result.num_micro_batches)
    for _ in range(steps):
        for name, (trainer, batch) in runs.items():
            started = time.perf_counter()
            trainer.train_step(batch, trainer.version)
            times[name].append(time.perf_counter() - started)
    return {name: (statistics.median(times[name]), *shape[name]) for name in runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--fork", type=float, default=0.35)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per measurement (after 1 warm-up)")
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", type=Path, default=None, help="HF model dir (default: create the default model)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    console = Console(width=130)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            from inference_svc.default_model import create_default_model

            model_dir = create_default_model(Path(tmp) / "model")
        sessions = make_sessions(args.sessions, args.turns, args.fork, args.seed)
        branches = per_branch(sessions)
        tree_tokens = sum(pack_tree(s.nodes).num_tokens for s in sessions)
        branch_tokens = sum(len(b.nodes[0].token_ids) for b in branches)

        def trainer(zero_stage: int) -> Trainer:
            return Trainer(TrainerConfig(
                model_path=str(model_dir),
                engine=EngineConfig(zero_stage=zero_stage, micro_batch_tokens=args.micro_batch_tokens,
                                    learning_rate=1e-5, device="cpu"),
                algorithm=AlgorithmConfig(max_staleness=None),
            ))

        tree_trainer = trainer(0)
        timed = time_interleaved({"tree-packed": (tree_trainer, sessions), "per-branch": (trainer(0), branches)},
                                 args.steps)
        rows = [(mode, len(batch), *timed[mode]) for mode, batch in (("tree-packed", sessions),
                                                                      ("per-branch", branches))]
        zero_timed = time_interleaved(
            {str(stage): (tree_trainer if stage == 0 else trainer(stage), sessions) for stage in (0, 1, 2)},
            args.steps,
        )
        zero_rows = [(stage, zero_timed[str(stage)][0], zero_timed[str(stage)][1]) for stage in (0, 1, 2)]

    table = Table(title=f"train step, {args.sessions} sessions ({branch_tokens} branch tokens, "
                        f"{tree_tokens} tree tokens), ZeRO 0, fp32, {args.threads} thread(s)")
    for column in ("mode", "trajectories", "forwarded tokens", "micro-batches", "step s (median)",
                   "forwarded tok/s", "session tok/s"):
        table.add_column(column, justify="right")
    for mode, count, seconds, forwarded, micro_batches in rows:
        table.add_row(mode, str(count), str(forwarded), str(micro_batches), f"{seconds:.3f}",
                      f"{forwarded / seconds:,.0f}", f"{branch_tokens / seconds:,.0f}")
    console.print(table)

    zero_table = Table(title="ZeRO stage, tree-packed sessions, fp32")
    for column in ("stage", "step s (median)", "forwarded tok/s"):
        zero_table.add_column(column, justify="right")
    for stage, seconds, forwarded in zero_rows:
        zero_table.add_row(str(stage), f"{seconds:.3f}", f"{forwarded / seconds:,.0f}")
    console.print(zero_table)

    tree_seconds, branch_seconds = rows[0][2], rows[1][2]
    print(f"FLOP saving (branch tokens / tree tokens): {branch_tokens / tree_tokens:.2f}x")
    print(f"ratio tree-packed vs per-branch tokens/s: {branch_seconds / tree_seconds:.2f}x")


if __name__ == "__main__":
    main()
