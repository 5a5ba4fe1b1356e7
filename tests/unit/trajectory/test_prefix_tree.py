"""PrefixTree: longest-prefix merge, the merge rule, canonical export and round trips."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_adapter.errors import (
    AdapterError,
    ConflictingCallError,
    InvalidNodesError,
    MalformedCallError,
    UnknownCallError,
)
from agents_adapter.processor.prefix_tree import PrefixTree
from schemas.errors import SchemaError
from schemas.events import Trajectory, TrajectoryNode, decode_event, encode_event
from tests.unit.trajectory.sessiongen import make_call, oracle, sessions

pytestmark = pytest.mark.unit

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def build(calls) -> PrefixTree:
    tree = PrefixTree()
    for call in calls:
        tree.insert(call)
    return tree


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


@FAST
@given(sessions())
def test_every_call_is_a_root_to_node_path_with_merged_claims(calls) -> None:
    tree = build(calls)
    best = oracle(calls)
    for call in calls:
        seq = list(call.prompt_ids) + list(call.output_ids)
        path = tree.path_of(call.call_id)
        assert path.token_ids.tolist() == seq
        want = [best[tuple(seq[: i + 1])] for i in range(len(seq))]
        assert path.loss_mask.tolist() == [w[0] for w in want]
        assert path.versions.tolist() == [w[1] for w in want]
        assert path.logprobs.view(np.int32).tolist() == np.array([w[2] for w in want], np.float32).view(
            np.int32).tolist()
    assert tree.tokens_in_tree == len(best)  # every distinct prefix stored once
    assert tree.tokens_in_calls == sum(len(c.prompt_ids) + len(c.output_ids) for c in calls)
    generated = [v for m, v, _ in best.values() if m == 1]
    assert (tree.min_version, tree.max_version) == ((min(generated), max(generated)) if generated else (-1, -1))
    assert tree.drift_calls == sum(c.drift for c in calls)
    assert tree.call_ids == tuple(c.call_id for c in calls)


@FAST
@given(sessions())
def test_nodes_are_canonical(calls) -> None:
    tree = build(calls)
    nodes = tree.nodes()
    call_ends = {tree.path_of(c.call_id).node_ids[-1] for c in calls if tree.path_of(c.call_id).node_ids}
    children: dict[int, list[TrajectoryNode]] = {}
    for i, node in enumerate(nodes):
        assert node.node_id == i and node.parent < i and node.token_ids
        assert len(node.token_ids) == len(node.loss_mask) == len(node.logprobs) == len(node.versions)
        children.setdefault(node.parent, []).append(node)
    for siblings in children.values():
        firsts = [n.token_ids[0] for n in siblings]
        assert firsts == sorted(set(firsts))  # distinct, listed by first token
    for node in nodes:
        # a node ends only where sequences diverge or a call ends
        assert len(children.get(node.node_id, [])) != 1 or node.node_id in call_ends
    # depth first: a node's subtree is contiguous
    for node in nodes:
        if node.parent >= 0:
            between = nodes[node.parent + 1 : node.node_id]
            assert all(_is_descendant(nodes, n.node_id, node.parent) for n in between)


def _is_descendant(nodes, node_id: int, ancestor: int) -> bool:
    while node_id != -1:
        node_id = nodes[node_id].parent
        if node_id == ancestor:
            return True
    return False


@FAST
@given(sessions(), st.randoms(use_true_random=False))
def test_any_order_and_duplicates_give_the_same_tree(calls, rnd) -> None:
    reference = build(calls)
    shuffled = calls + [rnd.choice(calls) for _ in range(3)]
    rnd.shuffle(shuffled)
    tree = build(shuffled)
    assert tree.nodes() == reference.nodes()
    assert sorted(tree.call_ids) == sorted(reference.call_ids)
    assert (tree.tokens_in_calls, tree.tokens_in_tree) == (reference.tokens_in_calls, reference.tokens_in_tree)
    assert (tree.min_version, tree.max_version) == (reference.min_version, reference.max_version)
    for call in calls:
        assert tree.path_of(call.call_id).node_ids == reference.path_of(call.call_id).node_ids


@FAST
@given(sessions())
def test_nodes_round_trip_through_from_nodes_and_the_trajectory_event(calls) -> None:
    tree = build(calls)
    nodes = tree.nodes()
    rebuilt = PrefixTree.from_nodes(nodes)
    assert rebuilt.nodes() == nodes
    assert rebuilt.tokens_in_tree == tree.tokens_in_tree
    assert (rebuilt.min_version, rebuilt.max_version) == (tree.min_version, tree.max_version)
    for a, b in zip(rebuilt.paths(), tree.paths(), strict=True):
        assert a.node_ids == b.node_ids
        for field in ("token_ids", "loss_mask", "versions"):
            assert np.array_equal(getattr(a, field), getattr(b, field))
        assert a.logprobs.tobytes() == b.logprobs.tobytes()
    trajectory = Trajectory(
        trajectory_id="s1", session_id="s1", agent_id="agent-1", reward=1.0, status="completed",
        nodes=nodes, call_ids=tree.call_ids, min_version=tree.min_version, max_version=tree.max_version,
        tokens_in_calls=tree.tokens_in_calls, tokens_in_tree=tree.tokens_in_tree,
    )
    decoded = decode_event(encode_event(trajectory))
    assert decoded == trajectory
    assert isinstance(decoded, Trajectory)
    assert PrefixTree.from_nodes(decoded.nodes).nodes() == nodes


@FAST
@given(sessions(), st.randoms(use_true_random=False))
def test_from_nodes_accepts_any_parents_first_order(calls, rnd) -> None:
    nodes = list(build(calls).nodes())
    # breadth-first-ish order with fresh ids: still parents before children
    order = sorted(range(len(nodes)), key=lambda i: (_depth(nodes, i), rnd.random()))
    new_id = {old: 100 + k for k, old in enumerate(order)}
    new_id[-1] = -1
    relabelled = [
        TrajectoryNode(node_id=new_id[i], parent=new_id[nodes[i].parent], token_ids=nodes[i].token_ids,
                       loss_mask=nodes[i].loss_mask, logprobs=nodes[i].logprobs, versions=nodes[i].versions)
        for i in order
    ]
    assert PrefixTree.from_nodes(relabelled).nodes() == tuple(nodes)


def _depth(nodes, i: int) -> int:
    depth = 0
    while nodes[i].parent != -1:
        i, depth = nodes[i].parent, depth + 1
    return depth


@FAST
@given(sessions())
def test_paths_are_root_to_leaf_and_cover_every_call(calls) -> None:
    tree = build(calls)
    paths = tree.paths()
    leaves = {p.token_ids.tobytes() for p in paths}
    assert len(leaves) == len(paths)
    parents = {n.parent for n in tree.nodes()}
    assert all(p.node_ids[-1] not in parents for p in paths)  # each ends at a leaf
    assert len(paths) == len(tree.nodes()) - len(parents - {-1})
    for call in calls:
        seq = np.array(list(call.prompt_ids) + list(call.output_ids), np.int32)
        if len(seq):
            assert any(p.token_ids[: len(seq)].tobytes() == seq.tobytes() for p in paths)


# --- the merge rule, by example -------------------------------------------------------------------


def test_generated_wins_over_given_in_either_order() -> None:
    turn0 = make_call("t0", [1, 2], [3, 4], [-0.25, -0.5], [2, 2])
    turn1 = make_call("t1", [1, 2, 3, 4, 9], [5], [-1.0], [3])
    for order in ([turn0, turn1], [turn1, turn0]):
        tree = build(order)
        path = tree.path_of("t1")
        assert path.token_ids.tolist() == [1, 2, 3, 4, 9, 5]
        assert path.loss_mask.tolist() == [0, 0, 1, 1, 0, 1]
        assert path.versions.tolist() == [-1, -1, 2, 2, -1, 3]
        assert path.logprobs.tolist() == [0.0, 0.0, -0.25, -0.5, 0.0, -1.0]
    assert build([turn0, turn1]).nodes() == build([turn1, turn0]).nodes()


def test_two_generations_of_the_same_tokens_keep_the_newest_version_then_the_larger_logprob() -> None:
    old = make_call("old", [1], [2, 3, 4], [-0.5, -0.5, -0.0], [1, 2, 2])
    new = make_call("new", [1], [2, 3, 4], [-2.0, -0.25, 0.0], [2, 2, 2])
    for order in ([old, new], [new, old], [old, new, old]):
        path = build(order).path_of("old")
        assert path.versions.tolist() == [-1, 2, 2, 2]
        assert path.logprobs.tolist() == [0.0, -2.0, -0.25, 0.0]
        assert path.logprobs.view(np.int32)[3] == 0  # +0.0 beats -0.0


def test_inserting_the_same_call_twice_changes_nothing() -> None:
    call = make_call("a", [1, 2, 3], [4])
    tree = build([call])
    nodes = tree.nodes()
    delta = tree.insert(call)
    assert not delta and delta.new_tokens == 0
    assert tree.nodes() == nodes and tree.num_calls == 1 and tree.tokens_in_calls == 4


def test_a_call_id_with_other_content_is_rejected_and_the_tree_is_unchanged() -> None:
    tree = build([make_call("a", [1, 2, 3], [4])])
    nodes = tree.nodes()
    with pytest.raises(ConflictingCallError):
        tree.insert(make_call("a", [1, 2, 3], [5]))
    with pytest.raises(ConflictingCallError):
        tree.insert(make_call("a", [1, 2, 3], [4], [-0.75], [1]))
    assert tree.nodes() == nodes and tree.num_calls == 1


@pytest.mark.parametrize(
    "call",
    [
        make_call("bad", [1], [2, 3], [-0.5], [1, 1]),
        make_call("bad", [1], [2], [-0.5], [1, 1]),
    ],
)
def test_malformed_calls_are_rejected(call) -> None:
    tree = build([make_call("ok", [1], [2])])
    nodes = tree.nodes()
    with pytest.raises(MalformedCallError) as info:
        tree.insert(call)
    assert isinstance(info.value, AdapterError)
    assert tree.nodes() == nodes and "bad" not in tree


def test_token_ids_outside_int32_cannot_even_be_built() -> None:
    """Packed fields validate when the event is built, so no tree ever sees such a call."""
    with pytest.raises(SchemaError, match="out of range"):
        make_call("bad", [2**31], [2])
    with pytest.raises(SchemaError, match="out of range"):
        _node(0, -1, [2**31])


def test_a_call_ending_inside_a_node_splits_it_and_an_empty_call_ends_at_the_root() -> None:
    tree = build([make_call("long", [1, 2, 3, 4], [5, 6])])
    tree.insert(make_call("short", [1, 2], [3]))
    tree.insert(make_call("empty", [], []))
    assert [n.token_ids for n in tree.nodes()] == [(1, 2, 3), (4, 5, 6)]
    assert tree.path_of("short").node_ids == (0,)
    assert tree.path_of("long").node_ids == (0, 1)
    assert len(tree.path_of("empty")) == 0 and tree.path_of("empty").node_ids == ()
    with pytest.raises(UnknownCallError):
        tree.path_of("missing")
    with pytest.raises(KeyError):
        tree.path_of("missing")


def test_an_empty_tree() -> None:
    tree = PrefixTree()
    assert tree.nodes() == () and tree.paths() == ()
    assert (tree.min_version, tree.max_version, tree.tokens_in_tree) == (-1, -1, 0)
    assert PrefixTree.from_nodes(()).nodes() == ()


def _node(node_id: int, parent: int, tokens, mask=None, logprobs=None, versions=None) -> TrajectoryNode:
    n = len(tokens)
    return TrajectoryNode(
        node_id=node_id, parent=parent, token_ids=tuple(tokens),
        loss_mask=tuple(mask if mask is not None else [0] * n),
        logprobs=tuple(logprobs if logprobs is not None else [0.0] * n),
        versions=tuple(versions if versions is not None else [-1] * n),
    )


@pytest.mark.parametrize(
    "nodes",
    [
        [_node(1, 0, [2]), _node(0, -1, [1])],  # child before parent
        [_node(0, -1, [1]), _node(0, -1, [2])],  # duplicate id
        [_node(0, -1, [1, 2]), _node(1, -1, [1, 3])],  # siblings share a first token
        [_node(0, -1, [])],  # empty node
        [_node(0, -1, [1], mask=[2], versions=[1], logprobs=[-1.0])],  # mask not 0/1
        [_node(0, -1, [1], versions=[3])],  # given token with a version
        [_node(0, -1, [1], logprobs=[-1.0])],  # given token with a logprob
        [_node(0, -1, [1, 2], mask=[0])],  # ragged
    ],
)
def test_from_nodes_rejects_invalid_trees(nodes) -> None:
    with pytest.raises(InvalidNodesError):
        PrefixTree.from_nodes(nodes)


def test_a_tree_rebuilt_from_nodes_accepts_new_calls() -> None:
    calls = [make_call("a", [1, 2, 3], [4, 5]), make_call("b", [1, 2, 3, 4, 5, 6], [7])]
    rebuilt = PrefixTree.from_nodes(build(calls[:1]).nodes())
    rebuilt.insert(calls[1])
    reference = build(calls)
    assert rebuilt.nodes() == reference.nodes()
    assert rebuilt.tokens_in_tree == reference.tokens_in_tree


def test_logprobs_are_stored_as_float32() -> None:
    tree = build([make_call("a", [1], [2], [-0.1], [1])])
    assert tree.nodes()[0].logprobs[1] == f32(-0.1)
