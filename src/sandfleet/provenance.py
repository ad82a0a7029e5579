"""Where a figure came from: host, kernel, commit and configuration, for every report.

``provenance(config)`` is recorded in runs (run.json), bench results and analysis reports,
so that two figures can be told apart and compared only when they are comparable.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from sandfleet import __version__


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "cpu model", "processor\t: arm")):
                return line.split(":", 1)[1].strip()
    return platform.processor()


@functools.cache
def commit() -> str | None:
    """The git commit of this sandfleet source (``+dirty`` with uncommitted changes), or
    None when it is not a git checkout (an installed wheel: the version says it)."""
    src = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no", "--", "."],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def host() -> dict[str, Any]:
    mem = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    return {"hostname": platform.node(), "cpu_model": cpu_model(), "arch": platform.machine(),
            "threads": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
            "kernel": platform.release(), "mem_total_mib": mem, "python": platform.python_version()}


def provenance(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Host, kernel, sandfleet version and commit, time, and the given configuration."""
    return {"host": host(), "sandfleet": __version__, "commit": commit(),
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "config": dict(config or {})}
