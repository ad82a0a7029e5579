"""The disk limit of a bwrap sandbox: a filesystem of its own, on the host's disk.

A tmpfs writable layer is charged to the sandbox's memory cgroup, so filling it past the
memory limit OOM-kills the sandbox instead of failing the write. Each sandbox therefore gets
a loop device bound to a sparse copy of a formatted ext4 template (journal-less, a few
hundred KiB actually used, unlinked at once: the device holds it). A background thread
binds the devices and mounts them ahead (``fsmount``: a detached mount, attached nowhere
until the root launcher moves it into the sandbox's mount namespace, ``--disk-fd`` in
agent.c), so a sandbox's start pays for neither. Writes past ``disk_mib`` fail with ENOSPC,
and the pages are file cache, which the kernel can reclaim.

Where the host has no loop devices, no ``mkfs.ext4`` or no new mount API (Linux < 5.2), the
layer stays a tmpfs (charged to memory, as before); ``available()`` says which.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sandfleet.agent.build import cache_dir
from sandfleet.errors import HostUnsupportedError
from sandfleet.settings import current as current_settings

log = logging.getLogger(__name__)
_lock = threading.Lock()
_warned = False


def available() -> bool:
    """Whether sandboxes can get an ext4 disk (else a memory-charged tmpfs, with a warning
    once). ``SANDFLEET_DISK=tmpfs`` turns it off for a whole process."""
    global _warned
    if current_settings().disk == "tmpfs":
        return False
    ok = (os.geteuid() == 0 and Path("/dev/loop-control").exists() and _mkfs() is not None
          and _fsmount_works())
    if not ok and not _warned:
        _warned = True
        log.warning("no loop devices, mkfs.ext4 or fsmount: the sandboxes' writable layer is a tmpfs "
                    "charged to their memory limit (filling it can OOM-kill a sandbox)")
    return ok


# ---------------------------------------------------------------- the new mount API
# fsopen/fsconfig/fsmount have the same numbers on every architecture (Linux 5.2+).
_SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 430, 431, 432
_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = 1
_FSCONFIG_SET_FLAG, _FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 0, 1, 6
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV, _MOUNT_ATTR_NOATIME = 0x2, 0x4, 0x10
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _sys(nr: int, *args: object, what: str) -> int:
    r = _libc.syscall(ctypes.c_long(nr), *args)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return int(r)


def fsmount_ext4(dev: str) -> int:
    """Mount the ext4 filesystem on ``dev`` as a detached mount (nosuid, nodev, noatime):
    returns its descriptor (close-on-exec); closing it unmounts, unless it was attached."""
    fs = _sys(_SYS_FSOPEN, b"ext4", _FSOPEN_CLOEXEC, what="fsopen ext4")
    try:
        _sys(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, b"source", dev.encode(), 0, what=f"fsconfig source {dev}")
        _sys(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, b"errors", b"remount-ro", 0, what="fsconfig errors")
        for flag in (b"noinit_itable", b"nobarrier"):
            _sys(_SYS_FSCONFIG, fs, _FSCONFIG_SET_FLAG, flag, None, 0, what=f"fsconfig {flag.decode()}")
        _sys(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0, what=f"mount {dev}")
        return _sys(_SYS_FSMOUNT, fs, _FSMOUNT_CLOEXEC,
                    _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | _MOUNT_ATTR_NOATIME, what=f"fsmount {dev}")
    finally:
        os.close(fs)


_fsmount_ok: bool | None = None


def _fsmount_works() -> bool:
    global _fsmount_ok
    if _fsmount_ok is None:
        try:
            os.close(_sys(_SYS_FSOPEN, b"ext4", _FSOPEN_CLOEXEC, what="fsopen ext4"))
            _fsmount_ok = True
        except OSError as e:
            log.debug("no fsopen: %s", e)
            _fsmount_ok = False
    return _fsmount_ok


def _mkfs() -> str | None:
    return shutil.which("mkfs.ext4") or next(
        (p for p in ("/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4") if Path(p).exists()), None)


def disk_dir() -> Path:
    d = cache_dir() / "disks"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


@dataclass(frozen=True)
class Seed:
    """What every sandbox of a host-root image starts with in its writable layer, made once
    into the disk template instead of by the launcher at each start: ``upper/`` (owned by
    ``root_uid``), ``work/``, an opaque directory for each host directory the sandbox must
    not see, and a whiteout for each other host entry (docs/security.md). The launcher is
    given only what changed on the host since (``BwrapBackend._argv``)."""

    root_uid: int
    opaque: tuple[tuple[str, int], ...]  # (path under upper, mode)
    whiteouts: tuple[str, ...]

    @property
    def key(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()[:12]

    def populate(self, d: Path) -> None:
        upper = d / "upper"
        upper.mkdir(mode=0o755)
        os.chown(upper, self.root_uid, self.root_uid)
        (d / "work").mkdir(mode=0o755)
        for path, mode in self.opaque:
            p = upper / path.lstrip("/")
            for parent in reversed(p.relative_to(upper).parents[:-1]):
                (upper / parent).mkdir(mode=0o755, exist_ok=True)  # as the launcher makes them
            p.mkdir()
            os.chown(p, self.root_uid, self.root_uid)
            p.chmod(mode)
            os.setxattr(p, "trusted.overlay.opaque", b"y")
        for path in self.whiteouts:
            os.mknod(upper / path.lstrip("/"), 0o600 | stat.S_IFCHR, os.makedev(0, 0))


def template(size_mib: int, seed: Seed | None = None) -> Path:
    """A formatted ext4 filesystem of ``size_mib``, empty or holding ``seed`` (made once, under
    a lock)."""
    path = disk_dir() / (f"template-{size_mib}m.ext4" if seed is None else f"template-{size_mib}m-{seed.key}.ext4")
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
        with tempfile.TemporaryDirectory(dir=disk_dir()) as staging:
            extra = []
            if seed is not None:
                seed.populate(Path(staging))
                extra = ["-d", staging]
            proc = subprocess.run(
                [mkfs, "-q", "-F", "-O", "^has_journal", "-m", "0", "-b", "4096",
                 "-E", "lazy_itable_init=1,nodiscard", *extra, str(tmp)], capture_output=True, text=True)
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
    """A loop device bound to a fresh, empty ext4 image, and that image mounted (detached)."""

    def __init__(self, path: str, fd: int, mnt_fd: int, seed: Seed | None = None):
        self.path = path
        self.fd = fd
        self.mnt_fd = mnt_fd
        self.seed = seed
        """What the filesystem holds already (None: empty)."""
        """The detached mount, for ``--disk-fd``; held until release (it pins the mount too)."""
        self.ns_fd = -1
        """The mount namespace that mounts it, held so that its (slow: ~15 ms of ext4 and
        RCU tear-down) unmount happens when we let go, in a thread, not in the exit of the
        sandbox's last process."""

    def hold_mounts_of(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            self.ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)

    def release(self) -> None:
        """Let go of the mounts, then of the device, which detaches itself after them."""
        fds = [fd for fd in (self.ns_fd, self.mnt_fd, self.fd) if fd >= 0]
        self.ns_fd = self.mnt_fd = self.fd = -1
        if fds:
            _closer.submit(fds)


