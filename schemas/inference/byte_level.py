"""The byte <-> printable-character map of byte-level BPE (GPT-2 / Qwen style), torch-free so the
capture proxy can use it without loading the engine."""

from __future__ import annotations

from functools import cache


@cache
def bytes_to_unicode() -> dict[int, str]:
    """Byte -> printable character; ids 0..255 of the default tokenizer are these bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shift)
            shift += 1
    return mapping
