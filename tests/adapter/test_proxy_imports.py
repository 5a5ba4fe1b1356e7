"""The capture proxy and the agent SDK load no torch (it cost the proxy ~1 GB of RSS when it did)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def test_the_proxy_and_the_sdk_import_no_torch() -> None:
    probe = ("import sys; import agents_adapter.proxy.app, agents_adapter.proxy.__main__, agents_adapter.sdk; "
             "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"torch modules loaded: {done.stdout.strip()}"
