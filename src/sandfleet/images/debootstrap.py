"""Debian base images built with debootstrap, and the choice of base for a suite.

The apt mirror comes from the host's own apt configuration (or --mirror); nothing here
names a mirror. For another architecture (e.g. arm64 on x86_64), debootstrap runs its
first stage with ``--foreign`` and its second stage under qemu-user-static via binfmt.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from sandfleet.errors import ImageBuildError
from sandfleet.images import scratch
from sandfleet.imagestore import Image, arch, host_arch, host_image, images_dir, list_images, save_image

if TYPE_CHECKING:
    from sandfleet.images.bases import BaseRef

DEFAULT_PACKAGES = ("python3", "python3-pytest", "git", "make", "gcc", "libc6-dev", "sqlite3", "jq",
                    "ca-certificates", "procps", "xz-utils", "bzip2", "patch", "bc", "file")


@functools.cache
def host_suite() -> str | None:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return None
    if not re.search(r"^ID=debian$", text, re.M):
        return None
    m = re.search(r"^VERSION_CODENAME=(\w+)", text, re.M)
    return m.group(1) if m else None


def host_mirror() -> str | None:
    """The first Debian mirror in the host's apt sources (deb822 or one-line format)."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        for m in re.finditer(r"^URIs:\s*(\S+)", text, re.M):
            if "security" not in m.group(1):
                return m.group(1)
        for m in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", text, re.M):
            if "security" not in m.group(1):
                return m.group(1)
    return None