def bind(size_mib: int, seed: Seed | None = None) -> Loop:
    """Bind a free loop device to a new image of ``size_mib`` (holding ``seed``) and mount
    it, detached (blocking, ~15 ms)."""
    img = disk_dir() / f".loop-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}.img"
    _sparse_copy(template(size_mib, seed), img)
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
                try:
                    return Loop(path, lfd, fsmount_ext4(path), seed)
                except BaseException:
                    os.close(lfd)  # autoclear: the device lets go of the image
                    raise
            raise OSError(errno.EBUSY, "no free loop device")
        finally:
            os.close(ctl)
    finally:
        os.close(ffd)


BACKGROUND_NICE = 10
"""The niceness of the threads that prepare and tear down disks ahead of and after sandboxes:
that work (~5 ms of kernel time per disk: loop set-up, mount, detach) waits for the sandboxes'
own starts and commands rather than competing with them (Linux: niceness is per thread)."""


def _background() -> None:
    """Lower this thread's CPU priority (and only this thread's) to :data:`BACKGROUND_NICE`."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)


class _Pool:
    """A few bound loop devices per (size, seed), refilled in a background thread. Only the
    latest seed of a size is kept ready: when the host's root changes, the devices made for
    the old one are let go (empty ones, no seed, are kept beside it: a branch's children
    take those, and as many as its last branch had, :meth:`want`)."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self.wanted: dict[tuple[int, Seed | None], int] = {}
        self.ready: dict[tuple[int, Seed | None], list[Loop]] = {}
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def take(self, size_mib: int, seed: Seed | None = None, *, wait: bool = True) -> Loop | None:
        """A ready device; else, with ``wait``, one bound now (blocking), without it None."""
        key = (size_mib, seed)
        with self.cond:
            for old in [k for k in self.ready if k[0] == size_mib and k != key and None not in (k[1], seed)]:
                for stale in self.ready.pop(old):
                    stale.release()
            ready = self.ready.setdefault(key, [])
            loop = ready.pop() if ready else None
            if self.thread is None:
                self.thread = threading.Thread(target=self._fill, name="sandfleet-loop-pool", daemon=True)
                self.thread.start()
            self.cond.notify()
        return loop if loop is not None or not wait else bind(size_mib, seed)

    def _fill(self) -> None:
        _background()
        while True:
            with self.cond:
                want = [k for k, r in self.ready.items() if len(r) < self.wanted.get(k, self.keep)]
                if not want:
                    self.cond.wait()
                    continue
            key = want[0]
            try:
                loop = bind(*key)
            except OSError as e:  # the next take binds synchronously and reports it
                log.warning("could not prepare a loop device: %s", e)
                time.sleep(1.0)
                continue
            with self.cond:
                if key in self.ready:
                    self.ready[key].append(loop)
                else:  # its seed was replaced meanwhile
                    loop.release()


    def want(self, size_mib: int, seed: Seed | None, n: int) -> None:
        """Keep ``n`` devices of (size, seed) ready from now on (at most :data:`MAX_READY`)."""
        key = (size_mib, seed)
        with self.cond:
            self.wanted[key] = max(self.keep, min(n, MAX_READY))
            self.ready.setdefault(key, [])
            if self.thread is None:
                self.thread = threading.Thread(target=self._fill, name="sandfleet-loop-pool", daemon=True)
                self.thread.start()
            self.cond.notify()


