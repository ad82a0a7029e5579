"""Foreign architectures under user-mode emulation, and the 64K-page check.

- **Emulation.** An arm64 image runs on an x86_64 host through qemu-user-static (from apt) and
  binfmt_misc. :func:`emulation` makes sure the kernel hands foreign ELF files to qemu: it
  uses a registration that is already there, else registers one of its own, named
  ``sandfleet-qemu-<cpu>``, from Debian's ``/usr/lib/binfmt.d/qemu-<cpu>.conf`` (magic, mask,
  interpreter),
  always with the **F** flag (the interpreter is opened at registration, so it works inside
  namespaces and chroots that don't contain it), and removes it again when the block ends.
  Registrations are system-wide: :func:`registrations` lists them for ``sandfleet doctor``, and
  :func:`remove_ours` removes any ``sandfleet-*`` one a killed run left behind.
- **The target arch.** ``--arch`` sets ``SANDFLEET_ARCH`` (:func:`target`), which
  :func:`sandfleet.imagestore.arch` reports: bases are debootstrapped for it (``--foreign``, the second
  stage under emulation) and task images layered on them.
- **The guest agent** for another arch is cross-compiled, static (gcc-aarch64-linux-gnu):
  :func:`agent_binary_for`. The bwrap backend runs the host's own static agent in a foreign
  rootfs (it needs no library from it); the commands it starts are emulated.
- **64K pages.** :func:`page_size_problems` flags ELF files whose ``PT_LOAD`` segments are
  aligned below the page size (``p_align`` < 65536 cannot be mapped by a 64K-page kernel).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import re
import shutil
import stat
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfleet.errors import HostUnsupportedError
from sandfleet.settings import current as current_settings
from sandfleet.settings import install

BINFMT = Path("/proc/sys/fs/binfmt_misc")
BINFMT_CONF = Path("/usr/lib/binfmt.d")
PREFIX = "sandfleet-"
QEMU_CPU = {"arm64": "aarch64", "amd64": "x86_64", "armhf": "arm", "ppc64el": "ppc64le", "s390x": "s390x",
            "riscv64": "riscv64"}
"""Debian arch -> qemu's CPU name."""
CROSS_CC = {"arm64": "aarch64-linux-gnu-gcc", "amd64": "x86_64-linux-gnu-gcc"}
ENV = "SANDFLEET_ARCH"


def host_arch() -> str:
    """Debian's name for this machine's own architecture."""
    m = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "armhf"}.get(m, m)


def target() -> str:
    """The architecture images are built and run for: ``$SANDFLEET_ARCH`` (``--arch``), else
    this host's."""
    return current_settings().arch or host_arch()


def set_target(arch: str | None) -> None:
    """Build and run for ``arch`` from now on, in this process and the ones it starts (None or
    the host's own: native)."""
    wanted = normalize(arch) if arch and normalize(arch) != host_arch() else None
    install(current_settings().replace(arch=wanted))
    if wanted:  # the processes it starts that are not given child_env(): written for them too
        os.environ[ENV] = wanted
    else:
        os.environ.pop(ENV, None)


def normalize(arch: str) -> str:
    aliases = {"aarch64": "arm64", "x86_64": "amd64", "x86-64": "amd64"}
    out = aliases.get(arch.lower(), arch.lower())
    if out not in QEMU_CPU:
        raise ValueError(f"unknown architecture {arch!r} (known: {', '.join(sorted(QEMU_CPU))})")
    return out


# -- binfmt_misc


@dataclass(frozen=True)
class Registration:
    """One binfmt_misc entry."""

    name: str
    enabled: bool
    interpreter: str
    flags: str
    magic: str

    @property
    def ours(self) -> bool:
        return self.name.startswith(PREFIX)


def _mounted() -> bool:
    return (BINFMT / "register").exists()


def mount_binfmt() -> None:
    """Mount binfmt_misc where it is not (needs root)."""
    if _mounted():
        return
    proc = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise HostUnsupportedError(f"binfmt_misc is not mounted and can't be ({proc.stderr.strip()}); as root: "
                                   f"mount -t binfmt_misc binfmt_misc {BINFMT}")


