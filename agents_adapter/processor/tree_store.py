"""The prefix tree's nodes and its single mutation path: every change, whether `PrefixTree.insert`
made it, a `TreeDelta` replays it or `PrefixTree.from_nodes` rebuilds it, goes through the
`_apply_*` operations here, which check it against the current state (so a delta that does not
follow the tree is refused, never half-applied silently).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from agents_adapter.errors import DeltaError, InvalidNodesError
from agents_adapter.processor.token_arrays import (
    EMPTY_F32,
    EMPTY_I32,
    EMPTY_U8,
    F32,
    I32,
    U8,
    FloatArray,
    IntArray,
    MaskArray,
    check_claims,
)
from agents_adapter.processor.tree_delta import AddCall, AddNode, ClaimTokens, SplitNode, TreeDelta
from schemas.events import TrajectoryNode

ROOT: Final = -1


class TreeNode:
    __slots__ = ("children", "logprobs", "mask", "node_id", "parent", "tokens", "versions")

    def __init__(
        self,
        node_id: int,
        parent: TreeNode | None,
        tokens: IntArray,
        mask: MaskArray,
        logprobs: FloatArray,
        versions: IntArray,
    ) -> None:
        self.node_id = node_id
        self.parent = parent
        self.tokens = tokens
        self.mask = mask
        self.logprobs = logprobs
        self.versions = versions
        self.children: dict[int, TreeNode] = {}


@dataclass(frozen=True, slots=True)
class CallRecord:
    end_node: int
    num_tokens: int
    drift: bool
    digest: bytes


class TreeStore:
    """The nodes and call records of a tree, changed only by the operations below (`PrefixTree` builds on it)."""

    def __init__(self) -> None:
        self._root = TreeNode(ROOT, None, EMPTY_I32, EMPTY_U8, EMPTY_F32, EMPTY_I32)
        self._nodes: dict[int, TreeNode] = {}
        self._next_id = 0
        self._calls: dict[str, CallRecord] = {}
        self._tokens_in_tree = 0
        self._tokens_in_calls = 0
        self._drift_calls = 0
        self._canonical: list[TreeNode] | None = None
        self._canonical_index: dict[int, int] | None = None
        self._exported: tuple[TrajectoryNode, ...] | None = None
        self._versions: tuple[int, int] | None = None

    # --- applying operations (the single mutation path for insert, deltas and from_nodes) ---

    def _apply_add(self, op: AddNode) -> TreeNode:
        n = len(op.token_ids)
        if op.node_id in self._nodes or op.node_id < 0:
            raise DeltaError(f"node {op.node_id} already exists or is negative")
        parent = self._root if op.parent == ROOT else self._nodes.get(op.parent)
        if parent is None:
            raise DeltaError(f"node {op.node_id} names unknown parent {op.parent}")
        if n == 0 or not (len(op.loss_mask) == len(op.logprobs) == len(op.versions) == n):
            raise InvalidNodesError(f"node {op.node_id}: empty or ragged token arrays")
        mask = np.array(op.loss_mask, dtype=U8)
        logprobs = np.array(op.logprobs, dtype=F32)
        versions = np.array(op.versions, dtype=I32)
        check_claims(op.node_id, mask, logprobs, versions)
        first = int(op.token_ids[0])
        if first in parent.children:
            raise InvalidNodesError(f"node {op.node_id}: a sibling already starts with token {first}")
        node = TreeNode(op.node_id, parent, np.array(op.token_ids, dtype=I32), mask, logprobs, versions)
        parent.children[first] = node
        self._nodes[op.node_id] = node
        self._next_id = max(self._next_id, op.node_id + 1)
        self._tokens_in_tree += n
        self._changed(structure=True)
        return node

    def _apply_split(self, op: SplitNode) -> TreeNode:
        node = self._nodes.get(op.node_id)
        if node is None or not 0 < op.offset < len(node.tokens) or op.head_id in self._nodes:
            raise DeltaError(f"cannot split node {op.node_id} at {op.offset} into head {op.head_id}")
        parent = node.parent
        assert parent is not None
        k = op.offset
        head = TreeNode(op.head_id, parent, node.tokens[:k], node.mask[:k], node.logprobs[:k], node.versions[:k])
        node.tokens, node.mask = node.tokens[k:], node.mask[k:]
        node.logprobs, node.versions = node.logprobs[k:], node.versions[k:]
        parent.children[int(head.tokens[0])] = head
        head.children[int(node.tokens[0])] = node
        node.parent = head
        self._nodes[op.head_id] = head
        self._next_id = max(self._next_id, op.head_id + 1)
        self._changed(structure=True)
        return head

    def _apply_claim(self, op: ClaimTokens) -> None:
        node = self._nodes.get(op.node_id)
        n = len(op.versions)
        if node is None or op.offset < 0 or op.offset + n > len(node.tokens):
            raise DeltaError(f"claim on tokens {op.offset}..{op.offset + n} of node {op.node_id} is out of range")
        check_claims(op.node_id, op.loss_mask, op.logprobs, op.versions)
        end = op.offset + n
        node.mask[op.offset:end] = op.loss_mask
        node.logprobs[op.offset:end] = op.logprobs
        node.versions[op.offset:end] = op.versions
        self._changed(structure=False)

    def _apply_call(self, op: AddCall) -> None:
        if op.call_id in self._calls:
            raise DeltaError(f"call {op.call_id!r} is already in the tree")
        if op.end_node != ROOT and op.end_node not in self._nodes:
            raise DeltaError(f"call {op.call_id!r} ends at unknown node {op.end_node}")
        self._calls[op.call_id] = CallRecord(op.end_node, op.num_tokens, op.drift, op.digest)
        self._tokens_in_calls += op.num_tokens
        self._drift_calls += op.drift

    def _changed(self, *, structure: bool) -> None:
        if structure:
            self._canonical = None
            self._canonical_index = None
        self._exported = None
        self._versions = None

    def apply_delta(self, delta: TreeDelta) -> None:
        """Replays a delta taken from a tree in the state this tree is in now.

        Raises DeltaError when the delta does not follow this state (a missing, repeated or reordered
        delta); a tree that raised in the middle of a delta is inconsistent and must be rebuilt.
        """
        if (delta.base_nodes, delta.base_calls) != (self._next_id, len(self._calls)):
            raise DeltaError(
                f"delta expects {delta.base_nodes} nodes and {delta.base_calls} calls, "
                f"tree has {self._next_id} nodes and {len(self._calls)} calls"
            )
        for op in delta.ops:
            if isinstance(op, AddNode):
                self._apply_add(op)
            elif isinstance(op, SplitNode):
                self._apply_split(op)
            elif isinstance(op, ClaimTokens):
                self._apply_claim(op)
            else:
                self._apply_call(op)

    def empty_delta(self) -> TreeDelta:
        """A delta that changes nothing, valid on this tree's current state."""
        return TreeDelta(self._next_id, len(self._calls))
