"""The Python guard's compiled caches: a checked-hash ``.pyc`` of :data:`~sandfleet.rollout.testguard.PY_GUARD`
for each CPython minor version the host has.

Every Python process the tests start imports the guard (their ``sitecustomize``, some 1,300 lines) before any
code of theirs. Compiled from its source that is 18 ms natively and about 1.5 s in an emulated (TCG) guest, in
each process: the guard's folder is root's and fresh, and the tests' ``PYTHONDONTWRITEBYTECODE`` leaves no
cache behind anyway. The host compiles it once per version (its own interpreter, and the system's
``python3.N`` programs), and the verifier writes the caches into the guard folder's ``__pycache__``; a Python
of another version compiles the source as before.

A cache is *checked-hash*: Python hashes the source beside it and compiles the source instead where the two
differ, so what a cache holds is only ever the source's own code. Nothing here is read from a sandbox.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from sandfleet.agent.build import cache_dir
from sandfleet.errors import GuestError, SandboxClosedError, SandboxDiedError
from sandfleet.rollout.testguard import PY_GUARD
from sandfleet.sandbox.base import Sandbox

log = logging.getLogger(__name__)

SYSTEM_BINS = ("/usr/bin", "/usr/local/bin")
"""Where other CPython versions are looked for (``python3.N``): no PATH, no shims that start a resolver."""
MINORS = range(8, 16)
COMPILE_TIMEOUT_S = 30.0
_COMPILE = """\
import py_compile, sys
src, out = sys.argv[1], sys.argv[2]
py_compile.compile(src, cfile=out + "/" + sys.implementation.cache_tag + ".pyc", doraise=True,
                   invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
"""


def _interpreters() -> list[str]:
    """This CPython, then the system's programs of the other versions, one per real file."""
    seen = {Path(sys.executable).resolve()}
    found = [sys.executable]
    for minor in MINORS:
        if minor == sys.version_info.minor and sys.version_info.major == 3:
            continue  # this one's own version: sys.executable
        for folder in SYSTEM_BINS:
            path = Path(folder) / f"python3.{minor}"
            real = path.resolve()
            if real not in seen and real.is_file() and os.access(real, os.X_OK):
                seen.add(real)
                found.append(str(path))
    return found


def _build(out: Path, source: Path) -> None:
    """The caches into OUT, named by cache tag (``cpython-311.pyc``): each interpreter compiles its own."""
    for exe in _interpreters():
        try:
            r = subprocess.run([exe, "-I", "-S", "-c", _COMPILE, str(source), str(out)], capture_output=True,
                               text=True, timeout=COMPILE_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            log.debug("the guard's cache for %s: %s", exe, e)
            continue
        if r.returncode != 0:
            log.debug("the guard's cache for %s: exit %s: %s", exe, r.returncode, r.stderr.strip()[-300:])


@cache
def guard_caches() -> dict[str, bytes]:
    """``{cache tag: .pyc bytes}`` for the guard's source as it is written into the guard folder; computed once
    per host and guard text (under the cache directory), then read from there. ``{}`` where none can be made:
    every Python compiles the source, as without."""
    text = PY_GUARD.encode()
    folder = cache_dir() / "guard" / hashlib.sha256(text).hexdigest()[:16]
    try:
        if not (folder / "done").exists():
            folder.parent.mkdir(parents=True, exist_ok=True)
            with open(folder.parent / ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (folder / "done").exists():
                    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=folder.parent))
                    try:
                        (tmp / "sitecustomize.py").write_bytes(text)
                        _build(tmp, tmp / "sitecustomize.py")
                        (tmp / "sitecustomize.py").unlink()
                        (tmp / "done").touch()
                        shutil.rmtree(folder, ignore_errors=True)
                        tmp.rename(folder)
                    finally:
                        shutil.rmtree(tmp, ignore_errors=True)
        return {p.stem: p.read_bytes() for p in sorted(folder.glob("*.pyc"))}
    except OSError as e:
        log.warning("the Python guard's compiled caches could not be made (%s): each Python compiles it", e)
        return {}


async def write_guard_caches(sandbox: Sandbox, folder: str) -> None:
    """Write the caches into ``FOLDER/__pycache__`` (the guard folder the preparation made, root's) as root. A
    cache that could not be written is left out: that Python compiles the source."""
    for tag, data in guard_caches().items():
        try:
            await sandbox.write_file(f"{folder}/__pycache__/sitecustomize.{tag}.pyc", data, mode=0o644, user="root")
        except (SandboxDiedError, SandboxClosedError):
            raise
        except (GuestError, OSError) as e:  # (a full disk)
            log.debug("the guard's cache %s was not written: %s", tag, e)
