"""Compile the guest agent (a static C program) once and cache it by source hash.

Safe under any mix of threads and processes: a build (or a copy, see :func:`install`)
writes a unique temporary file in the target directory and renames it into place while
holding an ``flock`` on that directory, so no reader ever sees a missing or half-written
binary. The per-process memo is a lock-guarded dict (``functools.cache`` does not
serialise concurrent first calls) and is re-checked against the file system, so a cache
emptied under a running process is rebuilt rather than trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from sandfleet.errors import HostUnsupportedError

SOURCE = Path(__file__).with_name("agent.c")
BINARY_NAME = "sandfleet-agent"

_memo_lock = threading.Lock()
_memo: dict[Path, Path] = {}


def _cache_base() -> Path:
    env = os.environ.get("SANDFLEET_CACHE")
    return Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sandfleet"


def cache_dir() -> Path:
    """Where sandfleet caches built things: $SANDFLEET_CACHE or ~/.cache/sandfleet."""
    base = _cache_base()
    base.mkdir(parents=True, exist_ok=True)
    return base


@contextlib.contextmanager
def _dir_lock(d: Path) -> Iterator[None]:
    """An exclusive flock on ``d/.lock`` (threads and processes alike: one open file each)."""
    fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def install(target: Path, write: Callable[[Path], None], *, mode: int = 0o755) -> Path:
    """Make ``target`` exist, complete, once: ``write(tmp)`` fills a unique temporary file
    in the same directory, which is then renamed over ``target``, all under the directory's
    flock. Returns ``target``. A caller that sees ``target`` exist sees a whole file."""
    d = target.parent
    d.mkdir(parents=True, exist_ok=True)
    with _dir_lock(d):
        if target.is_file():
            return target
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", dir=d)
        os.close(fd)
        tmp = Path(name)
        try:
            write(tmp)
            tmp.chmod(mode)
            tmp.replace(target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return target


def _compile(out: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise HostUnsupportedError(
            "no C compiler to build the guest agent: install gcc (apt-get install gcc libc6-dev)"
        )
    cmd = [cc, "-O2", "-static", "-o", str(out), str(SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise HostUnsupportedError(
            f"building the guest agent failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}\n"
            "a static libc is needed: apt-get install libc6-dev"
        )


def agent_binary() -> Path:
    """Path to the static guest agent for this host's arch, building it if needed."""
    base = _cache_base()
    with _memo_lock:
        known = _memo.get(base)
    if known is not None and known.is_file():
        return known
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    binary = base / "agent" / f"{os.uname().machine}-{digest}" / BINARY_NAME
    if not binary.is_file():
        install(binary, _compile)
    with _memo_lock:
        _memo[base] = binary
    return binary
