"""A session's prefix tree: every LLM call merged at its longest matching prefix (docs/architecture.md).

The tree is a radix tree of token ids. Each node holds a run of tokens as four numpy arrays (token
ids int32, loss mask uint8, behaviour logprob float32, policy version int32), never one Python object
per token: prompts are thousands of tokens and the walk compares whole slices.

Shape rule (why the tree does not depend on insertion order)
    A node ends exactly where two inserted sequences diverge or where an inserted call ends; nothing
    else splits a node and nodes never merge. The set of node boundaries is therefore a function of
    the *set* of calls, so any insertion order (with any duplicates) yields the same tree. A call
    ending at a node boundary also gives `path_of(call_id)` an exact root-to-node path.

Merge rule (what a token's loss mask, logprob and version are when calls disagree)
    Several calls may cover the same token at the same position: the output of turn k is in the
    prompt of turn k+1, and a retried prompt may re-generate identical tokens. Every covering call
    makes a claim (mask, version, logprob): a prompt token claims (0, -1, 0.0), a generated token
    (1, its version, its logprob). The tree keeps the largest claim in the lexicographic order of
    (mask, version, logprob), logprobs compared by the total order of their float32 bit patterns
    (-0.0 < +0.0, NaNs at the ends). So *generated wins* over given, then the newest policy version,
    then the larger logprob. A maximum over a total order is commutative, associative and idempotent:
    the result does not depend on the order the claims arrive in, nor on duplicates.

Canonical export
    `nodes()` lists the nodes depth first, parents before children, siblings by their first token
    (siblings always differ in their first token), numbered by that position. Two trees holding the
    same calls give equal `nodes()` whatever the insertion order.

Incremental persistence
    Every change is an operation of a `TreeDelta`: `insert` returns the delta it applied, and
    `apply_delta` replays one on a tree in the same state (same node and call counts, checked). A tree
    stored as `snapshot()` + the deltas that followed is rebuilt exactly by `from_deltas`. A delta
    holds only the new tokens, the split points and the changed claims, so its size is proportional
    to what the call added, not to the tree.
    The delta operations and their wire format are in `tree_delta`; the mutation path that applies
    them in `tree_store`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from agents_adapter.errors import ConflictingCallError, DeltaError, InvalidNodesError, UnknownCallError
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
    call_arrays,
    call_content_digest,
    common_prefix,
    float_order,
)
from agents_adapter.processor.tree_delta import AddCall, AddNode, ClaimTokens, DeltaOp, SplitNode, TreeDelta
from agents_adapter.processor.tree_store import ROOT, TreeNode, TreeStore
from schemas.events import LLMCall, TrajectoryNode
from schemas.packed import Float32s, Int32s, UInt8s


@dataclass(frozen=True, slots=True, eq=False)
class TreePath:
    """A root-to-node path: the tokens a call (or a leaf) sees, with their merged claims.

    `node_ids` are canonical ids (positions in `nodes()`).
    """

    node_ids: tuple[int, ...]
    token_ids: IntArray
    loss_mask: MaskArray
    logprobs: FloatArray
    versions: IntArray

    def __len__(self) -> int:
        return len(self.token_ids)


class PrefixTree(TreeStore):
    """One session's calls merged by longest prefix; see the module docstring for the rules."""

    # --- building ---

    def insert(self, call: LLMCall, extends: str = "") -> TreeDelta:
        """Merges a call at its longest matching prefix and returns what changed.

        Inserting a call id again with the same content changes nothing (empty delta); with other
        content it raises ConflictingCallError. A malformed call raises MalformedCallError. Either way
        the tree is left as it was.

        `extends`: a call of this tree whose prompt+output the caller knows begins this call's prompt (it
        took those ids from `ids_of(extends)`): the walk starts at that call's end node, since the walk from
        the root would follow its path and the prompt claims nothing there (a given token never beats a
        claim). The same tree and delta, without comparing the shared tokens again.
        """
        tokens, out_logprobs, out_versions = call_arrays(call)
        n_prompt = len(call.prompt_ids)
        digest = call_content_digest(n_prompt, tokens, out_logprobs, out_versions)
        ops: list[DeltaOp] = []
        delta_base = (self._next_id, len(self._calls))
        known = self._calls.get(call.call_id)
        if known is not None:
            if known.digest != digest or known.num_tokens != len(tokens):
                raise ConflictingCallError(f"call {call.call_id!r} arrived again with different content")
            return self.empty_delta()
        node, pos, end = self._root, 0, len(tokens)
        base = self._calls.get(extends) if extends else None
        if base is not None and base.num_tokens <= n_prompt:
            node = self._root if base.end_node == ROOT else self._nodes[base.end_node]
            pos = base.num_tokens
        while pos < end:
            child = node.children.get(int(tokens[pos]))
            if child is None:
                node = self._add_tail(node, tokens, pos, n_prompt, out_logprobs, out_versions, ops)
                break
            span = len(child.tokens)
            shared = common_prefix(child.tokens, tokens[pos:pos + span])
            if shared < span:
                split = SplitNode(child.node_id, shared, self._next_id)
                child = self._apply_split(split)
                ops.append(split)
            self._claim(child, pos, n_prompt, out_logprobs, out_versions, ops)
            node, pos = child, pos + shared
        record = AddCall(call.call_id, node.node_id, end, bool(call.drift), digest)
        self._apply_call(record)
        ops.append(record)
        return TreeDelta(*delta_base, tuple(ops))

    def _add_tail(
        self,
        parent: TreeNode,
        tokens: IntArray,
        pos: int,
        n_prompt: int,
        out_logprobs: FloatArray,
        out_versions: IntArray,
        ops: list[DeltaOp],
    ) -> TreeNode:
        given = max(n_prompt - pos, 0)
        generated = len(tokens) - pos - given
        mask = np.empty(given + generated, U8)
        mask[:given], mask[given:] = 0, 1
        logprobs = np.empty(given + generated, F32)
        logprobs[:given], logprobs[given:] = 0.0, out_logprobs[len(out_logprobs) - generated:]
        versions = np.empty(given + generated, I32)
        versions[:given], versions[given:] = -1, out_versions[len(out_versions) - generated:]
        add = AddNode(self._next_id, parent.node_id, tokens[pos:], mask, logprobs, versions)
        ops.append(add)
        return self._apply_add(add)

    def _claim(
        self,
        node: TreeNode,
        pos: int,
        n_prompt: int,
        out_logprobs: FloatArray,
        out_versions: IntArray,
        ops: list[DeltaOp],
    ) -> None:
        """Applies the call's generated-token claims on `node` (which starts at `pos`) where stronger."""
        lo = max(pos, n_prompt)
        hi = pos + len(node.tokens)
        if lo >= hi:
            return
        out_lo, out_hi = lo - n_prompt, hi - n_prompt
        call_lp, call_ver = out_logprobs[out_lo:out_hi], out_versions[out_lo:out_hi]
        sl = slice(lo - pos, hi - pos)
        tree_mask, tree_lp, tree_ver = node.mask[sl], node.logprobs[sl], node.versions[sl]
        stronger = (tree_mask == 0) | (tree_ver < call_ver) | (
            (tree_ver == call_ver) & (float_order(tree_lp) < float_order(call_lp))
        )
        changed = np.flatnonzero(stronger)
        if not len(changed):
            return
        first, last = int(changed[0]), int(changed[-1]) + 1
        take = stronger[first:last]
        claim = ClaimTokens(
            node.node_id,
            lo - pos + first,
            np.where(take, np.uint8(1), tree_mask[first:last]).astype(U8),
            np.where(take, call_lp[first:last], tree_lp[first:last]).astype(F32),
            np.where(take, call_ver[first:last], tree_ver[first:last]).astype(I32),
        )
        self._apply_claim(claim)
        ops.append(claim)

    def snapshot(self) -> TreeDelta:
        """The whole tree as one delta applicable to an empty tree (a base for later deltas)."""
        ops: list[DeltaOp] = [
            AddNode(n.node_id, n.parent.node_id if n.parent else ROOT, n.tokens.copy(), n.mask.copy(),
                    n.logprobs.copy(), n.versions.copy())
            for n in self._ordered()
        ]
        ops += [AddCall(cid, r.end_node, r.num_tokens, r.drift, r.digest) for cid, r in self._calls.items()]
        return TreeDelta(0, 0, tuple(ops))

    @classmethod
    def from_deltas(cls, deltas: Iterable[TreeDelta]) -> PrefixTree:
        tree = cls()
        for delta in deltas:
            tree.apply_delta(delta)
        return tree

    @classmethod
    def from_nodes(cls, nodes: Sequence[TrajectoryNode]) -> PrefixTree:
        """Rebuilds the tree of a Trajectory event (parents listed before children).

        The calls are not in a Trajectory's nodes: the rebuilt tree has the nodes but no call records.
        """
        tree = cls()
        internal: dict[int, int] = {}
        for position, node in enumerate(nodes):
            if node.node_id in internal:
                raise InvalidNodesError(f"node id {node.node_id} appears twice")
            if node.parent != ROOT and node.parent not in internal:
                raise InvalidNodesError(f"node {node.node_id} comes before its parent {node.parent}")
            try:
                add = AddNode(
                    position,
                    ROOT if node.parent == ROOT else internal[node.parent],
                    np.array(node.token_ids, dtype=I32),
                    np.array(node.loss_mask, dtype=U8),
                    np.array(node.logprobs, dtype=F32),
                    np.array(node.versions, dtype=I32),
                )
            except (OverflowError, ValueError, TypeError) as e:
                raise InvalidNodesError(f"node {node.node_id}: {e}") from e
            try:
                tree._apply_add(add)
            except DeltaError as e:
                raise InvalidNodesError(str(e)) from e
            internal[node.node_id] = position
        return tree

    # --- reading ---

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._calls

    @property
    def call_ids(self) -> tuple[str, ...]:
        """Calls merged into the tree, in insertion order."""
        return tuple(self._calls)

    @property
    def num_calls(self) -> int:
        return len(self._calls)

    @property
    def num_nodes(self) -> int:
        return len(self._nodes)

    @property
    def tokens_in_calls(self) -> int:
        """Sum of prompt+output tokens over the calls: what storing every call whole would cost."""
        return self._tokens_in_calls

    @property
    def tokens_in_tree(self) -> int:
        return self._tokens_in_tree

    @property
    def drift_calls(self) -> int:
        return self._drift_calls

    @property
    def min_version(self) -> int:
        """Oldest policy version among the tree's generated tokens (-1 if none)."""
        return self._version_range()[0]

    @property
    def max_version(self) -> int:
        """Newest policy version among the tree's generated tokens (-1 if none)."""
        return self._version_range()[1]

    def _version_range(self) -> tuple[int, int]:
        if self._versions is None:
            lows, highs = [], []
            for node in self._nodes.values():
                generated = node.versions[node.mask == 1]
                if len(generated):
                    lows.append(int(generated.min()))
                    highs.append(int(generated.max()))
            self._versions = (min(lows), max(highs)) if lows else (-1, -1)
        return self._versions

    def nodes(self) -> tuple[TrajectoryNode, ...]:
        """The tree in canonical order (see the module docstring); equal for equal sets of calls."""
        if self._exported is None:
            ordered = self._ordered()
            ids = self._canonical_ids()
            self._exported = tuple(
                TrajectoryNode(
                    node_id=i,
                    parent=ids[n.parent.node_id] if n.parent else ROOT,
                    token_ids=Int32s(n.tokens),
                    loss_mask=UInt8s(n.mask),
                    logprobs=Float32s(n.logprobs),
                    versions=Int32s(n.versions),
                )
                for i, n in enumerate(ordered)
            )
        return self._exported

    def paths(self) -> tuple[TreePath, ...]:
        """Every root-to-leaf path, leaves in canonical order."""
        return tuple(self._path_to(n) for n in self._ordered() if not n.children)

    def path_of(self, call_id: str) -> TreePath:
        """The root-to-node path whose tokens are exactly the call's prompt+output."""
        try:
            record = self._calls[call_id]
        except KeyError:
            raise UnknownCallError(call_id) from None
        return self._path_to(self._root if record.end_node == ROOT else self._nodes[record.end_node])

    def ids_of(self, call_id: str) -> IntArray:
        """The call's prompt+output ids (what a call recorded by reference to it takes its first ids from)."""
        try:
            record = self._calls[call_id]
        except KeyError:
            raise UnknownCallError(call_id) from None
        chain: list[IntArray] = []
        node = None if record.end_node == ROOT else self._nodes[record.end_node]
        while node is not None and node is not self._root:
            chain.append(node.tokens)
            node = node.parent
        return np.concatenate(chain[::-1]) if chain else EMPTY_I32.copy()

    def _path_to(self, last: TreeNode) -> TreePath:
        chain: list[TreeNode] = []
        node: TreeNode | None = last
        while node is not None and node is not self._root:
            chain.append(node)
            node = node.parent
        chain.reverse()
        canonical = self._canonical_ids()
        if not chain:
            return TreePath((), EMPTY_I32.copy(), EMPTY_U8.copy(), EMPTY_F32.copy(), EMPTY_I32.copy())
        return TreePath(
            tuple(canonical[n.node_id] for n in chain),
            np.concatenate([n.tokens for n in chain]),
            np.concatenate([n.mask for n in chain]),
            np.concatenate([n.logprobs for n in chain]),
            np.concatenate([n.versions for n in chain]),
        )

    def _canonical_ids(self) -> dict[int, int]:
        """Internal node id -> canonical id (position in `nodes()`); the root maps to ROOT."""
        if self._canonical_index is None:
            self._canonical_index = {n.node_id: i for i, n in enumerate(self._ordered())}
            self._canonical_index[ROOT] = ROOT
        return self._canonical_index

    def _ordered(self) -> list[TreeNode]:
        """Depth first, parents before children, siblings by first token."""
        if self._canonical is None:
            ordered: list[TreeNode] = []
            stack = [self._root.children[t] for t in sorted(self._root.children, reverse=True)]
            while stack:
                node = stack.pop()
                ordered.append(node)
                stack += [node.children[t] for t in sorted(node.children, reverse=True)]
            self._canonical = ordered
        return self._canonical