MAX_READY = 33
"""The most loop devices kept ready for one (size, seed) (a branch to 32 and its source)."""


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
        _background()
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


def take_loop(size_mib: int, seed: Seed | None = None) -> Loop:
    """A loop device bound to a fresh ext4 image of ``size_mib`` holding ``seed`` (usually
    ready already; else bound now, blocking: call it in a thread)."""
    loop = _pool.take(size_mib, seed)
    assert loop is not None
    return loop


async def take_loop_async(size_mib: int, seed: Seed | None = None) -> Loop:
    """:func:`take_loop` from the event loop: a ready device at once, else one bound in a
    thread (what bwrap and gvisor sandboxes start with)."""
    import asyncio

    ready = take_loop_nowait(size_mib, seed)
    return ready if ready is not None else await asyncio.to_thread(take_loop, size_mib, seed)


def want_ready(size_mib: int, seed: Seed | None, n: int) -> None:
    """Keep ``n`` empty disks of ``size_mib`` ready ahead (a branch's next children)."""
    _pool.want(size_mib, seed, n)


def take_loop_nowait(size_mib: int, seed: Seed | None = None) -> Loop | None:
    """A ready loop device, or None at once (then ``take_loop`` in a thread)."""
    return _pool.take(size_mib, seed, wait=False)
