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

Delta wire format (`TreeDelta.to_bytes`, all integers little-endian)
    header  magic b"SFTD", u8 format (1), u32 base_nodes, u32 base_calls, u32 op count
    ops, each starting with a u8 kind:
      1 ADD    u32 node, i32 parent (-1 = root), u32 n, then i32 token_ids[n], u8 loss_mask[n],
               f32 logprobs[n], i32 versions[n]                          (13 + 13 n bytes)
      2 SPLIT  u32 node, u32 offset, u32 head: the first `offset` tokens of `node` move to a new node
               `head` between `node` and its parent (the tail keeps the id, so calls ending at
               `node` and its children stay attached)                        (13 bytes)
      3 CLAIM  u32 node, u32 offset, u32 n, then u8 loss_mask[n], f32 logprobs[n], i32 versions[n]:
               the merged values for tokens offset..offset+n of `node`    (13 + 9 n bytes)
      4 CALL   i32 end node (-1 = root), u32 tokens, u8 drift, 8 bytes blake2b digest of the call's
               tokens, logprobs and versions, u16 id length, utf-8 call id    (20 + id bytes)
    Node ids are internal (creation order) and survive snapshot/apply; `nodes()` renumbers them.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

from agents_adapter.errors import (
    ConflictingCallError,
    DeltaError,
    InvalidNodesError,
    MalformedCallError,
    UnknownCallError,
)
from schemas.events import LLMCall, TrajectoryNode
from schemas.packed import Float32s, Int32s, UInt8s

ROOT: Final = -1

I32: Final = np.dtype("<i4")
F32: Final = np.dtype("<f4")
U8: Final = np.dtype("u1")

IntArray: TypeAlias = npt.NDArray[np.int32]
FloatArray: TypeAlias = npt.NDArray[np.float32]
MaskArray: TypeAlias = npt.NDArray[np.uint8]

_EMPTY_I32: Final = np.zeros(0, I32)
_EMPTY_F32: Final = np.zeros(0, F32)
_EMPTY_U8: Final = np.zeros(0, U8)


# --- delta operations --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class AddNode:
    """A new node under `parent` (ROOT for the root); its first token is new among the siblings."""

    node_id: int
    parent: int
    token_ids: IntArray
    loss_mask: MaskArray
    logprobs: FloatArray
    versions: IntArray


@dataclass(frozen=True, slots=True)
class SplitNode:
    """The first `offset` tokens of `node_id` become the new node `head_id`, parent of the rest."""

    node_id: int
    offset: int
    head_id: int


@dataclass(frozen=True, slots=True, eq=False)
class ClaimTokens:
    """Merged (mask, logprob, version) of tokens `offset..offset+n` of a node after a stronger claim."""

    node_id: int
    offset: int
    loss_mask: MaskArray
    logprobs: FloatArray
    versions: IntArray


@dataclass(frozen=True, slots=True)
class AddCall:
    """A call merged into the tree; its prompt+output is the path from the root to `end_node`."""

    call_id: str
    end_node: int
    num_tokens: int
    drift: bool
    digest: bytes


DeltaOp: TypeAlias = AddNode | SplitNode | ClaimTokens | AddCall

_MAGIC: Final = b"SFTD"
_FORMAT: Final = 1
_HEADER = struct.Struct("<4sBIII")
_ADD = struct.Struct("<BIiI")
_SPLIT = struct.Struct("<BIII")
_CLAIM = struct.Struct("<BIII")
_CALL = struct.Struct("<BiIB8sH")
_KIND_ADD, _KIND_SPLIT, _KIND_CLAIM, _KIND_CALL = 1, 2, 3, 4
_ADD_TOKEN_BYTES: Final = 13  # i32 token + u8 mask + f32 logprob + i32 version
_CLAIM_TOKEN_BYTES: Final = 9


