"""The guest's boot files: an uncompressed ``vmlinux`` and a small initramfs.

Debian ships the kernel as a compressed bzImage; the uncompressed ELF inside it has a PVH
entry point, so QEMU's ``microvm`` machine jumps straight into it (no firmware, no
decompression: under TCG that saves seconds). The initramfs holds busybox, the virtio
modules of that kernel, the guest agent and :data:`INIT`, which mounts the image's root
disk read-only under a tmpfs overlay and ``switch_root``s into the guest agent.
Everything is built once and cached by content under :func:`host.cache_dir`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import subprocess
import threading
from pathlib import Path

from sandfleet.errors import HostUnsupportedError
from sandfleet.sandbox.microvm.host import PACKAGES, GuestKernel, cache_dir
from sandfleet.sandbox.spec import GUEST_AGENT_PATHS

PROBE_MARKER = "SANDFLEET-PROBE-OK"
"""What :func:`probe_initramfs` prints when the guest kernel booted (microvm/probe.py)."""

#: kernel modules the guest needs, with their dependencies resolved from modules.dep
MODULES = ("virtio_mmio", "virtio_console", "virtio_blk", "overlay")
#: the name of the virtio-serial port the guest agent listens on
AGENT_PORT = "sandfleet.agent"
#: where the agent binary lives inside the guest
AGENT_GUEST_PATH = GUEST_AGENT_PATHS["microvm"]

INIT = r"""#!/bin/busybox sh
B=/bin/busybox
fail() { echo "sandfleet-init: $*" >/dev/ttyS0; $B poweroff -f; }
$B mount -t devtmpfs dev /dev
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
for m in $(cat /modules); do $B insmod /lib/modules/$m.ko || fail "insmod $m"; done
disk=1024m
for a in $($B cat /proc/cmdline); do
  case $a in
    sandfleet.disk=*) disk=${a#*=};;
  esac
done
$B mkdir -p /lower /rw /newroot
$B mount -o ro /dev/vda /lower || fail "mount root disk"
$B mount -t tmpfs -o size=$disk,mode=0755 rw /rw
$B mkdir -p /rw/upper /rw/work
$B mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
  || fail "mount overlay"
for d in dev proc sys tmp run/sandfleet; do $B mkdir -p /newroot/$d; done
$B chmod 1777 /newroot/tmp
$B cp /agent /newroot__AGENT__
dev=
for p in /sys/class/virtio-ports/*; do
  [ "$($B cat $p/name)" = __PORT__ ] && dev=/dev/${p##*/}
