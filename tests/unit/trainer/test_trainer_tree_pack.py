"""Tree packing: the mask and positions, packed logprobs equal per-branch logprobs, micro-batch planning."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.unit.trainer.trainer_helpers import node, random_nodes
from trainer_svc.errors import TreePackError
from trainer_svc.tree_pack import (
    PackedTree,
    TreeNode,
    forward_logprobs,
    pack_batch,
    pack_tree,
    plan_micro_batches,
    token_logprobs,
)

pytestmark = pytest.mark.unit

_MODELS: dict[tuple[str, str], nn.Module] = {}


def load_model(model_dir: Path, attn_implementation: str = "sdpa") -> nn.Module:
    key = (str(model_dir), attn_implementation)
    if key not in _MODELS:
        from transformers import AutoModelForCausalLM

        _MODELS[key] = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation=attn_implementation
        ).eval()
    return _MODELS[key]


def hand_tree() -> PackedTree:
    #   0: [10, 11]        root
    #   1: [12]            child of 0
    #   2: [13, 14]        child of 0
    #   3: [15]            child of 2
    #   4: [16]            a second root (forest)
    return pack_tree([
        node(0, -1, [10, 11], [0, 0]),
        node(1, 0, [12], [1]),
        node(2, 0, [13, 14], [1, 1]),
        node(3, 2, [15], [1]),
        node(4, -1, [16], [0]),
    ])


def test_layout_positions_and_predecessors() -> None:
    tree = hand_tree()
    assert tree.token_ids.tolist() == [10, 11, 12, 13, 14, 15, 16]
    assert tree.position_ids.tolist() == [0, 1, 2, 2, 3, 4, 0]
    assert tree.predecessor.tolist() == [-1, 0, 1, 1, 3, 4, -1]
    assert tree.leaves == (1, 3, 4)
    assert [b.tolist() for b in tree.branch_token_indices()] == [[0, 1, 2], [0, 1, 3, 4, 5], [6]]
    assert tree.num_tokens == 7 and tree.num_branch_tokens == 9


def test_tree_mask_is_self_and_ancestors() -> None:
    allowed = hand_tree().allowed().int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],  # token 13 does not see its sibling node's 12
        [1, 1, 0, 1, 1, 0, 0],
        [1, 1, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 1],  # the second root sees only itself
    ]


def test_empty_node_is_skipped_by_the_predecessor_chain() -> None:
    tree = pack_tree([node(0, -1, [1, 2], [0, 0]), node(1, 0, [], []), node(2, 1, [3], [1])])
    assert tree.predecessor.tolist() == [-1, 0, 1]
    assert tree.position_ids.tolist() == [0, 1, 2]


def test_additive_mask_shape_and_values() -> None:
    batch = pack_batch([hand_tree(), hand_tree()])
    mask = batch.attention_mask(torch.float32)
    assert mask.shape == (1, 1, 14, 14)
    assert mask[0, 0, 3, 2] == torch.finfo(torch.float32).min and mask[0, 0, 3, 1] == 0
    assert torch.all(mask[0, 0, 7:, :7] == torch.finfo(torch.float32).min)  # trees do not see each other
    assert batch.predecessor.tolist()[7:] == [-1, 7, 8, 8, 10, 11, -1]
    assert batch.position_ids.tolist()[7:] == [0, 1, 2, 2, 3, 4, 0]


def test_light_nodes_and_numpy_arrays_pack_like_events() -> None:
    import numpy as np

    light = TreeNode(node_id=0, parent=-1, token_ids=np.array([5, 6], dtype=np.int32),
                     loss_mask=np.array([0, 1], dtype=np.uint8), logprobs=np.array([0.0, -1.5], dtype=np.float32),
                     versions=np.array([-1, 3], dtype=np.int32))
    tree = pack_tree([light])
    assert tree.token_ids.tolist() == [5, 6] and tree.loss_mask.tolist() == [False, True]
    assert tree.behaviour_logprobs.tolist() == [0.0, -1.5] and tree.versions.tolist() == [-1, 3]


def test_a_decoded_trajectory_packs_like_the_original() -> None:
    """Events from the bus hold read-only packed arrays over the message bytes."""
    from schemas.events import decode_event, encode_event
    from tests.unit.trainer.trainer_helpers import random_batch

    original = random_batch(seed=11, num_trajectories=1)[0]
    decoded = decode_event(encode_event(original))
    a, b = pack_tree(original.nodes), pack_tree(decoded.nodes)  # type: ignore[attr-defined]
    for name in ("token_ids", "position_ids", "predecessor", "loss_mask", "behaviour_logprobs", "versions"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([], "at least one node"),
        ([node(0, 0, [1], [0])], "parent 0"),
        ([node(0, -1, [1], [0]), node(1, 2, [1], [0])], "parent 2"),
        ([node(1, -1, [1], [0])], "node_id 1"),
        ([TreeNode(node_id=0, parent=-1, token_ids=[1, 2], loss_mask=[0], logprobs=[0, 0], versions=[0, 0])],
         "loss_mask has 1 values for 2 tokens"),
    ],
)
def test_invalid_trees_are_refused(nodes: list[TreeNode], message: str) -> None:
    with pytest.raises(TreePackError, match=message):
        pack_tree(nodes)


def _branch_logprobs(model: nn.Module, tree: PackedTree) -> list[torch.Tensor]:
    """Each branch run alone with the model's ordinary causal attention (no custom mask at all)."""
    result = []
    for branch in tree.branches():
        if branch.num_tokens == 0:
            result.append(torch.zeros(0))
            continue
        logits = model(input_ids=branch.token_ids[None]).logits[0]
        result.append(token_logprobs(logits, branch.token_ids, branch.predecessor))
    return result


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@given(seed=st.integers(0, 2**31 - 1), num_nodes=st.integers(1, 12))
@settings(max_examples=40, deadline=None)
def test_packed_logprobs_equal_per_branch(
    tiny_model_dir: Path, attn_implementation: str, seed: int, num_nodes: int
) -> None:
    model = load_model(tiny_model_dir, attn_implementation)
    tree = pack_tree(random_nodes(random.Random(seed), num_nodes, max_len=8))
    with torch.no_grad():
        packed = forward_logprobs(model, pack_batch([tree]))
        for indices, expected in zip(tree.branch_token_indices(), _branch_logprobs(model, tree), strict=True):
            assert torch.allclose(packed[indices], expected, atol=1e-5, rtol=0), (seed, num_nodes)