@dataclass(frozen=True, slots=True, eq=False)
class TreeDelta:
    """What one change did to a tree, replayable on a tree with `base_nodes` nodes and `base_calls` calls.

    Compare deltas by `to_bytes()`. An empty delta (no ops) is what a duplicate insert returns.
    """

    base_nodes: int
    base_calls: int
    ops: tuple[DeltaOp, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ops)

    @property
    def new_tokens(self) -> int:
        """Tokens this delta adds to the tree."""
        return sum(len(op.token_ids) for op in self.ops if isinstance(op, AddNode))

    @property
    def claimed_tokens(self) -> int:
        """Existing tokens whose mask/logprob/version this delta rewrites."""
        return sum(len(op.versions) for op in self.ops if isinstance(op, ClaimTokens))

    @property
    def nbytes(self) -> int:
        """Length of `to_bytes()`, computed without encoding."""
        size = _HEADER.size
        for op in self.ops:
            if isinstance(op, AddNode):
                size += _ADD.size + _ADD_TOKEN_BYTES * len(op.token_ids)
            elif isinstance(op, SplitNode):
                size += _SPLIT.size
            elif isinstance(op, ClaimTokens):
                size += _CLAIM.size + _CLAIM_TOKEN_BYTES * len(op.versions)
            else:
                size += _CALL.size + len(op.call_id.encode())
        return size

    def to_bytes(self) -> bytes:
        parts = [_HEADER.pack(_MAGIC, _FORMAT, self.base_nodes, self.base_calls, len(self.ops))]
        for op in self.ops:
            if isinstance(op, AddNode):
                parts += [
                    _ADD.pack(_KIND_ADD, op.node_id, op.parent, len(op.token_ids)),
                    op.token_ids.astype(I32, copy=False).tobytes(),
                    op.loss_mask.astype(U8, copy=False).tobytes(),
                    op.logprobs.astype(F32, copy=False).tobytes(),
                    op.versions.astype(I32, copy=False).tobytes(),
                ]
            elif isinstance(op, SplitNode):
                parts.append(_SPLIT.pack(_KIND_SPLIT, op.node_id, op.offset, op.head_id))
            elif isinstance(op, ClaimTokens):
                parts += [
                    _CLAIM.pack(_KIND_CLAIM, op.node_id, op.offset, len(op.versions)),
                    op.loss_mask.astype(U8, copy=False).tobytes(),
                    op.logprobs.astype(F32, copy=False).tobytes(),
                    op.versions.astype(I32, copy=False).tobytes(),
                ]
            else:
                call_id = op.call_id.encode()
                parts += [
                    _CALL.pack(_KIND_CALL, op.end_node, op.num_tokens, op.drift, op.digest, len(call_id)),
                    call_id,
                ]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> TreeDelta:
        try:
            return _DeltaReader(data).read()
        except (struct.error, ValueError, IndexError, UnicodeDecodeError) as e:
            raise DeltaError(f"undecodable tree delta ({len(data)} bytes): {e}") from e


class _DeltaReader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def read(self) -> TreeDelta:
        magic, fmt, base_nodes, base_calls, n_ops = self._unpack(_HEADER)
        if magic != _MAGIC or fmt != _FORMAT:
            raise DeltaError(f"not a tree delta: magic {magic!r}, format {fmt}")
        ops = tuple(self._op() for _ in range(n_ops))
        if self.pos != len(self.data):
            raise DeltaError(f"tree delta has {len(self.data) - self.pos} trailing bytes")
        return TreeDelta(base_nodes, base_calls, ops)

    def _op(self) -> DeltaOp:
        kind = self.data[self.pos]
        if kind == _KIND_ADD:
            _, node, parent, n = self._unpack(_ADD)
            return AddNode(node, parent, self._array(I32, n), self._array(U8, n),
                           self._array(F32, n), self._array(I32, n))
        if kind == _KIND_SPLIT:
            _, node, offset, head = self._unpack(_SPLIT)
            return SplitNode(node, offset, head)
        if kind == _KIND_CLAIM:
            _, node, offset, n = self._unpack(_CLAIM)
            return ClaimTokens(node, offset, self._array(U8, n), self._array(F32, n), self._array(I32, n))
        if kind == _KIND_CALL:
            _, end, num_tokens, drift, digest, id_len = self._unpack(_CALL)
            call_id = bytes(self.data[self.pos:self.pos + id_len]).decode()
            if len(call_id.encode()) != id_len:
                raise DeltaError("tree delta truncated inside a call id")
            self.pos += id_len
            return AddCall(call_id, end, num_tokens, bool(drift), digest)
        raise DeltaError(f"unknown tree delta op kind {kind} at byte {self.pos}")

    def _unpack(self, layout: struct.Struct) -> tuple:
        values = layout.unpack_from(self.data, self.pos)
        self.pos += layout.size
        return values

    def _array(self, dtype: np.dtype, n: int) -> np.ndarray:
        arr = np.frombuffer(self.data, dtype=dtype, count=n, offset=self.pos)
        self.pos += n * dtype.itemsize
        return arr


