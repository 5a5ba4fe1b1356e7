"""`python -m tests.analytics.store_holder CHDB_PATH`: holds a chdb store open (prints `ready`, then sleeps),
as a running sink does, for the tests of reading a held store."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from infra.analytics.store import ChdbStore

if __name__ == "__main__":
    store = ChdbStore(Path(sys.argv[1]))
    print("ready", flush=True)
    time.sleep(60)
