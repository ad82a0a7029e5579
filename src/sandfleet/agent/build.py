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
from sandfleet.settings import current as current_settings

SOURCE = Path(__file__).with_name("agent.c")
INCLUDED = (Path(__file__).with_name("prepare.c"), Path(__file__).with_name("untar.c"),
            Path(__file__).with_name("spawner.c"))
"""Files ``agent.c`` includes: part of its build's cache key."""
BINARY_NAME = "sandfleet-agent"

_memo_lock = threading.Lock()
_memo: dict[Path, Path] = {}


def source_bytes() -> bytes:
    """The guest agent's source, the files it includes after it: what its build's key hashes."""
    return SOURCE.read_bytes() + b"".join(b"\0" + p.read_bytes() for p in INCLUDED)


def _cache_base() -> Path:
    settings = current_settings()
    env = settings.cache
    return Path(env) if env else Path(settings.xdg_cache_home or Path.home() / ".cache") / "sandfleet"


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


def _kernel_headers() -> Path | None:
    """A directory holding only the kernel's uapi headers (``linux``, ``asm``,
    ``asm-generic``) as links, for musl-gcc, whose include path has none of the host's
    headers; None where this host has no kernel headers for its architecture."""
    inc = Path("/usr/include")
    asm = next((d for d in (inc / "asm", inc / f"{os.uname().machine}-linux-gnu" / "asm") if d.is_dir()), None)
    if asm is None or not (inc / "linux").is_dir() or not (inc / "asm-generic").is_dir():
        return None
    d = _cache_base() / "agent" / "musl-include"
    if not d.is_dir():
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".musl-include.", dir=d.parent))
        try:
            for name, target in (("linux", inc / "linux"), ("asm", asm), ("asm-generic", inc / "asm-generic")):
                (tmp / name).symlink_to(target)
            tmp.rename(d)  # whole or not at all (another process's, made meanwhile, is as good)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not d.is_dir():
                return None
    return d


def toolchain() -> tuple[str, list[str]]:
    """(name, compiler command) the agent is built with: ``$CC -static`` where CC is set,
    else musl (``musl-gcc -static``, package musl-tools) where it is installed, else the
    system's ``cc -static`` (glibc).

    Why musl: a static glibc program probes the CPU's caches with ``cpuid`` at every start,
    and in a VM each ``cpuid`` traps to the hypervisor. On the development VM (nested
    virtualization) an exec of an empty static program took 0.74-1.1 ms with glibc and
    0.07 ms with musl, and every sandbox start execs the agent twice (the launcher, then the
    agent itself). The agent uses nothing of libc that differs between the two (its own
    passwd parser, no NSS, raw syscalls for the new mount API)."""
    cc = current_settings().cc
    if cc:
        return "cc", [cc, "-O2", "-static"]
    musl = shutil.which("musl-gcc")
    headers = _kernel_headers() if musl else None
    if musl and headers is not None:
        return "musl", [musl, "-O2", "-static", "-idirafter", str(headers)]
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise HostUnsupportedError(
            "no C compiler to build the guest agent: install gcc (apt-get install gcc libc6-dev)"
        )
    return "glibc", [cc, "-O2", "-static"]


def _compile(out: Path) -> None:
    name, cc = toolchain()
    cmd = [*cc, "-o", str(out), str(SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise HostUnsupportedError(
            f"building the guest agent failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}\n"
            + ("a static libc is needed: apt-get install libc6-dev" if name == "glibc" else
               f"(built with {name}: unset CC or remove musl-tools to build with the system's cc)")
        )


def agent_binary() -> Path:
    """Path to the static guest agent for this host's arch, building it if needed."""
    base = _cache_base()
    with _memo_lock:
        known = _memo.get(base)
    if known is not None and known.is_file():
        return known
    name, cc = toolchain()
    # keyed by the compiler, not by where this cache keeps musl's header links: a node of a
    # local cluster, whose cache links to this one's builds, finds the same binary
    digest = hashlib.sha256(source_bytes() + f"\0{name}\0{cc[0]}".encode()).hexdigest()[:16]
    binary = base / "agent" / f"{os.uname().machine}-{name}-{digest}" / BINARY_NAME
    if not binary.is_file():
        install(binary, _compile)
    with _memo_lock:
        _memo[base] = binary
    return binary
