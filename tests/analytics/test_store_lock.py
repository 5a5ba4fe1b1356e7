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


def test_a_read_only_open_refused_for_any_reason_reads_a_snapshot(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder may let go between chdb's refusal and the lock check that tells a lock from another
    failure: the refusal is then a plain AnalyticsError, and a reader (the CLI, a test beside a live
    dashboard) must still get the data, from a snapshot, not an error."""
    from infra.analytics import config as analytics_config
    from infra.analytics.config import AnalyticsConfig, open_store
    from infra.analytics.errors import AnalyticsError
    from infra.analytics.store import ChdbStore

    with ChdbStore(tmp_path / "chdb") as store:  # a real folder, with the tables a sink creates
        store.query("SELECT 1")
    refused: list[Path] = []

    class RefusingChdbStore(ChdbStore):
        def __init__(self, path: Path, *args: object, **kwargs: object) -> None:
            if kwargs.get("create") is False and not refused:
                refused.append(path)
                raise AnalyticsError(f"cannot open chdb at {path}: Error initializing EmbeddedServer")
            super().__init__(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(analytics_config, "ChdbStore", RefusingChdbStore)
    with open_store(AnalyticsConfig(data_dir=tmp_path), read_only=True) as store:
        assert store.query("SELECT 1").rows == [(1,)]
    assert refused == [tmp_path / "chdb"]
