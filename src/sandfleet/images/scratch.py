"""Temporary build directories in the image cache, named after their owner process.

A name carries the owner's pid and its start time (``/proc/<pid>/stat`` field 22), so a
directory whose owner died (killed mid-build) is recognised even after the pid is reused,
and :func:`reap` removes it at the next build.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

PREFIXES = (".build-", ".debootstrap-")
_NAME = re.compile(r"^\.(?:build|debootstrap)-(\d+)(?:-(\d+))?(?:-(\d+))?$")


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks since boot, or None when it doesn't exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def scratch_dir(images: Path, prefix: str) -> Path:
    """A fresh name ``<prefix><pid>-<start>-<ns>`` under ``images`` (not created)."""
    pid = os.getpid()
    return images / f"{prefix}{pid}-{start_time(pid)}-{time.monotonic_ns()}"


def _owner_alive(name: str) -> bool:
    m = _NAME.match(name)
    if not m:
        return True  # not ours to judge
    pid = int(m.group(1))
    started = start_time(pid)
    if started is None:
        return False
    if m.group(3) is None:
        return True  # an old-style name (pid only): spare it while that pid exists
    return started == int(m.group(2))


def reap(images: Path) -> list[Path]:
    """Remove the temporary directories whose owner process is gone; returns them."""
    gone: list[Path] = []
    try:
        entries = list(os.scandir(images))
    except OSError:
        return gone
    for e in entries:
        if e.name.startswith(PREFIXES) and e.is_dir(follow_symlinks=False) and not _owner_alive(e.name):
            shutil.rmtree(e.path, ignore_errors=True)
            gone.append(Path(e.path))
    return gone
