"""`python -m tests.analytics.crashing_sink N ARGS...`: the analytics sink, SIGKILLed by itself on its N-th
ledger write, after that flush's rows are inserted and before its ledger and Kafka offsets are: the one
window in which a restarted sink writes rows a second time."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping

from infra.analytics.__main__ import main
from infra.analytics.store import AnalyticsStore, TopicPartition

_real_record = AnalyticsStore.record_offsets
_writes = 0


def _record_or_die(self: AnalyticsStore, offsets: Mapping[TopicPartition, int], now_ms: int) -> None:
    global _writes
    _writes += 1
    if _writes >= int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    _real_record(self, offsets, now_ms)


if __name__ == "__main__":
    AnalyticsStore.record_offsets = _record_or_die  # type: ignore[method-assign]
    sys.exit(main(sys.argv[2:]))
