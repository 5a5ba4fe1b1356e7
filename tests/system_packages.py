"""Debian packages a test needs (a browser, a server), installed on first use like `make` installs the venv.

`require(binaries)` finds each program on PATH; when one is missing and this runs as root with apt-get, it
installs the packages (once per session: apt-get is idempotent, and a second call finds the programs).
What it cannot install it reports as the reason to skip, so a test skips with the cause, never silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

_APT_TIMEOUT_S = 900


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, timeout=_APT_TIMEOUT_S,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, check=False)


def require(binaries: Mapping[str, str]) -> str | None:
    """`binaries` maps a program to the Debian package holding it. None when every program is on PATH
    (after installing the missing packages if possible), else why not."""
    missing = sorted({package for program, package in binaries.items() if shutil.which(program) is None})
    if not missing:
        return None
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return f"Debian packages {missing} are missing and cannot be installed here (needs root and apt-get)"
    done = _apt("install", "-y", *missing)
    if done.returncode != 0:  # a fresh machine's package lists may be empty or stale
        _apt("update")
        done = _apt("install", "-y", *missing)
    still = sorted(program for program in binaries if shutil.which(program) is None)
    if done.returncode != 0 or still:
        return f"apt-get install {' '.join(missing)} failed ({done.returncode}): {done.stderr.strip()[-300:]}"
    return None
