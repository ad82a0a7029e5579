"""Root disks for guests: an ext4 image built from an image directory, cached by content hash.

Every VM opens the same disk read-only; its writes go to a tmpfs overlay inside the guest
(see :data:`guest.INIT`), so the disk never changes and VMs restored from one memory
snapshot all agree on it. The embedded "host" image is the host's own ``/``, far too big
for a VM disk, so for it the guest gets :func:`busybox_rootfs`: busybox with every applet
linked, the host's bash (the sandbox contract runs string commands with ``bash -c``) with
its libraries, a passwd file, and the usual directories.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from sandfleet.errors import HostUnsupportedError, ImageBuildError
from sandfleet.imagestore import Image
from sandfleet.sandbox.microvm.guest import _busybox
from sandfleet.sandbox.microvm.host import PACKAGES, cache_dir

_LAYOUT_VERSION = "3"
#: host programs copied (with their shared libraries) into the busybox root
HOST_PROGRAMS = ("/bin/bash",)
_ETC = {
    "passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost sandfleet\n::1 localhost\n",
    "hostname": "sandfleet\n",
    "profile": "export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin\n",
}


def busybox_rootfs() -> tuple[Path, str]:
    """A minimal root directory made of busybox, and its content hash (built once, cached)."""
    busybox = _busybox()
    flat = sorted({busybox, *(f for p in HOST_PROGRAMS if Path(p).exists() for f in _with_libs(Path(p)))})
    h = hashlib.sha256(_LAYOUT_VERSION.encode())
    for f in flat:
        h.update(str(f).encode() + f.read_bytes())
    digest = h.hexdigest()[:16]
    root = cache_dir() / "rootfs" / f"busybox-{digest}"
    if root.is_dir():
        return root, f"busybox-{digest}"
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".busybox-", dir=cache_dir() / "rootfs"))
    tmp.chmod(0o755)
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "home", "tmp", "var/tmp",
              "run", "proc", "sys", "dev", "mnt", "opt", "usr/local/bin"):  # fmt: skip
        (tmp / d).mkdir(parents=True, exist_ok=True)
    (tmp / "tmp").chmod(0o1777)
    (tmp / "var/tmp").chmod(0o1777)
    shutil.copy2(busybox, tmp / "bin/busybox")
    applets = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        link = tmp / applet
        if not link.exists() and not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to("/bin/busybox")
    for f in flat:
        if f == busybox:
            continue
        dest = tmp / str(f).lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink():
            dest.unlink()
        shutil.copy2(f, dest)
    for name, text in _ETC.items():
        (tmp / "etc" / name).write_text(text)
    try:
        tmp.rename(root)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return root, f"busybox-{digest}"


def _with_libs(program: Path) -> list[Path]:
    """``program`` and the shared libraries ``ldd`` says it loads (real paths)."""
    out = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=False)
    found = [program]
    for line in out.stdout.splitlines():
        parts = line.split()
        path = parts[2] if len(parts) >= 3 and parts[1] == "=>" else parts[0] if parts else ""
        if path.startswith("/"):
            found.append(Path(path))
    return found


def _du(root: Path) -> tuple[int, int]:
    """(bytes, inodes) under root, not following symlinks."""
    size = files = 0
    for dirpath, dirnames, filenames in os.walk(root):
        files += len(dirnames) + len(filenames)
        for name in filenames:
            try:
                size += os.lstat(Path(dirpath) / name).st_size
            except OSError:
                pass
    return size, files


def ext4_disk(root: Path, content_hash: str) -> Path:
    """A read-only ext4 image of ``root`` (cached under ``disks/<content_hash>.ext4``)."""
    out = cache_dir() / "disks" / f"{content_hash}.ext4"
    if out.is_file():
        return out
    mkfs = shutil.which("mkfs.ext4") or "/sbin/mkfs.ext4"
    if not Path(mkfs).exists():
        raise HostUnsupportedError(f"mkfs.ext4 not found; install it: apt-get install {PACKAGES}")
    size, files = _du(root)
    size_mb = int(size * 1.25 / 2**20) + files * 4 // 1024 + 32
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    argv = [
        mkfs, "-q", "-F", "-t", "ext4", "-d", str(root), "-L", "sandfleet", "-b", "4096",
        "-N", str(files + files // 2 + 1024), "-O", "^has_journal", "-E", "root_owner=0:0",
        "-m", "0", str(tmp), f"{size_mb}M",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise ImageBuildError(f"mkfs.ext4 failed for {root}: {proc.stderr.strip()}")
    tmp.replace(out)
    return out


def image_disk(image: Image) -> Path:
    """The root disk for ``image``: busybox for "host", else its layers merged (cached)."""
    if image.is_host:
        root, digest = busybox_rootfs()
        return ext4_disk(root, digest)
    cached = cache_dir() / "disks" / f"image-{image.hash}.ext4"
    if cached.is_file() or len(image.lowers) == 1:
        return ext4_disk(image.lowers[0], f"image-{image.hash}")
    if os.geteuid() != 0:
        raise HostUnsupportedError(f"merging the layers of image {image.name} needs root")
    with tempfile.TemporaryDirectory(prefix="sandfleet-merge-") as merged:
        lowers = ":".join(str(p) for p in image.lowers)
        subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={lowers}", merged],
            check=True, capture_output=True,
        )  # fmt: skip
        try:
            return ext4_disk(Path(merged), f"image-{image.hash}")
        finally:
            subprocess.run(["umount", "-l", merged], check=False, capture_output=True)