def test_several_trees_in_one_micro_batch_equal_each_alone(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir)
    rng = random.Random(7)
    trees = [pack_tree(random_nodes(rng, rng.randint(1, 6))) for _ in range(4)]
    with torch.no_grad():
        batch = pack_batch(trees)
        together = forward_logprobs(model, batch)
        for index, tree in enumerate(trees):
            alone = forward_logprobs(model, pack_batch([tree]))
            assert torch.allclose(together[batch.tree_slice(index)], alone, atol=1e-5, rtol=0)


def test_the_tree_mask_is_what_makes_them_equal(tiny_model_dir: Path) -> None:
    """Guard against a backend silently ignoring the 4D mask: plain causal attention over the
    packed sequence (siblings visible) must give different logprobs."""
    model = load_model(tiny_model_dir)
    tree = hand_tree()
    batch = pack_batch([tree])
    with torch.no_grad():
        packed = forward_logprobs(model, batch)
        causal = model(input_ids=batch.token_ids[None], position_ids=batch.position_ids[None]).logits[0]
        leaky = token_logprobs(causal, batch.token_ids, batch.predecessor)
    assert not torch.allclose(packed[3:6], leaky[3:6], atol=1e-4)  # node 2 would see node 1's token


def test_bf16_mask_runs(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir)
    from transformers import AutoModelForCausalLM

    bf16 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
    bf16.eval()
    tree = hand_tree()
    with torch.no_grad():
        high = forward_logprobs(model, pack_batch([tree]))
        low = forward_logprobs(bf16, pack_batch([tree]))
    assert low.dtype == torch.float32 and torch.isfinite(low).all()
    assert torch.allclose(low, high, atol=0.1)


# --- micro-batches ---------------------------------------------------------------------------------


def test_plan_micro_batches_packs_by_tokens() -> None:
    sizes = [5, 9, 3, 4, 12, 1]
    plan = plan_micro_batches(sizes, token_budget=10)
    assert sorted(i for mb in plan for i in mb) == list(range(len(sizes)))
    for mb in plan:
        assert sum(sizes[i] for i in mb) <= 10 or len(mb) == 1
    assert [4] in plan  # larger than the budget: alone
    assert len(plan) == 4  # 12 | 9+1 | 5+4 | 3  (first-fit decreasing)


@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=30), budget=st.integers(1, 80))
@settings(max_examples=60, deadline=None)
def test_plan_micro_batches_properties(sizes: list[int], budget: int) -> None:
    plan = plan_micro_batches(sizes, budget)
    assert sorted(i for mb in plan for i in mb) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in mb) <= budget or len(mb) == 1 for mb in plan)
    assert all(mb == sorted(mb) for mb in plan)


def test_plan_micro_batches_rejects_bad_budget() -> None:
    with pytest.raises(TreePackError):
        plan_micro_batches([1], 0)
