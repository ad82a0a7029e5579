"""The disk limit of a bwrap sandbox: a filesystem of its own, on the host's disk.

A tmpfs writable layer is charged to the sandbox's memory cgroup, so filling it past the
memory limit OOM-kills the sandbox instead of failing the write. Each sandbox therefore gets
a loop device bound to a sparse copy of a formatted ext4 template (journal-less, a few
hundred KiB actually used, unlinked at once: the device holds it), which the root launcher
mounts (``--disk-dev`` in agent.c): writes past ``disk_mib`` fail with ENOSPC, and the pages
are file cache, which the kernel can reclaim.

Where the host has no loop devices or no ``mkfs.ext4``, the layer stays a tmpfs (charged to
memory, as before); ``available()`` says which.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path

from sandfleet.agent.build import cache_dir
from sandfleet.errors import HostUnsupportedError

log = logging.getLogger(__name__)
_lock = threading.Lock()
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


# ---------------------------------------------------------------- loop devices, ready ahead
# Binding and unbinding a loop device each cost a queue freeze (about 10 ms here), so a
# background thread keeps a few bound to fresh images (unlinked at once: the device holds
# them) and the sandbox only mounts one. The device is set to detach itself at its last
# close; we hold it open until the sandbox is closed, then close it off the caller's path.
# If this process dies, its descriptors close and every device it held detaches.
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
_LOOP_CONFIG_SIZE = 304  # struct loop_config: fd, block_size, loop_info64 (232), reserved[8]
_LO_FLAGS_OFFSET = 8 + 52


class Loop:
    """A loop device bound to a fresh, empty ext4 image."""

    def __init__(self, path: str, fd: int):
        self.path = path
        self.fd = fd
        self.ns_fd = -1
        """The mount namespace that mounts it, held so that its (slow: ~15 ms of ext4 and
        RCU tear-down) unmount happens when we let go, in a thread, not in the exit of the
        sandbox's last process."""

    def hold_mounts_of(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            self.ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)

    def release(self) -> None:
        """Let go of the mounts, then of the device, which detaches itself after them."""
        fds = [fd for fd in (self.ns_fd, self.fd) if fd >= 0]
        self.ns_fd = self.fd = -1
        if fds:
            _closer.submit(fds)


def bind(size_mib: int) -> Loop:
    """Bind a free loop device to a new image of ``size_mib`` (blocking, ~10 ms)."""
    img = disk_dir() / f".loop-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}.img"
    _sparse_copy(template(size_mib), img)
    try:
        ffd = os.open(img, os.O_RDWR | os.O_CLOEXEC)
    finally:
        img.unlink(missing_ok=True)
    try:
        ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(64):
                n = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
                path = f"/dev/loop{n}"
                lfd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
                cfg = bytearray(_LOOP_CONFIG_SIZE)
                struct.pack_into("=I", cfg, 0, ffd)
                struct.pack_into("=I", cfg, _LO_FLAGS_OFFSET, LO_FLAGS_AUTOCLEAR)
                try:
                    fcntl.ioctl(lfd, LOOP_CONFIGURE, bytes(cfg))
                except OSError as e:
                    os.close(lfd)
                    if e.errno == errno.EBUSY:
                        continue  # another process took it first
                    raise
                return Loop(path, lfd)
            raise OSError(errno.EBUSY, "no free loop device")
        finally:
            os.close(ctl)
    finally:
        os.close(ffd)


class _Pool:
    """A few bound loop devices per size, refilled in a background thread."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self.ready: dict[int, list[Loop]] = {}
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def take(self, size_mib: int) -> Loop:
        with self.cond:
            ready = self.ready.setdefault(size_mib, [])
            loop = ready.pop() if ready else None
            if self.thread is None:
                self.thread = threading.Thread(target=self._fill, name="sandfleet-loop-pool", daemon=True)
                self.thread.start()
            self.cond.notify()
        return loop if loop is not None else bind(size_mib)

    def _fill(self) -> None:
        while True:
            with self.cond:
                want = [s for s, r in self.ready.items() if len(r) < self.keep]
                if not want:
                    self.cond.wait()
                    continue
            try:
                loop = bind(want[0])
            except OSError as e:  # the next take binds synchronously and reports it
                log.warning("could not prepare a loop device: %s", e)
                time.sleep(1.0)
                continue
            with self.cond:
                self.ready.setdefault(want[0], []).append(loop)


class _Closer:
    """Closes released mount namespaces and loop devices in a thread, in order: their
    tear-down waits on the kernel."""

    def __init__(self) -> None:
        self.fds: list[list[int]] = []
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def submit(self, fds: list[int]) -> None:
        with self.cond:
            self.fds.append(fds)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="sandfleet-loop-closer", daemon=True)
                self.thread.start()
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.fds:
                    self.cond.wait()
                fds = self.fds.pop(0)
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)


_pool = _Pool()
_closer = _Closer()


def take_loop(size_mib: int) -> Loop:
    """A loop device bound to a fresh ext4 image of ``size_mib`` (usually ready already)."""
    return _pool.take(size_mib)
