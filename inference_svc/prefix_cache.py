"""Prefix reuse for the native engine (optional, `prefix_cache_slots` > 0).

The KV of finished requests is kept in spare slots of the engine's KV cache; a new request whose prompt
starts with such a sequence (an agent's next turn extends its previous call) copies that KV and
prefills only the rest. `meta_info.cached_tokens` reports the reused length. A weight swap, a retract
or `flush_cache` drops these entries (their KV belongs to the old weights).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from inference_svc.model_runner import SlotKVCache

if TYPE_CHECKING:
    from inference_svc.batching import RequestState


class PrefixCache:
    """KV of finished sequences in spare slots, reused by prompts that start with them (LRU)."""

    MIN_REUSE = 8  # shorter matches are not worth a copy

    def __init__(self, cache: SlotKVCache, first_slot: int, num_slots: int) -> None:
        self._cache = cache
        self._free = list(range(first_slot, first_slot + num_slots))
        self._entries: OrderedDict[int, list[int]] = OrderedDict()  # slot -> tokens whose KV it holds

    def clear(self) -> None:
        self._free.extend(self._entries)
        self._entries.clear()

    def keep(self, seq: RequestState) -> None:
        """Copies a leaving sequence's KV into a spare slot (evicting the least recently used)."""
        if seq.slot < 0 or seq.cached_len < self.MIN_REUSE or not (self._free or self._entries):
            return
        tokens = (seq.prompt + seq.out_ids)[: seq.cached_len]
        for slot, held in list(self._entries.items()):  # an entry this one extends is redundant
            if len(held) <= len(tokens) and tokens[: len(held)] == held:
                del self._entries[slot]
                self._free.append(slot)
        slot = self._free.pop() if self._free else self._entries.popitem(last=False)[0]
        self._cache.copy_slot(seq.slot, slot, seq.cached_len)
        self._entries[slot] = tokens

    def restore(self, prompt: list[int], slot: int) -> int:
        """Copies the longest cached prefix of `prompt` (keeping >= 1 token to feed) into `slot`."""
        best_slot, best = -1, 0
        limit = len(prompt) - 1
        for held_slot, held in self._entries.items():
            n = common_prefix(held, prompt, limit)
            if n > best:
                best_slot, best = held_slot, n
        if best < self.MIN_REUSE:
            return 0
        self._cache.copy_slot(best_slot, slot, best)
        self._entries.move_to_end(best_slot)
        return best


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of `a` and `b`, at most `limit` (by bisection: list slices compare in C)."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
