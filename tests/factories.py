"""Example events for tests: one valid instance of any event type, built from its dataclass fields."""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any

from inference_svc.default_model import DefaultModelSpec
from schemas import events as ev
from schemas.packed import Float32s, PackedArray, UInt8s


def _value(hint: Any, name: str, packed: type[PackedArray] | None, i: int) -> Any:
    if packed is Float32s:
        return tuple(-0.5 * k for k in range(4))
    if packed is UInt8s:
        return (0, 1, 1, 0)
    if packed is not None:
        return tuple(range(i, i + 4))
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return next(iter(hint))
    if origin is tuple and args and dataclasses.is_dataclass(args[0]):
        return (example(args[0], i), example(args[0], i + 1))
    if origin is tuple:
        return (f"{name}-a", f"{name}-b") if args[0] is str else (1, 2, 3)
    if origin is dict:
        return {"k": "v"}
    if hint is bool:
        return True
    if hint is int:
        return 1000 + i
    if hint is float:
        return 0.25 + i
    if hint is str:
        return f"{name}-{i}"
    return b"\x00\x01raw"  # bytes | None


def example(cls: Any, i: int = 0, **overrides: Any) -> Any:
    """An instance of an event or nested record class with every field set."""
    hints = typing.get_type_hints(cls)
    values = {
        f.name: _value(hints[f.name], f.name, f.metadata.get("packed"), i)
        for f in dataclasses.fields(cls)
        if f.name not in ("event_id", "ts_ms")
    }
    values.update(_VALID.get(cls, {}))
    values.update(overrides)
    return cls(**values)


#: Fields whose every-field-set value would make an invalid event: an LLMCall is in full form unless a test
#: records it by reference (a reference needs a base call that exists; schemas.prompt_refs).
_VALID: dict[Any, dict[str, Any]] = {ev.LLMCall: {"prompt_base_call_id": "", "prompt_base_len": 0}}


ALL_EVENT_TYPES = list(ev.EVENT_TYPES.values())

# The small Qwen3 the inference and trainer tests build (seconds on one core).
TINY_SPEC = DefaultModelSpec(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    seed=0,
)
