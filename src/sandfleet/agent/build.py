"""Compile the guest agent (a static C program) once and cache it by source hash."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from sandfleet.errors import HostUnsupportedError

SOURCE = Path(__file__).with_name("agent.c")


def cache_dir() -> Path:
    """Where sandfleet caches built things: $SANDFLEET_CACHE or ~/.cache/sandfleet."""
    env = os.environ.get("SANDFLEET_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sandfleet"
    base.mkdir(parents=True, exist_ok=True)
    return base


@functools.cache
def agent_binary() -> Path:
    """Path to the static guest agent for this host's arch, building it if needed."""
    src = SOURCE.read_bytes()
    digest = hashlib.sha256(src).hexdigest()[:16]
    out_dir = cache_dir() / "agent" / f"{os.uname().machine}-{digest}"
    binary = out_dir / "sandfleet-agent"
    if binary.exists():
        return binary
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise HostUnsupportedError(
            "no C compiler to build the guest agent: install gcc (apt-get install gcc libc6-dev)"
        )
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return binary
        tmp = out_dir / f"sandfleet-agent.{os.getpid()}"
        cmd = [cc, "-O2", "-static", "-o", str(tmp), str(SOURCE)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise HostUnsupportedError(
                f"building the guest agent failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}\n"
                "a static libc is needed: apt-get install libc6-dev"
            )
        tmp.replace(binary)
    return binary
