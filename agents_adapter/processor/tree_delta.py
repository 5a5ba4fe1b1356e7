"""The prefix tree's deltas: what one change did to a tree, and their wire format (`prefix_tree`).

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

import struct
from dataclasses import dataclass
from typing import Final, TypeAlias

import numpy as np

from agents_adapter.errors import DeltaError
from agents_adapter.processor.token_arrays import F32, I32, U8, FloatArray, IntArray, MaskArray


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
