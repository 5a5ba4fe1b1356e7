"""Debian programs a test needs (a browser, a server). `make test` installs them (its `packages`
target, like the venv and the Kafka jars); a test whose program is missing skips with the cause, never
silently and never failing on a machine where apt-get cannot run.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping


def require(binaries: Mapping[str, str]) -> str | None:
    """`binaries` maps a program to the Debian package holding it. None when every program is on PATH,
    else why the test cannot run."""
    missing = sorted({package for program, package in binaries.items() if shutil.which(program) is None})
    if not missing:
        return None
    return f"Debian packages {missing} are not installed (`make test` installs them: apt-get, as root)"
