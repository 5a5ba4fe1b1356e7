"""Packed token payloads.

Token ids and per-token versions travel as little-endian int32 `bytes`, logprobs as little-endian
float32 and loss masks as uint8, never as Avro arrays: fastavro decodes an `array<int>` item by item in
Python while a packed field is one `bytes` copy that numpy reads without parsing (see bench/bus_bench.py).
"""

from __future__ import annotations

import array
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import numpy as np

from schemas.errors import DecodeError, EncodeError

INT32: Final = "<i4"
FLOAT32: Final = "<f4"
UINT8: Final = "u1"

_LIMITS: Final = {INT32: (-(2**31), 2**31 - 1), UINT8: (0, 255)}
#: `array` type codes of the integer dtypes, where the machine's order is little-endian: a list of Python ints
#: packs in one C loop that refuses what the type cannot hold, ~2x faster than numpy's conversion and range
#: check for a prompt's ids, ~8x for a short list (every call's event packs four)
_ARRAY_CODES: Final = {dtype: code for dtype, code in ((INT32, "i"), (UINT8, "B"))
                       if sys.byteorder == "little" and array.array(code).itemsize == np.dtype(dtype).itemsize}


def pack(values: Sequence[int] | Sequence[float] | np.ndarray, dtype: str) -> bytes:
    """Packs a sequence into little-endian bytes, refusing values the dtype cannot hold exactly."""
    code = _ARRAY_CODES.get(dtype)
    if code is not None and type(values) in (list, tuple):
        try:
            return array.array(code, values).tobytes()
        except (OverflowError, TypeError):
            pass  # refused: numpy's path below says why, as for any other input
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


class PackedArray(Sequence[Any]):
    """An immutable, tuple-like array of numbers that stays packed from the wire to numpy.

    Decoding wraps the message's bytes without copying or parsing (`np.frombuffer`), encoding
    hands the same bytes back; `np.asarray(x)` and `torch.from_numpy(np.asarray(x))` read it
    in place. It compares equal to another packed array or to a tuple/list of the same numbers,
    and `+` concatenates as for tuples.
    """

    __slots__ = ("_array", "_raw")
    DTYPE: str = INT32
    _ITEMSIZE: int = 4

    def __init__(self, values: Iterable[Any] | bytes | np.ndarray = ()) -> None:
        if type(values) is bytes:  # the decode path: wrap the message's bytes; the view is made when read
            if len(values) % self._ITEMSIZE:
                raise DecodeError(f"packed {self.DTYPE} field has {len(values)} bytes, "
                                  f"not a multiple of {self._ITEMSIZE}")
            self._array, self._raw = None, values
            return
        if isinstance(values, PackedArray) and values.DTYPE == self.DTYPE:
            self._array, self._raw = values._array, values._raw
            return
        if isinstance(values, (bytes, bytearray, memoryview)):
            raw = bytes(values)
            self._array, self._raw = unpack(raw, self.DTYPE), raw
            return
        if type(values) is list or type(values) is tuple:  # the encode path: packed at once, viewed when read
            self._array, self._raw = None, pack(values, self.DTYPE) if values else b""
            return
        seq = values if isinstance(values, np.ndarray) else np.asarray(list(values))
        self._raw = pack(seq, self.DTYPE) if seq.size else b""
        self._array = unpack(self._raw, self.DTYPE)

    @property
    def _arr(self) -> np.ndarray:
        """The numpy view of the bytes, made on first use (a decoded event that is only forwarded or
        compared never needs it)."""
        arr = self._array
        if arr is None:
            arr = self._array = np.frombuffer(self._raw, dtype=self.DTYPE)
        return arr

    @classmethod
    def from_bytes(cls, data: bytes) -> PackedArray:
        return cls(data)

    def to_bytes(self) -> bytes:
        return self._raw

    @property
    def array(self) -> np.ndarray:
        """A read-only numpy view (no copy)."""
        return self._arr

    def tolist(self) -> list[Any]:
        return self._arr.tolist()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if dtype is not None and np.dtype(dtype) != self._arr.dtype:
            return self._arr.astype(dtype)
        return self._arr.copy() if copy else self._arr

    def __len__(self) -> int:
        return len(self._raw) // self._ITEMSIZE

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return type(self)(self._arr[index])
        return self._arr[index].item()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._arr.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedArray):
            return self.DTYPE == other.DTYPE and self._raw == other._raw
        if isinstance(other, (tuple, list)):
            return self.tolist() == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.DTYPE, self._raw))

    def __add__(self, other: Iterable[Any]) -> PackedArray:
        right = other if isinstance(other, PackedArray) else type(self)(other)
        return type(self)(self._raw + right.to_bytes())

    def __repr__(self) -> str:
        items = self.tolist()
        shown = ", ".join(map(str, items[:8])) + (", …" if len(items) > 8 else "")
        return f"{type(self).__name__}([{shown}], n={len(items)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._raw,))


class Int32s(PackedArray):
    """Token ids or policy versions: little-endian int32."""

    __slots__ = ()
    DTYPE = INT32


class Float32s(PackedArray):
    """Logprobs: little-endian float32 (a Python float is rounded to float32 on construction)."""

    __slots__ = ()
    DTYPE = FLOAT32
    _ITEMSIZE = 4


class UInt8s(PackedArray):
    """Loss masks: one byte per token."""

    __slots__ = ()
    DTYPE = UINT8
    _ITEMSIZE = 1
