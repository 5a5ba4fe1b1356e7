"""Human-readable views of events for the CLI: packed token payloads are summarised, not dumped."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from schemas.events import Event
from schemas.packed import PackedArray

_PREVIEW = 6


def summarise(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: summarise(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, PackedArray):
        value = tuple(value.tolist())
    if isinstance(value, tuple):
        if len(value) > _PREVIEW and all(isinstance(v, (int, float)) for v in value[:_PREVIEW]):
            return f"[{', '.join(map(str, value[:_PREVIEW]))}, … ({len(value)} items)]"
        return [summarise(v) for v in value]
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return value


def describe(event: Event) -> dict[str, Any]:
    """The event as a JSON-ready dict with its type first."""
    body = summarise(event)
    return {"type": event.event_type, **body}


def matches(event: Event, session: str | None, resource: str | None, event_type: str | None) -> bool:
    """Filter used by `sflow events tail`: every given criterion must hold."""
    if event_type and event.event_type != event_type:
        return False
    if session and getattr(event, "session_id", event.correlation_id) != session:
        return False
    if resource:
        ids = {getattr(event, "resource_id", None), *getattr(event, "resource_ids", ())}
        if resource not in ids:
            return False
    return True
