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
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"torch modules loaded: {done.stdout.strip()}"


def test_loading_the_models_tokenizer_imports_no_torch(tiny_model_dir: Path) -> None:
    """At start-up the proxy loads the tokenizer and probes its template: still no torch (transformers'
    own tokenizer classes would import it)."""
    probe = ("import sys; from pathlib import Path; from agents_adapter.proxy.chat_codec import ChatCodec; "
             f"codec = ChatCodec.from_model_dir(Path({str(tiny_model_dir)!r})); "
             "print(codec.encode('hi') != [], sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True []", f"torch modules loaded: {done.stdout.strip()}"
