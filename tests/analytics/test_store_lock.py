"""Whether another process holds a chdb folder: asked before opening one (a refused open makes chdb print
an error), and racing with the holder's own shutdown, which removes the `status` file it locks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra.analytics.store import held_by_another_process

pytestmark = pytest.mark.unit

HOLD = "import fcntl, sys; f = open(sys.argv[1], 'rb'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); " \
       "sys.stdin.read()"


def test_a_folder_is_held_only_while_another_process_locks_its_status_file(tmp_path: Path) -> None:
    assert not held_by_another_process(tmp_path)  # no status file: never held, or its holder just stopped
    status = tmp_path / "status"
    status.write_bytes(b"")
    assert not held_by_another_process(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(status)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert held_by_another_process(tmp_path)
    finally:
        holder.communicate("")
    assert not held_by_another_process(tmp_path)
    status.unlink()  # the holder's shutdown removes it: asking then is an answer, not an error
    assert not held_by_another_process(tmp_path)

