"""Packed token payloads.

Token ids and per-token versions travel as little-endian int32 `bytes`, logprobs as little-endian
float32 and loss masks as uint8, never as Avro arrays: fastavro decodes an `array<int>` item by item in
Python while a packed field is one `bytes` copy that numpy reads without parsing (see bench/bus_bench.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from schemas.errors import DecodeError, EncodeError

INT32: Final = "<i4"
FLOAT32: Final = "<f4"
UINT8: Final = "u1"

_LIMITS: Final = {INT32: (-(2**31), 2**31 - 1), UINT8: (0, 255)}


def pack(values: Sequence[int] | Sequence[float] | np.ndarray, dtype: str) -> bytes:
    """Packs a sequence into little-endian bytes, refusing values the dtype cannot hold exactly."""
    arr = np.asarray(values)
    if arr.ndim != 1 and arr.size:
        raise EncodeError(f"packed field needs a flat sequence, got shape {arr.shape}")
    if dtype in _LIMITS and arr.size:
        if arr.dtype.kind not in "iub":
            raise EncodeError(f"packed {dtype} field needs integers, got {arr.dtype}")
        lo, hi = _LIMITS[dtype]
        if int(arr.min()) < lo or int(arr.max()) > hi:
            raise EncodeError(f"value out of range for {dtype}: [{int(arr.min())}, {int(arr.max())}]")
    return arr.astype(dtype, copy=False).tobytes()


def unpack(data: bytes, dtype: str) -> np.ndarray:
    """A read-only numpy view of packed bytes (no copy)."""
    itemsize = np.dtype(dtype).itemsize
    if len(data) % itemsize:
        raise DecodeError(f"packed {dtype} field has {len(data)} bytes, not a multiple of {itemsize}")
    return np.frombuffer(data, dtype=dtype)


def unpack_tuple(data: bytes, dtype: str) -> tuple:
    """Packed bytes as a tuple of Python numbers (what the event dataclasses hold)."""
    return tuple(unpack(data, dtype).tolist())
