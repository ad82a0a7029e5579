"""Mapping a FROM reference to a Debian suite plus the packages the base image implies.

sandfleet builds images from Debian (debootstrap), so a base is only buildable when it is a
Debian image or close to one. Known: ``debian:*``, ``python:3.x[-slim][-bookworm|-trixie]``,
``buildpack-deps:*``, ``ubuntu:22.04|24.04`` (approximated by the closest Debian suite, noted),
and Terminal-Bench-1's two public base images. Anything else exists only in a registry and
raises :class:`ImageBuildError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandfleet.errors import ImageBuildError

SUITES = {"bookworm": "12", "trixie": "13"}
PYTHON_PACKAGES = ("python3", "python3-pip", "python3-venv", "python3-dev", "ca-certificates")
BUILDPACK_CURL = ("ca-certificates", "curl", "gnupg", "netbase", "wget")
BUILDPACK_SCM = (*BUILDPACK_CURL, "git", "mercurial", "openssh-client", "subversion", "procps")
BUILDPACK_FULL = (
    *BUILDPACK_SCM,
    "build-essential",
    "autoconf",
    "automake",
    "libtool",
    "pkg-config",
    "file",
    "dpkg-dev",
    "libssl-dev",
    "zlib1g-dev",
)
TBENCH_TOOLS = ("tmux", "asciinema")


@dataclass(frozen=True)
class BaseRef:
    """A buildable base: a Debian suite and the packages the named image would have had."""

    image: str
    """The FROM reference as written (ARGs substituted)."""
    suite: str
    """Debian suite to bootstrap: ``bookworm`` or ``trixie``."""
    packages: tuple[str, ...] = ()
    """Extra apt packages to install so commands the image implied exist."""
    note: str | None = None
    """What differs from the named image, when something does."""


def _split(ref: str) -> tuple[str, str]:
    ref = ref.split("@", 1)[0]  # a digest pins bytes we don't use
    name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
    for prefix in ("docker.io/library/", "docker.io/", "library/", "index.docker.io/library/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name, tag


def _suite_of(tag: str, default: str) -> str | None:
    for suite, version in SUITES.items():
        if suite in tag.split("-") or tag.split("-")[0].split(".")[0] == version:
            return suite
    if any(old in tag for old in ("bullseye", "buster", "stretch", "sid", "forky")):
        return None
    return default


def resolve_base(ref: str, *, file: str | None = None, line: int | None = None) -> BaseRef:
    """Map ``ref`` to a :class:`BaseRef`, or raise :class:`ImageBuildError` saying why not."""
    name, tag = _split(ref)

    def refuse(why: str) -> ImageBuildError:
        return ImageBuildError(f"base image {ref!r}: {why}", file=file, line=line)

    if name == "debian":
        suite = _suite_of(tag, "") if tag not in ("latest", "stable", "stable-slim") else None
        if not suite:
            raise refuse("only Debian 12 (bookworm) and 13 (trixie) are supported; name one")
        return BaseRef(ref, suite)
    if name == "python":
        match = re.match(r"^(3\.\d+)(?:\.\d+)?(?:-(.*))?$", tag)
        if not match:
            raise refuse("name a Python 3 version, e.g. python:3.11-slim-bookworm")
        version, variant = match.group(1), match.group(2) or ""
        if "alpine" in variant or "windows" in variant:
            raise refuse("Alpine and Windows variants are not Debian")
        suite = _suite_of(variant, "bookworm") if variant else "bookworm"
        if suite is None:
            raise refuse("only the bookworm and trixie variants are supported")
        distro = {"bookworm": "3.11", "trixie": "3.13"}[suite]
        note = None
        if version != distro:
            note = f"Python {version} requested; Debian {suite} ships Python {distro} as python3"
        full = variant in ("", suite) or not variant.startswith("slim")
        packages = PYTHON_PACKAGES + (BUILDPACK_FULL if full else ())
        return BaseRef(ref, suite, packages, note)
    if name == "buildpack-deps":
        suite = _suite_of(tag, "bookworm")
        if suite is None:
            raise refuse("only bookworm and trixie are supported")
        packages = BUILDPACK_FULL
        if tag.endswith("-curl"):
            packages = BUILDPACK_CURL
        elif tag.endswith("-scm"):
            packages = BUILDPACK_SCM
        return BaseRef(ref, suite, packages)
    if name == "ubuntu":
        ubuntu = {"22.04": "bookworm", "jammy": "bookworm", "24.04": "trixie", "noble": "trixie"}
        suite = ubuntu.get(tag.split("-")[0])
        if suite is None:
            raise refuse("only ubuntu:22.04 and ubuntu:24.04 are approximated")
        return BaseRef(
            ref,
            suite,
            ("ca-certificates",),
            f"Ubuntu {tag} approximated by Debian {suite} (closest suite)",
        )
    if name == "ghcr.io/laude-institute/t-bench/ubuntu-24-04":
        return BaseRef(
            ref,
            "trixie",
            TBENCH_TOOLS + BUILDPACK_FULL + PYTHON_PACKAGES,
            "Terminal-Bench's ubuntu-24-04 base approximated by Debian trixie with "
            "tmux, asciinema, build tools and python3",
        )
    if name == "ghcr.io/laude-institute/t-bench/python-3-13":
        return BaseRef(
            ref,
            "trixie",
            TBENCH_TOOLS + PYTHON_PACKAGES,
            "Terminal-Bench's python-3-13 base approximated by Debian trixie "
            "(Python 3.13) with tmux and asciinema",
        )
    if name in ("scratch",):
        raise refuse("FROM scratch has no operating system to run tasks in")
    if "/" in name or name in ("alpine", "fedora", "centos", "archlinux", "nvidia/cuda"):
        raise refuse(
            "exists only in a registry (or isn't Debian); sandfleet builds from Debian "
            "and can't pull it -- rebase the task on debian:bookworm or python:3.x"
        )
    raise refuse(
        "unknown base; supported: debian:12/13, python:3.x[-slim][-bookworm|-trixie], "
        "buildpack-deps:bookworm|trixie, ubuntu:22.04/24.04"
    )
