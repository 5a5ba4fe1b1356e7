"""Builders shared by the trainer tests: tiny model spec, random trees, trajectories."""

from __future__ import annotations

import random
from collections.abc import Sequence

from schemas.events import Trajectory, TrajectoryNode
from schemas.packed import Float32s, Int32s, UInt8s
from trainer_svc.config import AlgorithmConfig, EngineConfig, TrainerConfig

VOCAB = 256  # byte ids; every one is a valid token of the default tokenizer


def node(node_id: int, parent: int, tokens: Sequence[int], mask: Sequence[int], *,
         logprob: float = -1.0, version: int = 0) -> TrajectoryNode:
    return TrajectoryNode(
        node_id=node_id,
        parent=parent,
        token_ids=Int32s(tokens),
        loss_mask=UInt8s(mask),
        logprobs=Float32s([logprob if m else 0.0 for m in mask]),
        versions=Int32s([version if m else -1 for m in mask]),
    )


def random_nodes(rng: random.Random, num_nodes: int, max_len: int = 6, *, version: int = 0,
                 forest: bool = True) -> tuple[TrajectoryNode, ...]:
    """A random tree (or forest): parents before children, some nodes empty, random loss masks."""
    nodes = []
    for i in range(num_nodes):
        parent = -1 if i == 0 else rng.randrange(-1 if forest else 0, i)
        length = rng.randint(1, max_len) if parent == -1 else rng.randint(0, max_len)
        tokens = [rng.randrange(VOCAB) for _ in range(length)]
        mask = [rng.randint(0, 1) for _ in range(length)]
        if parent == -1 and mask:
            mask[0] = 0  # a session opens with a given token
        nodes.append(node(i, parent, tokens, mask, logprob=-rng.uniform(0.5, 6.0), version=version))
    return tuple(nodes)


def trajectory(nodes: Sequence[TrajectoryNode], *, trajectory_id: str, group_id: str, reward: float,
               status: str = "completed") -> Trajectory:
    versions = [v for n in nodes for v, m in zip(n.versions, n.loss_mask, strict=True) if m]
    return Trajectory(
        trajectory_id=trajectory_id,
        session_id=trajectory_id,
        agent_id="test-agent",
        group_id=group_id,
        reward=reward,
        status=status,
        nodes=tuple(nodes),
        min_version=min(versions, default=-1),
        max_version=max(versions, default=-1),
        tokens_in_calls=0,
        tokens_in_tree=sum(len(n.token_ids) for n in nodes),
    )


def random_batch(seed: int, num_trajectories: int = 6, group_size: int = 3, *, version: int = 0) -> list[Trajectory]:
    """Trajectories in groups with distinct rewards inside each group (so advantages are non-zero)."""
    rng = random.Random(seed)
    batch = []
    for i in range(num_trajectories):
        nodes = random_nodes(rng, rng.randint(2, 4), max_len=5, version=version)
        if not any(m for n in nodes for m in n.loss_mask):  # at least one generated token
            last = nodes[-1]
            nodes = (*nodes[:-1], node(last.node_id, last.parent, [*last.token_ids, 7], [*last.loss_mask, 1],
                                        logprob=-2.0, version=version))
        batch.append(trajectory(nodes, trajectory_id=f"t{seed}-{i}", group_id=f"g{i // group_size}",
                                reward=float(i % group_size) + rng.random()))
    return batch


def trainer_config(model_dir: object, **engine: object) -> TrainerConfig:
    algorithm = engine.pop("algorithm", None)
    return TrainerConfig(
        model_path=str(model_dir),
        engine=EngineConfig(**{"learning_rate": 1e-3, **engine}),  # type: ignore[arg-type]
        algorithm=algorithm if isinstance(algorithm, AlgorithmConfig) else AlgorithmConfig(),
    )