def registrations() -> list[Registration]:
    """Every binfmt_misc registration of this kernel (empty when binfmt_misc is not mounted)."""
    if not _mounted():
        return []
    out = []
    for entry in sorted(BINFMT.iterdir()):
        if entry.name in ("register", "status"):
            continue
        try:
            text = entry.read_text()
        except OSError:
            continue
        fields = dict(line.split(" ", 1) for line in text.splitlines()[1:] if " " in line)
        out.append(Registration(entry.name, text.startswith("enabled"), fields.get("interpreter", ""),
                                fields.get("flags:", fields.get("flags", "")).strip(), fields.get("magic", "")))
    return out


def _elf_machine(arch: str) -> str:
    """The magic bytes' e_machine (hex, little-endian) binfmt shows for ``arch``."""
    return {"arm64": "b700", "amd64": "3e00", "armhf": "2800", "riscv64": "f300", "ppc64el": "1500",
            "s390x": "0016"}[arch]


def registration_for(arch: str) -> Registration | None:
    """An enabled registration that runs ``arch``'s ELF files, with the F flag; None if none."""
    cpu = QEMU_CPU[arch]
    for reg in registrations():
        if reg.enabled and "F" in reg.flags and (cpu in Path(reg.interpreter).name or cpu in reg.name) \
                and _elf_machine(arch) in reg.magic:
            return reg
    return None


def qemu_static(arch: str) -> Path:
    path = shutil.which(f"qemu-{QEMU_CPU[arch]}-static")
    if not path:
        raise HostUnsupportedError(f"running {arch} here needs qemu-user-static: apt-get install qemu-user-static")
    return Path(path)


def _conf_line(arch: str) -> str:
    """Debian's binfmt line for ``arch`` (qemu-user-static's /usr/lib/binfmt.d), with our name,
    qemu-<cpu>-static as the interpreter and the F flag."""
    cpu = QEMU_CPU[arch]
    conf = BINFMT_CONF / f"qemu-{cpu}.conf"
    try:
        line = next(ln for ln in conf.read_text().splitlines() if ln.startswith(":"))
    except (OSError, StopIteration):
        raise HostUnsupportedError(f"{conf} is missing: apt-get install qemu-user-static") from None
    parts = line.split(":")
    # :name:type:offset:magic:mask:interpreter:flags
    if len(parts) != 8:
        raise HostUnsupportedError(f"{conf}: unexpected format: {line!r}")
    interpreter = parts[6]  # Debian's argv0-preserving wrapper (the P flag), else the plain binary
    flags = set(parts[7]) | {"F"}
    if not Path(interpreter).exists():
        interpreter, flags = str(qemu_static(arch)), flags - {"P"}
    return ":".join(["", PREFIX + f"qemu-{cpu}", parts[2], parts[3], parts[4], parts[5], interpreter,
                     "".join(sorted(flags))])


def register(arch: str) -> Registration:
    """Register qemu for ``arch`` (our name, F flag); the registration."""
    mount_binfmt()
    line = _conf_line(arch)
    try:
        (BINFMT / "register").write_text(line + "\n")
    except OSError as e:
        raise HostUnsupportedError(f"could not register {arch} emulation with binfmt_misc ({e}); needs root") \
            from None
    name = line.split(":")[1]
    reg = next((r for r in registrations() if r.name == name), None)
    if reg is None:
        raise HostUnsupportedError(f"binfmt_misc did not take the registration {name}")
    return reg


def unregister(name: str) -> None:
    """Remove a registration (``-1`` into its entry)."""
    with contextlib.suppress(FileNotFoundError):
        (BINFMT / name).write_text("-1\n")


def remove_ours() -> list[str]:
    """Remove every registration sandfleet made (``sandfleet-*``); their names."""
    gone = [r.name for r in registrations() if r.ours]
    for name in gone:
        unregister(name)
    return gone


