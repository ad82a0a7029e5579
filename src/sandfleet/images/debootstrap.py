"""Debian base images built with debootstrap, and the choice of base for a suite.

The apt mirror comes from the host's own apt configuration (or --mirror); nothing here
names a mirror. For another architecture (e.g. arm64 on x86_64), debootstrap runs its
first stage with ``--foreign`` and its second stage under qemu-user-static via binfmt.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from sandfleet.errors import ImageBuildError
from sandfleet.images import Image, arch, host_image, images_dir, list_images, save_image, scratch

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


def base_image_for(suite: str, packages: tuple[str, ...] = (), *, file: str | None = None,
                   line: int | None = None) -> Image:
    """The base for a Debian suite: a built one from the cache, else the host's own root
    when the host runs that suite. Otherwise say how to build one."""
    built = [i for i in list_images() if i.meta.get("kind") == "debian-base" and i.meta.get("suite") == suite
             and i.arch == arch()]
    if built:
        want = set(packages)
        built.sort(key=lambda i: len(want - {str(p) for p in i.meta.get("packages") or []}))  # type: ignore[attr-defined]
        return built[0]
    if host_suite() == suite:
        missing = sorted(set(packages) - _installed_on_host())
        img = host_image()
        # a copy: host_image() is shared, and what's missing depends on the packages asked for
        return dataclasses.replace(img, meta={**img.meta, "missing_packages": missing}) if missing else img
    raise ImageBuildError(
        f"no Debian {suite} base here (the host runs {host_suite() or 'something else'}); "
        f"build one with: sandfleet image build --suite {suite}", file=file, line=line)


def build_base(suite: str = "bookworm", packages: tuple[str, ...] = DEFAULT_PACKAGES, *,
               target_arch: str | None = None, mirror: str | None = None, variant: str = "minbase") -> Image:
    """debootstrap a Debian root filesystem into the image cache (cached by its recipe)."""
    target_arch = target_arch or arch()
    if not shutil.which("debootstrap"):
        raise ImageBuildError("debootstrap is not installed: apt-get install debootstrap")
    mirror = mirror or host_mirror()
    if not mirror:
        raise ImageBuildError("no apt mirror in the host's apt sources; pass --mirror")
    recipe = f"debian-base/1 {suite} {target_arch} {variant} {' '.join(sorted(packages))}"
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:32]
    for img in list_images():
        if img.hash == digest:
            return img
    out = images_dir() / digest
    scratch.reap(images_dir())  # what killed builds left
    tmp = scratch.scratch_dir(images_dir(), ".debootstrap-")
    rootfs = tmp / "rootfs"
    rootfs.mkdir(parents=True)
    foreign = target_arch != arch()
    cmd = ["debootstrap", f"--variant={variant}", f"--arch={target_arch}"]
    if packages:
        cmd.append("--include=" + ",".join(packages))
    if foreign:
        cmd.append("--foreign")
    cmd += [suite, str(rootfs), mirror]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0 and foreign:
        qemu = shutil.which(f"qemu-{ {'arm64': 'aarch64', 'amd64': 'x86_64'}.get(target_arch, target_arch)}-static")
        if not qemu:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ImageBuildError(f"building for {target_arch} needs qemu-user-static and binfmt-support")
        proc = subprocess.run(["chroot", str(rootfs), "/debootstrap/debootstrap", "--second-stage"],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        log_tail = (proc.stdout + proc.stderr)[-1500:]
        shutil.rmtree(tmp, ignore_errors=True)
        raise ImageBuildError(f"debootstrap {suite} failed: {log_tail}")
    subprocess.run(["chroot", str(rootfs), "apt-get", "clean"], capture_output=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    image = Image(name=f"debian-{suite}-{target_arch}", lowers=[out / "rootfs"], arch=target_arch,
                  page_size=os.sysconf("SC_PAGE_SIZE"), hash=digest, base="debootstrap",
                  meta={"kind": "debian-base", "suite": suite, "packages": list(packages),
                        "build_s": round(time.monotonic() - t0, 1)})
    save_image(image)
    return image