# --- the tree ----------------------------------------------------------------------------------


class _Node:
    __slots__ = ("children", "logprobs", "mask", "node_id", "parent", "tokens", "versions")

    def __init__(
        self,
        node_id: int,
        parent: _Node | None,
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
        self.children: dict[int, _Node] = {}


@dataclass(frozen=True, slots=True)
class _CallRecord:
    end_node: int
    num_tokens: int
    drift: bool
    digest: bytes


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


class PrefixTree:
    """One session's calls merged by longest prefix; see the module docstring for the rules."""

    def __init__(self) -> None:
        self._root = _Node(ROOT, None, _EMPTY_I32, _EMPTY_U8, _EMPTY_F32, _EMPTY_I32)
        self._nodes: dict[int, _Node] = {}
        self._next_id = 0
        self._calls: dict[str, _CallRecord] = {}
        self._tokens_in_tree = 0
        self._tokens_in_calls = 0
        self._drift_calls = 0
        self._canonical: list[_Node] | None = None
        self._canonical_index: dict[int, int] | None = None
        self._exported: tuple[TrajectoryNode, ...] | None = None
        self._versions: tuple[int, int] | None = None

    # --- building ---

    def insert(self, call: LLMCall) -> TreeDelta:
        """Merges a call at its longest matching prefix and returns what changed.

        Inserting a call id again with the same content changes nothing (empty delta); with other
        content it raises ConflictingCallError. A malformed call raises MalformedCallError. Either way
        the tree is left as it was.
        """
        tokens, out_logprobs, out_versions = _call_arrays(call)
        n_prompt = len(call.prompt_ids)
        digest = _call_digest(n_prompt, tokens, out_logprobs, out_versions)
        ops: list[DeltaOp] = []
        delta_base = (self._next_id, len(self._calls))
        known = self._calls.get(call.call_id)
        if known is not None:
            if known.digest != digest or known.num_tokens != len(tokens):
                raise ConflictingCallError(f"call {call.call_id!r} arrived again with different content")
            return self.empty_delta()
        node = self._root
        pos, end = 0, len(tokens)
        while pos < end:
            child = node.children.get(int(tokens[pos]))
            if child is None:
                node = self._add_tail(node, tokens, pos, n_prompt, out_logprobs, out_versions, ops)
                break
            span = len(child.tokens)
            shared = _common_prefix(child.tokens, tokens[pos:pos + span])
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
        parent: _Node,
        tokens: IntArray,
        pos: int,
        n_prompt: int,
        out_logprobs: FloatArray,
        out_versions: IntArray,
        ops: list[DeltaOp],
    ) -> _Node:
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
        node: _Node,
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
            (tree_ver == call_ver) & (_float_order(tree_lp) < _float_order(call_lp))
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

    # --- applying operations (the single mutation path for insert, deltas and from_nodes) ---

    def _apply_add(self, op: AddNode) -> _Node:
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
        _check_claims(op.node_id, mask, logprobs, versions)
        first = int(op.token_ids[0])
        if first in parent.children:
            raise InvalidNodesError(f"node {op.node_id}: a sibling already starts with token {first}")
        node = _Node(op.node_id, parent, np.array(op.token_ids, dtype=I32), mask, logprobs, versions)
        parent.children[first] = node
        self._nodes[op.node_id] = node
        self._next_id = max(self._next_id, op.node_id + 1)
        self._tokens_in_tree += n
        self._changed(structure=True)
        return node

    def _apply_split(self, op: SplitNode) -> _Node:
        node = self._nodes.get(op.node_id)
        if node is None or not 0 < op.offset < len(node.tokens) or op.head_id in self._nodes:
            raise DeltaError(f"cannot split node {op.node_id} at {op.offset} into head {op.head_id}")
        parent = node.parent
        assert parent is not None
        k = op.offset
        head = _Node(op.head_id, parent, node.tokens[:k], node.mask[:k], node.logprobs[:k], node.versions[:k])
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
        _check_claims(op.node_id, op.loss_mask, op.logprobs, op.versions)
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
        self._calls[op.call_id] = _CallRecord(op.end_node, op.num_tokens, op.drift, op.digest)
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

    def _path_to(self, last: _Node) -> TreePath:
        chain: list[_Node] = []
        node: _Node | None = last
        while node is not None and node is not self._root:
            chain.append(node)
            node = node.parent
        chain.reverse()
        canonical = self._canonical_ids()
        if not chain:
            return TreePath((), _EMPTY_I32.copy(), _EMPTY_U8.copy(), _EMPTY_F32.copy(), _EMPTY_I32.copy())
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

    def _ordered(self) -> list[_Node]:
        """Depth first, parents before children, siblings by first token."""
        if self._canonical is None:
            ordered: list[_Node] = []
            stack = [self._root.children[t] for t in sorted(self._root.children, reverse=True)]
            while stack:
                node = stack.pop()
                ordered.append(node)
                stack += [node.children[t] for t in sorted(node.children, reverse=True)]
            self._canonical = ordered
        return self._canonical