@contextlib.contextmanager
def emulation(arch: str) -> Iterator[Registration | None]:
    """While the block runs, ``arch``'s binaries run on this host: natively (None), through a
    registration already there, or through one registered now. Every user holds a shared lock
    (``/run/sandfleet/binfmt-<arch>.users.lock``, whatever the run's cache); whoever leaves last
    removes sandfleet's registration, so two runs at once never pull it from under each other, and
    none outlives them."""
    from sandfleet.agent.build import cache_dir

    arch = normalize(arch)
    if arch == host_arch():
        yield None
        return
    qemu_static(arch)
    locks = LOCK_DIR if _writable(LOCK_DIR) else cache_dir()  # one place for the host: binfmt is system-wide
    reg_fd = os.open(locks / f"binfmt-{arch}.register.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    use_fd = os.open(locks / f"binfmt-{arch}.users.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        with _flock(reg_fd, fcntl.LOCK_EX):  # one registers (or unregisters) at a time
            reg = registration_for(arch) or register(arch)
            fcntl.flock(use_fd, fcntl.LOCK_SH)
        try:
            yield reg
        finally:
            fcntl.flock(use_fd, fcntl.LOCK_UN)
            with _flock(reg_fd, fcntl.LOCK_EX):
                try:
                    fcntl.flock(use_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # another run (or an outer block) still uses it: the last one out removes it
                else:
                    fcntl.flock(use_fd, fcntl.LOCK_UN)
                    for r in registrations():
                        if r.name == f"{PREFIX}qemu-{QEMU_CPU[arch]}":
                            unregister(r.name)
    finally:
        os.close(use_fd)
        os.close(reg_fd)


LOCK_DIR = Path("/run/sandfleet")
"""Where the binfmt locks live: the same for every run on the host, whatever its cache."""


def _writable(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(d, os.W_OK)


@contextlib.contextmanager
def _flock(fd: int, how: int) -> Iterator[None]:
    fcntl.flock(fd, how)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


# -- the guest agent for another arch


def agent_binary_for(arch: str) -> Path:
    """The static guest agent built for ``arch``: the host's own build for the host's arch, else
    cross-compiled (``aarch64-linux-gnu-gcc -static``) and cached by source hash."""
    from sandfleet.agent.build import SOURCE, _cache_base, agent_binary, install, source_bytes

    arch = normalize(arch)
    if arch == host_arch():
        return agent_binary()
    cc = shutil.which(CROSS_CC.get(arch, ""))
    if not cc:
        raise HostUnsupportedError(f"building the guest agent for {arch} needs a cross compiler: apt-get install "
                                   f"gcc-{QEMU_CPU[arch]}-linux-gnu")
    digest = hashlib.sha256(source_bytes()).hexdigest()[:16]
    binary = _cache_base() / "agent" / f"{QEMU_CPU[arch]}-{digest}" / "sandfleet-agent"

    def compile_(out: Path) -> None:
        proc = subprocess.run([cc, "-O2", "-static", "-o", str(out), str(SOURCE)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise HostUnsupportedError(f"cross-compiling the guest agent for {arch} failed:\n{proc.stderr[-2000:]}")

    if not binary.is_file():
        install(binary, compile_)
    return binary


# -- 64K pages

PT_LOAD = 1
PAGE_64K = 65536


def parse_page_size(text: str) -> int:
    """``4k``, ``16k``, ``64k`` or a number of bytes."""
    m = re.fullmatch(r"(\d+)\s*([kK])?", text.strip())
    if not m:
        raise ValueError(f"page size must be like 4k, 16k or 64k, not {text!r}")
    n = int(m.group(1)) * (1024 if m.group(2) else 1)
    if n < 4096 or n & (n - 1):
        raise ValueError(f"page size must be a power of two of at least 4k, not {text!r}")
    return n


def load_alignments(path: Path) -> list[int] | None:
    """The ``p_align`` of each PT_LOAD segment of an ELF file; None for a file that is not ELF."""
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            if len(ident) < 52 or ident[:4] != b"\x7fELF":
                return None
            wide, little = ident[4] == 2, ident[5] == 1
            end = "<" if little else ">"
            if wide:
                phoff, = struct.unpack_from(end + "Q", ident, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 54)
            else:
                phoff, = struct.unpack_from(end + "I", ident, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 42)
            if phnum == 0 or phnum > 4096 or phentsize < (56 if wide else 32):
                return []
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return None
    aligns = []
    for i in range(min(phnum, len(table) // phentsize)):
        entry = table[i * phentsize:(i + 1) * phentsize]
        p_type, = struct.unpack_from(end + "I", entry, 0)
        if p_type != PT_LOAD:
            continue
        p_align, = struct.unpack_from(end + ("Q" if wide else "I"), entry, 48 if wide else 28)
        aligns.append(p_align)
    return aligns


def page_size_problems(roots: list[Path], page_size: int = PAGE_64K, *, limit: int = 10_000) -> dict[str, int]:
    """ELF files under ``roots`` (an image's layers, top first: a file in a higher layer hides
    the same path below) that a kernel with ``page_size`` pages can't load: path inside the
    image -> the smallest PT_LOAD ``p_align``. Links, devices and files under /proc, /sys,
    /dev are skipped."""
    seen: set[str] = set()
    bad: dict[str, int] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = "/" + os.path.relpath(dirpath, root).lstrip(".")
            if rel_dir in ("/proc", "/sys", "/dev"):
                dirnames[:] = []
                continue
            for name in filenames:
                inside = f"{rel_dir.rstrip('/')}/{name}"
                if inside in seen:
                    continue
                seen.add(inside)
                full = Path(dirpath) / name
                try:
                    st = full.lstat()
                except OSError:
                    continue
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    continue  # an overlayfs whiteout: the path is deleted (kept in `seen`)
                if not stat.S_ISREG(st.st_mode) or st.st_size < 52:
                    continue
                aligns = load_alignments(full)
                if aligns and min(aligns) < page_size:
                    bad[inside] = min(aligns)
                    if len(bad) >= limit:
                        return bad
    return bad


# -- a tiny foreign image: busybox-static from apt (the arm64 smoke test)


def apt_download(package: str, arch: str, dest: Path) -> Path:
    """Download ``package`` for ``arch`` with apt-get from the host's own apt sources, into a
    private apt state under ``dest`` (the host's dpkg and apt lists are left alone); the .deb."""
    state, cache, debs = dest / "apt-state", dest / "apt-cache", dest / "debs"
    for d in (state / "lists" / "partial", cache / "archives" / "partial", debs):
        d.mkdir(parents=True, exist_ok=True)
    (state / "status").touch()
    opts = [f"-oDir::State={state}", f"-oDir::State::status={state / 'status'}", f"-oDir::Cache={cache}",
            f"-oAPT::Architecture={arch}", f"-oAPT::Architectures::={arch}", "-oDebug::NoLocking=1", "-qq"]
    for cmd, cwd in ((["apt-get", *opts, "update"], dest), (["apt-get", *opts, "download", f"{package}:{arch}"], debs)):
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise HostUnsupportedError(f"apt-get {cmd[len(opts) + 1]} {package}:{arch} failed: "
                                       f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    found = sorted(debs.glob(f"{package}_*_{arch}.deb"))
    if not found:
        raise HostUnsupportedError(f"apt-get download left no {package} .deb for {arch} in {debs}")
    return found[-1]


BUSYBOX_TOOLS = ("sh", "echo", "cat", "ls", "uname", "id", "mkdir", "rm", "sleep", "true", "false", "env",
                 "printf", "test", "[", "kill", "chmod", "chown", "cp", "mv", "touch", "head", "tail", "grep",
                 "sed", "find", "tar", "xargs", "stat", "readlink", "mktemp", "sort", "wc", "ps")


def busybox_image(arch: str = "arm64") -> Any:
    """An image whose root holds only busybox-static for ``arch`` (from apt) and its applets
    (``sh``, ``uname``, ...), saved in the image cache as ``busybox-<arch>``; built once."""
    from sandfleet.imagestore import Image, images_dir, list_images, save_image

    arch = normalize(arch)
    for img in list_images():
        if img.name == f"busybox-{arch}" and img.meta.get("kind") == "busybox":
            return img
    work = images_dir() / f".busybox-{arch}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        deb = apt_download("busybox-static", arch, work)
        root = work / "rootfs"
        proc = subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise HostUnsupportedError(f"dpkg-deb -x {deb.name}: {proc.stderr.strip()}")
        for d in ("usr/bin", "sbin", "tmp", "etc", "proc", "dev", "sys", "root", "home"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "tmp").chmod(0o1777)
        for tool in BUSYBOX_TOOLS:
            link = root / "bin" / tool
            if not link.exists():
                link.symlink_to("busybox")
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (root / "etc" / "group").write_text("root:x:0:\n")
        digest = hashlib.sha256(f"busybox {arch} {deb.name}".encode()).hexdigest()[:32]
        out = images_dir() / digest
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        root.rename(out / "rootfs")
        image = Image(name=f"busybox-{arch}", lowers=[out / "rootfs"], arch=arch, page_size=os.sysconf("SC_PAGE_SIZE"),
                      hash=digest, base="busybox-static", meta={"kind": "busybox", "deb": deb.name})
        save_image(image)
        return image
    finally:
        shutil.rmtree(work, ignore_errors=True)