@functools.cache
def suite_available(suite: str, mirror: str | None = None) -> bool:
    """Whether a base of Debian ``suite`` can be had here: one is cached, or this host can
    debootstrap and the mirror serves ``dists/<suite>/Release``. With ``mirror`` given: only
    whether that mirror serves it."""
    if mirror is None:
        if any(img.meta.get("kind") == "debian-base" and img.meta.get("suite") == suite for img in list_images()):
            return True
        if why_no_build() is not None:
            return False
    mirror = mirror or host_mirror()
    if not mirror:
        return False
    if not mirror.startswith(("http://", "https://")):
        return Path(mirror.removeprefix("file://"), "dists", suite, "Release").is_file()
    request = urllib.request.Request(f"{mirror.rstrip('/')}/dists/{suite}/Release", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def _installed_on_host() -> set[str]:
    try:
        status = Path("/var/lib/dpkg/status").read_text(errors="replace")
    except OSError:
        return set()
    names = set()
    for block in status.split("\n\n"):
        m = re.search(r"^Package: (\S+)", block, re.M)
        if m and "Status: install ok installed" in block:
            names.add(m.group(1))
    return names


BASE_RECIPE = "debian-base/1"
PYTHON_FLAVOUR = "python/1"
"""Bump when what the python flavour does to a base changes (it is part of the base's hash)."""


def base_digest(suite: str, packages: tuple[str, ...], target_arch: str, variant: str = "minbase",
                flavour: str | None = None) -> str:
    """The hash a base of this recipe is cached under."""
    recipe = f"{BASE_RECIPE} {suite} {target_arch} {variant} {' '.join(sorted(set(packages)))}"
    if flavour:
        recipe += f" flavour={PYTHON_FLAVOUR if flavour == 'python' else flavour}"
    return hashlib.sha256(recipe.encode()).hexdigest()[:32]


def why_no_build() -> str | None:
    """Why this host can't debootstrap a base, or None when it can."""
    if not shutil.which("debootstrap"):
        return "debootstrap is not installed (apt-get install debootstrap)"
    if os.geteuid() != 0:
        return "debootstrap needs root"
    if not host_mirror():
        return "the host's apt sources name no Debian mirror"
    return None


def base_image_for(ref: BaseRef, *, file: str | None = None, line: int | None = None,
                   build: bool = True) -> Image:
    """The base for ``ref``: built exactly to its recipe (Debian suite, the packages the named
    image implies, the python flavour), from the cache or with debootstrap now (``build``).

    Where this host can't debootstrap at all (no debootstrap, not root, no apt mirror) and runs
    ``ref.suite`` itself, the host's own root stands in, and the image says so in its
    ``warnings`` (and lists the packages it lacks in ``missing_packages``): a substitution
    like any other, which ``--strict-bases`` refuses (the caller checks ``warnings``)."""
    digest = base_digest(ref.suite, _packages(ref.packages, ref.flavour), arch(), flavour=ref.flavour)
    for img in list_images():
        if img.hash == digest:
            return img
    why = why_no_build()
    if why is None and build:
        return build_base(ref.suite, ref.packages, flavour=ref.flavour, file=file, line=line)
    if why is not None and host_suite() == ref.suite and arch() == host_arch():
        missing = sorted(set(ref.packages) - _installed_on_host())
        img = host_image()
        warning = (f"no Debian {ref.suite} base could be built ({why}): the host's own root stands in "
                   f"for {ref.image}; its files can't be changed by a build step (no apt-get or pip "
                   "install into system directories)")
        if ref.flavour == "python":
            warning += ", and it keeps Debian's EXTERNALLY-MANAGED marker"
        if missing:
            warning += f"; packages the image implies that the host lacks: {', '.join(missing)}"
        # a copy: host_image() is shared, and what's missing depends on the packages asked for
        return dataclasses.replace(img, meta={**img.meta, "missing_packages": missing, "warnings": [warning]})
    hint = why or "not built yet"
    packages = ",".join(ref.packages) or "''"
    flavour = " --python-flavour" if ref.flavour == "python" else ""
    raise ImageBuildError(f"no Debian {ref.suite} base for {ref.image} here ({hint}); build it with: sandfleet "
                          f"image build --suite {ref.suite} --packages {packages}{flavour}", file=file, line=line)


def _packages(packages: tuple[str, ...], flavour: str | None) -> tuple[str, ...]:
    return tuple(sorted(set(packages) | ({"python-is-python3"} if flavour == "python" else set())))


_MISSING_DEBS = re.compile(r"Couldn't find these debs: (.*)")


def build_base(suite: str = "bookworm", packages: tuple[str, ...] = DEFAULT_PACKAGES, *,
               target_arch: str | None = None, mirror: str | None = None, variant: str = "minbase",
               flavour: str | None = None, file: str | None = None, line: int | None = None) -> Image:
    """debootstrap a Debian root filesystem into the image cache (cached by its recipe; one
    build at a time per recipe, across processes). ``flavour="python"`` gives it the official
    python image's semantics: Debian's ``EXTERNALLY-MANAGED`` markers diverted away (so
    ``pip install`` works without ``--break-system-packages``, also after an apt upgrade of
    Python), ``python`` on PATH (python-is-python3)."""
    target_arch = target_arch or arch()
    if not shutil.which("debootstrap"):
        raise ImageBuildError("debootstrap is not installed: apt-get install debootstrap", file=file, line=line)
    mirror = mirror or host_mirror()
    if not mirror:
        raise ImageBuildError("no apt mirror in the host's apt sources; pass --mirror", file=file, line=line)
    packages = _packages(packages, flavour)
    digest = base_digest(suite, packages, target_arch, variant, flavour)
    with open(images_dir() / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same base
        for img in list_images():
            if img.hash == digest:
                return img
        from sandfleet.errors import HostUnsupportedError
        from sandfleet.images.emulation import emulation

        try:
            with emulation(target_arch):  # a foreign arch: binfmt (F flag) while the rootfs is made
                return _debootstrap(suite, packages, target_arch, mirror, variant, flavour, digest, file, line)
        except HostUnsupportedError as e:
            raise ImageBuildError(f"building for {target_arch}: {e}", file=file, line=line) from None


def _debootstrap(suite: str, packages: tuple[str, ...], target_arch: str, mirror: str, variant: str,
                 flavour: str | None, digest: str, file: str | None, line: int | None) -> Image:
    out = images_dir() / digest
    scratch.reap(images_dir())  # what killed builds left
    tmp = scratch.scratch_dir(images_dir(), ".debootstrap-")
    rootfs = tmp / "rootfs"
    rootfs.mkdir(parents=True)
    foreign = target_arch != host_arch()
    late = [p for p in packages if _LATE.match(p)] if not foreign else []
    cmd = ["debootstrap", f"--variant={variant}", f"--arch={target_arch}"]
    if packages:
        cmd.append("--include=" + ",".join(p for p in packages if p not in late))
    if foreign:
        cmd.append("--foreign")
    cmd += [suite, str(rootfs), mirror]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0 and foreign:  # the second stage under emulation (build_base set it up)
        proc = subprocess.run(["chroot", str(rootfs), "/debootstrap/debootstrap", "--second-stage"],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        log_tail = (proc.stdout + proc.stderr)[-1500:]
        shutil.rmtree(tmp, ignore_errors=True)
        missing = _MISSING_DEBS.search(proc.stdout + proc.stderr)
        if missing:
            raise ImageBuildError(f"debootstrap {suite}: Debian {suite} has no package(s) "
                                  f"{missing.group(1).strip()} (asked for: {', '.join(packages)})",
                                  file=file, line=line)
        raise ImageBuildError(f"debootstrap {suite} failed: {log_tail}", file=file, line=line)
    if late:
        try:
            _apt_install(rootfs, late, suite, file, line)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    meta: dict[str, object] = {"kind": "debian-base", "suite": suite, "packages": list(packages)}
    if flavour == "python":
        meta.update(flavour="python", python=_python_flavour(rootfs, file, line))
    subprocess.run(["chroot", str(rootfs), "apt-get", "clean"], capture_output=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    meta["build_s"] = round(time.monotonic() - t0, 1)
    name = f"debian-{suite}-{target_arch}" + ("-python" if flavour == "python" else "")
    image = Image(name=name, lowers=[out / "rootfs"], arch=target_arch, page_size=os.sysconf("SC_PAGE_SIZE"),
                  hash=digest, base="debootstrap", meta=meta)
    save_image(image)
    return image


_LATE = re.compile(r"^(openjdk-\d+-jdk(-headless)?|npm)$")
"""Packages whose dependency trees debootstrap's --include can't configure in one pass (the
JDK's ca-certificates-java runs java; npm's ~300 node-* packages): apt-get installs them in
the bootstrapped root instead, with /proc mounted."""


def _apt_install(rootfs: Path, packages: list[str], suite: str, file: str | None, line: int | None) -> None:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}
    proc_dir = rootfs / "proc"
    subprocess.run(["mount", "-t", "proc", "proc", str(proc_dir)], check=True, capture_output=True)
    try:
        for argv in (["apt-get", "update", "-q"],
                     ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
            p = subprocess.run(["chroot", str(rootfs), *argv], capture_output=True, text=True, env=env)
            if p.returncode != 0:
                raise ImageBuildError(f"{' '.join(argv[:2])} in the Debian {suite} base failed: "
                                      f"{(p.stdout + p.stderr)[-1200:]}", file=file, line=line)
    finally:
        subprocess.run(["umount", "-l", str(proc_dir)], capture_output=True)
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)


def _python_flavour(rootfs: Path, file: str | None, line: int | None) -> str:
    """Divert Debian's EXTERNALLY-MANAGED markers (PEP 668) away, as the official python
    images have none; returns ``python -V``'s version."""
    for marker in sorted(rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED")):
        inside = "/" + str(marker.relative_to(rootfs))
        proc = subprocess.run(["chroot", str(rootfs), "dpkg-divert", "--local", "--rename", "--divert",
                               inside + ".sandfleet-diverted", "--add", inside], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ImageBuildError(f"could not divert {inside}: {proc.stderr.strip()}", file=file, line=line)
    proc = subprocess.run(["chroot", str(rootfs), "/usr/bin/env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin",
                           "python", "-V"], capture_output=True, text=True)
    version = (proc.stdout + proc.stderr).strip().removeprefix("Python ")
    if proc.returncode != 0 or not re.match(r"^3\.\d+", version):
        raise ImageBuildError(f"the python base has no working python: {version[-300:]}", file=file, line=line)
    return version