# --- helpers ---------------------------------------------------------------------------------


def _call_arrays(call: LLMCall) -> tuple[IntArray, FloatArray, IntArray]:
    """prompt+output token ids, output logprobs and output versions as arrays; validates lengths."""
    n_out = len(call.output_ids)
    if len(call.output_logprobs) != n_out or len(call.output_versions) != n_out:
        raise MalformedCallError(
            f"call {call.call_id!r}: {n_out} output tokens but {len(call.output_logprobs)} logprobs "
            f"and {len(call.output_versions)} versions"
        )
    if len(call.call_id.encode()) > 0xFFFF:
        raise MalformedCallError(f"call id of {len(call.call_id.encode())} bytes (at most 65535)")
    n_prompt = len(call.prompt_ids)
    try:
        tokens = np.empty(n_prompt + n_out, I32)
        tokens[:n_prompt] = np.fromiter(call.prompt_ids, I32, n_prompt)
        tokens[n_prompt:] = np.fromiter(call.output_ids, I32, n_out)
        logprobs = np.fromiter(call.output_logprobs, F32, n_out)
        versions = np.fromiter(call.output_versions, I32, n_out)
    except (OverflowError, ValueError, TypeError) as e:
        raise MalformedCallError(f"call {call.call_id!r}: {e}") from e
    return tokens, logprobs, versions


def _call_digest(n_prompt: int, tokens: IntArray, logprobs: FloatArray, versions: IntArray) -> bytes:
    h = hashlib.blake2b(digest_size=8)
    h.update(n_prompt.to_bytes(8, "little"))
    h.update(tokens.tobytes())
    h.update(logprobs.tobytes())
    h.update(versions.tobytes())
    return h.digest()


def _common_prefix(a: IntArray, b: IntArray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    differ = a[:n] != b[:n]
    first = int(differ.argmax()) if n else 0
    return first if n and differ[first] else n


def _float_order(x: FloatArray) -> IntArray:
    """int32 keys ordered like the float32 values (total order: -0.0 < +0.0, NaNs at the ends)."""
    bits = x.view(I32)
    return bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))


def _check_claims(node_id: int, mask: MaskArray, logprobs: FloatArray, versions: IntArray) -> None:
    """Masks are 0/1 and given tokens carry the canonical (logprob 0.0, version -1)."""
    if len(mask) and int(mask.max()) > 1:
        raise InvalidNodesError(f"node {node_id}: loss mask values must be 0 or 1")
    given = mask == 0
    if given.any() and (
        (versions[given] != -1).any() or (logprobs[given].view(I32) != 0).any()
    ):
        raise InvalidNodesError(f"node {node_id}: given tokens must have version -1 and logprob 0.0")