done
[ -n "$dev" ] || fail "no virtio-serial port __PORT__"
$B hostname sandfleet
$B ip link set lo up
$B mount --move /dev /newroot/dev
$B mount --move /proc /newroot/proc
$B mount --move /sys /newroot/sys
$B mkdir -p /newroot/dev/pts /newroot/dev/shm
$B mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts
$B mount -t tmpfs -o mode=1777 shm /newroot/dev/shm
# what udev makes elsewhere: bash's process substitution (<(...)) and /dev/stdin need them
$B ln -sf /proc/self/fd /newroot/dev/fd
$B ln -sf /proc/self/fd/0 /newroot/dev/stdin
$B ln -sf /proc/self/fd/1 /newroot/dev/stdout
$B ln -sf /proc/self/fd/2 /newroot/dev/stderr
exec $B switch_root /newroot __AGENT__ --device $dev
"""


def vmlinux(kernel: GuestKernel) -> Path:
    """The uncompressed ELF kernel inside ``kernel.image`` (cached)."""
    out = cache_dir() / "kernel" / kernel.version / "vmlinux"
    if out.is_file():
        return out
    data = kernel.image.read_bytes()
    # (magic, decompressor) of the formats Debian has used; the first that yields an ELF wins
    formats = [
        (b"\x02\x21\x4c\x18", ["lz4", "-dc"]),
        (b"\x28\xb5\x2f\xfd", ["zstd", "-dcq"]),
        (b"\xfd7zXZ\x00", ["xz", "-dc"]),
        (b"\x1f\x8b\x08", ["gzip", "-dc"]),
    ]
    for magic, tool in formats:
        at = data.find(magic)
        if at < 0 or not shutil.which(tool[0]):
            continue
        # decompressors complain about the trailing bytes after the payload; the output is fine
        proc = subprocess.run(tool, input=data[at:], capture_output=True, check=False)
        if proc.stdout[:4] == b"\x7fELF":
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(proc.stdout)
            tmp.replace(out)
            return out
    raise HostUnsupportedError(f"can't extract vmlinux from {kernel.image} (need lz4/zstd/xz/gzip: {PACKAGES})")


def _module_order(kernel: GuestKernel) -> list[Path]:
    """The module files to load, dependencies first."""
    deps: dict[str, list[str]] = {}
    for line in (kernel.modules / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
    by_name = {Path(p).name.split(".ko")[0].replace("-", "_"): p for p in deps}
    order: list[str] = []

    def visit(path: str) -> None:
        for dep in reversed(deps.get(path, [])):
            visit(dep)
        if path not in order:
            order.append(path)

    for name in MODULES:
        if name in by_name:  # absent: built into this kernel
            visit(by_name[name])
    return [kernel.modules / p for p in order]


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (name, mode, data) entries; directories have empty data."""
    buf = io.BytesIO()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        buf.write(header + name.encode() + b"\0")
        buf.write(b"\0" * (-buf.tell() % 4) + data + b"\0" * (-len(data) % 4))
    return buf.getvalue()


def _busybox() -> Path:
    for path in ("/bin/busybox", "/usr/bin/busybox"):
        if Path(path).is_file():
            return Path(path)
    raise HostUnsupportedError(f"busybox (static) not found; install it: apt-get install {PACKAGES}")


def _build(name: str, entries: list[tuple[str, int, bytes]]) -> Path:
    blob = gzip.compress(_cpio(entries), compresslevel=1, mtime=0)
    out = cache_dir() / "initramfs" / f"{name}-{hashlib.sha256(blob).hexdigest()[:16]}.cpio.gz"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(blob)
        tmp.replace(out)
    return out


def _base_entries(kernel: GuestKernel, init: str) -> list[tuple[str, int, bytes]]:
    modules = _module_order(kernel)
    names = " ".join(p.name.split(".ko")[0] for p in modules)
    return [
        *[(d, 0o40755, b"") for d in ("bin", "dev", "proc", "sys", "lib", "lib/modules")],
        ("bin/busybox", 0o100755, _busybox().read_bytes()),
        ("init", 0o100755, init.encode()),
        ("modules", 0o100644, names.encode()),
        *[(f"lib/modules/{p.name}", 0o100644, p.read_bytes()) for p in modules],
    ]


def initramfs(kernel: GuestKernel, agent: Path) -> Path:
    """The initramfs that boots into ``agent`` on the :data:`AGENT_PORT` port (cached)."""
    init = INIT.replace("__AGENT__", AGENT_GUEST_PATH).replace("__PORT__", AGENT_PORT)
    entries = [*_base_entries(kernel, init), ("agent", 0o100755, agent.read_bytes())]
    return _build("agent", entries)


def probe_initramfs(kernel: GuestKernel) -> Path:
    """A minimal initramfs that prints :data:`PROBE_MARKER` on ttyS0 and powers off."""
    init = (
        "#!/bin/busybox sh\n/bin/busybox mount -t devtmpfs dev /dev\n"
        f"echo {PROBE_MARKER} >/dev/ttyS0\n/bin/busybox poweroff -f\n"
    )
    entries = [
        ("bin", 0o40755, b""),
        ("dev", 0o40755, b""),
        ("bin/busybox", 0o100755, _busybox().read_bytes()),
        ("init", 0o100755, init.encode()),
    ]
    return _build("probe", entries)
