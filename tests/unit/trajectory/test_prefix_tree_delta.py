"""PrefixTree deltas: replay rebuilds the same tree, the wire format round-trips, sizes follow new tokens."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_adapter.errors import DeltaError
from agents_adapter.processor.prefix_tree import PrefixTree
from agents_adapter.processor.tree_delta import TreeDelta
from tests.unit.trajectory.sessiongen import make_call, sessions

pytestmark = pytest.mark.unit

FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same_tree(a: PrefixTree, b: PrefixTree) -> None:
    assert a.nodes() == b.nodes()
    assert a.call_ids == b.call_ids
    assert (a.tokens_in_calls, a.tokens_in_tree, a.drift_calls) == (b.tokens_in_calls, b.tokens_in_tree, b.drift_calls)
    assert (a.min_version, a.max_version) == (b.min_version, b.max_version)
    for call_id in a.call_ids:
        pa, pb = a.path_of(call_id), b.path_of(call_id)
        assert pa.node_ids == pb.node_ids
        assert pa.token_ids.tobytes() == pb.token_ids.tobytes()
        assert pa.logprobs.tobytes() == pb.logprobs.tobytes()


@FAST
@given(sessions(), st.randoms(use_true_random=False))
def test_deltas_replayed_through_bytes_rebuild_the_same_tree(calls, rnd) -> None:
    stream = calls + [rnd.choice(calls) for _ in range(2)]
    rnd.shuffle(stream)
    tree = PrefixTree()
    deltas = [tree.insert(call) for call in stream]
    decoded = [TreeDelta.from_bytes(d.to_bytes()) for d in deltas]
    assert [d.to_bytes() for d in decoded] == [d.to_bytes() for d in deltas]
    assert [len(d.to_bytes()) for d in deltas] == [d.nbytes for d in deltas]
    assert_same_tree(PrefixTree.from_deltas(decoded), tree)
    assert_same_tree(PrefixTree.from_deltas(deltas), tree)


@FAST
@given(sessions(), st.data())
def test_a_snapshot_plus_the_later_deltas_rebuilds_the_tree(calls, data) -> None:
    cut = data.draw(st.integers(0, len(calls)))
    tree = PrefixTree()
    for call in calls[:cut]:
        tree.insert(call)
    base = TreeDelta.from_bytes(tree.snapshot().to_bytes())
    later = [tree.insert(call) for call in calls[cut:]]
    rebuilt = PrefixTree.from_deltas([base, *later])
    assert_same_tree(rebuilt, tree)
    # the rebuilt tree goes on accepting calls exactly like the original
    extra = make_call("extra", [0, 1, 2], [3, 4], [-1.0, -2.0], [5, 5])
    assert rebuilt.insert(extra).to_bytes() == tree.insert(extra).to_bytes()
    assert_same_tree(rebuilt, tree)


@FAST
@given(sessions())
def test_delta_size_follows_the_new_tokens_not_the_tree(calls) -> None:
    tree = PrefixTree()
    for call in calls:
        before = tree.tokens_in_tree
        delta = tree.insert(call)
        added = tree.tokens_in_tree - before
        assert delta.new_tokens == added
        assert delta.claimed_tokens <= len(call.output_ids)
        # one split at most, one new node at most, a claim per overlapped node, one call record
        assert delta.nbytes <= 17 + 13 + 17 + 20 + len(call.call_id) + 13 * added + 22 * len(call.output_ids) + (
            13 * len(tree.path_of(call.call_id).node_ids))


def test_appending_a_turn_to_a_large_tree_costs_only_the_turn() -> None:
    rng = np.random.default_rng(7)
    history = rng.integers(0, 50_000, 8_000).tolist()
    tree = PrefixTree()
    for turn in range(10):
        output = rng.integers(0, 50_000, 20).tolist()
        delta = tree.insert(make_call(f"c{turn}", history, output, turn=turn))
        tool = rng.integers(0, 50_000, 5).tolist()
        if turn:
            # 25 new tokens (5 given + 20 generated) whatever the tree size (8K+ tokens)
            assert delta.new_tokens == 25
            assert delta.nbytes < 17 + 17 + 13 * 25 + 20 + 8
        history = history + output + tool
    assert tree.tokens_in_tree < 8_300 < tree.tokens_in_calls


def test_a_delta_applies_only_on_the_state_it_was_taken_from() -> None:
    tree = PrefixTree()
    d0 = tree.insert(make_call("a", [1, 2], [3]))
    d1 = tree.insert(make_call("b", [1, 2, 3, 4], [5]))
    other = PrefixTree()
    with pytest.raises(DeltaError):
        other.apply_delta(d1)  # missing d0
    other.apply_delta(d0)
    with pytest.raises(DeltaError):
        other.apply_delta(d0)  # applied twice
    other.apply_delta(d1)
    assert other.nodes() == tree.nodes()
    dup = tree.insert(make_call("a", [1, 2], [3]))
    assert not dup
    other.apply_delta(dup)  # an empty delta is valid on the same state
    assert other.nodes() == tree.nodes()


def test_a_claim_upgrade_is_a_small_delta() -> None:
    tree = PrefixTree()
    tree.insert(make_call("t1", [1, 2, 3, 4, 9], [5]))  # turn 1 first: 3, 4 look given
    delta = tree.insert(make_call("t0", [1, 2], [3, 4], [-0.25, -0.5], [2, 2]))
    assert delta.new_tokens == 0 and delta.claimed_tokens == 2
    rebuilt = PrefixTree.from_deltas([TreeDelta.from_bytes(tree.snapshot().to_bytes())])
    assert rebuilt.path_of("t0").loss_mask.tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[:-1],
        lambda b: b + b"\x00",
        lambda b: b"XXXX" + b[4:],
        lambda b: b[:17] + b"\x09" + b[18:],  # unknown op kind
        lambda b: b[:10],
    ],
)
def test_undecodable_deltas_raise_delta_error(mangle) -> None:
    tree = PrefixTree()
    data = tree.insert(make_call("a", [1, 2], [3])).to_bytes()
    with pytest.raises(DeltaError):
        TreeDelta.from_bytes(mangle(data))


def test_a_delta_naming_unknown_nodes_is_refused() -> None:
    tree = PrefixTree()
    tree.insert(make_call("a", [1, 2], [3]))
    d = tree.insert(make_call("b", [1, 7], [3]))  # splits node 0
    fresh = PrefixTree()
    fresh.apply_delta(TreeDelta(0, 0, ()))
    with pytest.raises(DeltaError):
        fresh.apply_delta(TreeDelta(0, 0, d.ops))
