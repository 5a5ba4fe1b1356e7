"""Token runs as numpy arrays, and the array arithmetic of the prefix tree's merge rule (`prefix_tree`).

A node holds its tokens as four arrays (token ids int32, loss mask uint8, behaviour logprob float32,
policy version int32), never one Python object per token: prompts are thousands of tokens and the walk
compares whole slices. The helpers here turn a call into those arrays, compare runs, and order
float32 logprobs totally (the merge rule's tie-break).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

from agents_adapter.errors import InvalidNodesError, MalformedCallError
from schemas.events import LLMCall
from schemas.packed import PackedArray

I32: Final = np.dtype("<i4")
F32: Final = np.dtype("<f4")
U8: Final = np.dtype("u1")

IntArray: TypeAlias = npt.NDArray[np.int32]
FloatArray: TypeAlias = npt.NDArray[np.float32]
MaskArray: TypeAlias = npt.NDArray[np.uint8]

EMPTY_I32: Final = np.zeros(0, I32)
EMPTY_F32: Final = np.zeros(0, F32)
EMPTY_U8: Final = np.zeros(0, U8)


def call_arrays(call: LLMCall) -> tuple[IntArray, FloatArray, IntArray]:
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
        tokens[:n_prompt] = _as_array(call.prompt_ids, I32)
        tokens[n_prompt:] = _as_array(call.output_ids, I32)
        logprobs = _as_array(call.output_logprobs, F32)
        versions = _as_array(call.output_versions, I32)
    except (OverflowError, ValueError, TypeError) as e:
        raise MalformedCallError(f"call {call.call_id!r}: {e}") from e
    return tokens, logprobs, versions


def _as_array(values: Sequence[int] | Sequence[float], dtype: np.dtype) -> npt.NDArray:
    """A packed field as a numpy view (no per-number iteration: a 64K-token prompt is one copy), anything else
    (a tuple a test built) converted number by number, refusing values the dtype cannot hold."""
    if isinstance(values, PackedArray) and values.array.dtype == dtype:
        return values.array
    return np.fromiter(values, dtype, len(values))


def call_content_digest(n_prompt: int, tokens: IntArray, logprobs: FloatArray, versions: IntArray) -> bytes:
    h = hashlib.blake2b(digest_size=8)
    h.update(n_prompt.to_bytes(8, "little"))
    h.update(tokens.tobytes())
    h.update(logprobs.tobytes())
    h.update(versions.tobytes())
    return h.digest()


def common_prefix(a: IntArray, b: IntArray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    differ = a[:n] != b[:n]
    first = int(differ.argmax()) if n else 0
    return first if n and differ[first] else n


def float_order(x: FloatArray) -> IntArray:
    """int32 keys ordered like the float32 values (total order: -0.0 < +0.0, NaNs at the ends)."""
    bits = x.view(I32)
    return bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))


def check_claims(node_id: int, mask: MaskArray, logprobs: FloatArray, versions: IntArray) -> None:
    """Masks are 0/1 and given tokens carry the canonical (logprob 0.0, version -1)."""
    if len(mask) and int(mask.max()) > 1:
        raise InvalidNodesError(f"node {node_id}: loss mask values must be 0 or 1")
    given = mask == 0
    if given.any() and (
        (versions[given] != -1).any() or (logprobs[given].view(I32) != 0).any()
    ):
        raise InvalidNodesError(f"node {node_id}: given tokens must have version -1 and logprob 0.0")
