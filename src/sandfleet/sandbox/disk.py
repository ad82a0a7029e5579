"""The disk limit of a bwrap sandbox: a filesystem of its own, on the host's disk.

A tmpfs writable layer is charged to the sandbox's memory cgroup, so filling it past the
memory limit OOM-kills the sandbox instead of failing the write. Each sandbox therefore gets
a sparse copy of a formatted ext4 template (journal-less, a few hundred KiB actually used),
which the root launcher mounts through a loop device that detaches itself with the
sandbox's mount namespace (``--disk`` in agent.c) and unlinks once mounted: writes past
``disk_mib`` fail with ENOSPC, and the pages are file cache, which the kernel can reclaim.

Where the host has no loop devices or no ``mkfs.ext4``, the layer stays a tmpfs (charged to
memory, as before); ``available()`` says which.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from sandfleet.agent.build import cache_dir
from sandfleet.errors import HostUnsupportedError

log = logging.getLogger(__name__)
_lock = threading.Lock()
_swept = False
_warned = False


def available() -> bool:
    """Whether sandboxes can get an ext4 disk (else a memory-charged tmpfs, with a warning
    once). ``SANDFLEET_DISK=tmpfs`` turns it off for a whole process."""
    global _warned
    if os.environ.get("SANDFLEET_DISK") == "tmpfs":
        return False
    ok = os.geteuid() == 0 and Path("/dev/loop-control").exists() and _mkfs() is not None
    if not ok and not _warned:
        _warned = True
        log.warning("no loop devices or mkfs.ext4: the sandboxes' writable layer is a tmpfs charged "
                    "to their memory limit (filling it can OOM-kill a sandbox)")
    return ok


def _mkfs() -> str | None:
    return shutil.which("mkfs.ext4") or next(
        (p for p in ("/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4") if Path(p).exists()), None)


def disk_dir() -> Path:
    d = cache_dir() / "disks"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def template(size_mib: int) -> Path:
    """A formatted, empty ext4 filesystem of ``size_mib`` (made once, under a lock)."""
    path = disk_dir() / f"template-{size_mib}m.ext4"
    if path.is_file():
        return path
    with _lock, open(disk_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path
        mkfs = _mkfs()
        if mkfs is None:
            raise HostUnsupportedError("the disk limit needs mkfs.ext4: apt-get install e2fsprogs")
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        with open(tmp, "wb") as f:
            f.truncate(size_mib << 20)
        proc = subprocess.run(
            [mkfs, "-q", "-F", "-O", "^has_journal", "-m", "0", "-b", "4096",
             "-E", "lazy_itable_init=1,nodiscard", str(tmp)], capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise HostUnsupportedError(f"mkfs.ext4 failed for the disk template: {proc.stderr.strip()[-300:]}")
        tmp.replace(path)
        return path


def _sparse_copy(src: Path, dst: Path) -> None:
    """Copy only the data extents of ``src`` (SEEK_DATA/SEEK_HOLE): milliseconds for an empty fs."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        size = os.fstat(fi.fileno()).st_size
        off = 0
        while off < size:
            try:
                data = os.lseek(fi.fileno(), off, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            hole = os.lseek(fi.fileno(), data, os.SEEK_HOLE)
            done = 0
            while done < hole - data:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), hole - data - done, data + done, data + done)
                if n <= 0:
                    raise OSError(f"copying {src} stopped at {data + done}")
                done += n
            off = hole
        fo.truncate(size)


def image_for(sid: str, size_mib: int) -> Path:
    """A fresh disk image for sandbox ``sid`` (the launcher unlinks it once mounted)."""
    global _swept
    if not _swept:
        _swept = True
        sweep()
    path = disk_dir() / f"{sid}.img"
    _sparse_copy(template(size_mib), path)
    return path


def remove(sid: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (disk_dir() / f"{sid}.img").unlink()


def sweep(grace_s: float = 120.0) -> int:
    """Remove images a dead owner left between copying and mounting them (older than
    ``grace_s``: a live owner mounts and unlinks its image within a second)."""
    n = 0
    now = time.time()
    for p in disk_dir().glob("sf-*.img"):
        try:
            if now - p.stat().st_mtime > grace_s:
                p.unlink()
                n += 1
        except FileNotFoundError:
            continue
    return n
