"""The seal of the verifier's tests: ``seal.c``, a freestanding library preloaded into every
program the tests start, which puts it in a Landlock domain nested in its parent's
(docs/security.md, "Reward integrity", the seal). Built here once per source, like the agent."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

from sandfleet.errors import HostUnsupportedError
from sandfleet.settings import current as current_settings

SOURCE = Path(__file__).with_name("seal.c")
NAME = "sandfleet-seal.so"
FLAGS = ["-shared", "-fPIC", "-nostdlib", "-ffreestanding", "-fno-builtin", "-fno-stack-protector", "-Os"]
_lock = threading.Lock()
_memo: dict[str, bytes | None] = {}


def _compile(out: Path) -> None:
    cc = current_settings().cc or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise HostUnsupportedError("no C compiler to build the verifier's seal: install gcc")
    cmd = [cc, *FLAGS, "-o", str(out), str(SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise HostUnsupportedError(f"building the verifier's seal failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")


def seal_library() -> bytes | None:
    """The seal for this host's arch (the sandboxes' own, but for emulated images, which go
    without), or None where it can't be built (logged by the caller: the seccomp seal still
    holds)."""
    from sandfleet.agent.build import cache_dir, install

    machine = os.uname().machine
    with _lock:
        if machine in _memo:
            return _memo[machine]
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    target = cache_dir() / "agent" / f"seal-{machine}-{digest}" / NAME
    try:
        data: bytes | None = install(target, _compile, mode=0o644).read_bytes()
    except (HostUnsupportedError, OSError):
        data = None
    with _lock:
        _memo[machine] = data
    return data


PATHS_MARK = b"@@SANDFLEET_SEAL_PATHS@@"
PATHS_SIZE = 512
"""The size of seal.c's ``seal_paths``, which starts with :data:`PATHS_MARK`."""


def with_paths(lib: bytes, entries: list[str]) -> bytes:
    """This copy of the seal with its folders written in: ``t:PATH`` for the tests' folders
    (a program that names one, or runs from one, is the tests' own) and ``r:PATH`` for the
    reward folders (no other program may write there), among others (seal.c, ``seal_paths``:
    ``f:PATH`` a reward file). Raises ValueError when they don't fit
    or the library has no place for them."""
    text = "".join(f"{e}\n" for e in entries).encode()
    at = lib.find(PATHS_MARK)
    if at < 0 or lib.find(PATHS_MARK, at + 1) >= 0:
        raise ValueError("the seal library has no single place for its folders")
    if len(text) >= PATHS_SIZE or any("\n" in e or "\0" in e for e in entries):
        raise ValueError(f"the tests' and reward folders don't fit in the seal ({len(text)} bytes)")
    return lib[:at] + text.ljust(PATHS_SIZE, b"\0") + lib[at + PATHS_SIZE:]
