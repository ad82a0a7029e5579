"""Mapping a FROM reference to a Debian release plus what the named image would have had.

sandfleet builds images from Debian (debootstrap), so a base is only buildable when it is a
Debian image or close to one. Every mapping is either **exact** or a **substitution**; a
substitution carries a warning (``BaseRef.note``), is recorded in the image and in the
validation report, and ``strict=True`` (``--strict-bases``) refuses it instead. Never silent.

- ``debian:12|13|bookworm|trixie[-slim]``: exact.
- ``python:X[.Y][-slim][-bookworm|-trixie]``: the Debian release that ships Python X (3.11:
  bookworm, 3.13: trixie) with official-image semantics: ``python``, ``python3`` and ``pip`` on
  PATH, no ``EXTERNALLY-MANAGED`` marker, so ``pip install`` works as in the official image.
  A version no Debian ships (3.12) takes the next newer one that is shipped (3.13), a
  substitution; so does a variant naming a release that does not ship X.
- ``buildpack-deps:bookworm|trixie[-curl|-scm]``: exact (its package set).
- ``ubuntu:22.04|24.04``: the nearest Debian release, a substitution.
- Terminal-Bench-1's two public bases: Debian trixie with their tools, a substitution.

Anything else exists only in a registry and raises :class:`ImageBuildError` naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandfleet.errors import ImageBuildError

SUITES = {"bookworm": "12", "trixie": "13"}
PYTHON_OF = {"bookworm": "3.11", "trixie": "3.13"}
"""The ``python3`` each supported Debian release ships."""
PYTHON_PACKAGES = ("python3", "python3-pip", "python3-venv", "python3-dev", "python-is-python3",
                   "ca-certificates", "netbase", "tzdata")
"""What the official ``python:X-slim`` image has (its Python, pip, venv, headers, CA
certificates, netbase, tzdata), from Debian's packages."""
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
    """What differs from the named image, when something does (a substitution's warning)."""
    substituted: bool = False
    """The named image is not available as such and something close stands in for it
    (``note`` says what); ``--strict-bases`` refuses it."""
    python: str | None = None
    """``X.Y`` of the ``python`` the image provides (``python:X`` bases), else None."""
    flavour: str | None = None
    """``python``: the base gets the official python image's semantics (no
    ``EXTERNALLY-MANAGED`` marker, ``python`` on PATH); None: plain Debian."""

    def describe(self) -> str:
        """One line: what the FROM became, e.g. ``python:3.12-slim -> debian trixie (python 3.13)``."""
        what = f"{self.image} -> debian {self.suite}"
        return what + (f" (python {self.python})" if self.python else "")


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


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _python(ref: str, tag: str, refuse: _Refuse) -> BaseRef:
    match = re.match(r"^(3(?:\.\d+)?)(?:\.\d+)?(?:-(.*))?$", tag)
    if tag in ("latest", "slim") or re.match(r"^(slim-)?(bookworm|trixie)$", tag):
        match = re.match(r"^()(.*)$", tag)  # no version: the newest Python 3
    if not match:
        raise refuse("name a Python 3 version, e.g. python:3.11-slim-bookworm")
    version, variant = match.group(1), match.group(2) or ""
    variant = "" if variant == "latest" else variant
    if "alpine" in variant or "windows" in variant:
        raise refuse("Alpine and Windows variants are not Debian")
    words = variant.split("-") if variant else []
    named = next((w for w in words if w in SUITES), None)
    if any(w in ("bullseye", "buster", "stretch", "sid", "forky") for w in words):
        raise refuse("only the bookworm and trixie variants are supported (Debian 12 and 13)")
    unknown = [w for w in words if w not in (*SUITES, "slim")]
    if unknown:
        raise refuse(f"unknown variant {'-'.join(unknown)!r}; supported: [-slim][-bookworm|-trixie]")
    shipped = {v: s for s, v in PYTHON_OF.items()}
    note = None
    if version in ("", "3"):
        suite = named or "trixie"
        python = PYTHON_OF[suite]
        note = (f"{ref} names whatever Python 3 is newest; Debian {suite} ships Python {python}, "
                "which stands in for it")
    elif version in shipped:
        suite, python = shipped[version], version
        if named and named != suite:
            note = (f"Debian {named} does not ship Python {version}; Debian {suite}, which does, "
                    f"stands in for {ref}")
    else:
        newer = sorted((v for v in shipped if _version(v) > _version(version)), key=_version)
        if not newer:
            have = ", ".join(f"{v} ({s})" for v, s in sorted(shipped.items()))
            raise refuse(f"no Debian release ships Python {version} or newer (supported: {have})")
        python = newer[0]
        suite = shipped[python]
        note = (f"Python {version} is shipped by no Debian release: Python {python} "
                f"(Debian {suite}) stands in for it")
        if named and named != suite:
            note += f", and Debian {suite} for the {named} variant"
    slim = "slim" in words
    packages = PYTHON_PACKAGES + (() if slim else BUILDPACK_FULL)
    return BaseRef(ref, suite, packages, note, note is not None, python, "python")


class _Refuse:
    def __init__(self, ref: str, file: str | None, line: int | None):
        self.ref, self.file, self.line = ref, file, line

    def __call__(self, why: str) -> ImageBuildError:
        return ImageBuildError(f"base image {self.ref!r}: {why}", file=self.file, line=self.line)


def resolve_base(ref: str, *, strict: bool = False, file: str | None = None, line: int | None = None) -> BaseRef:
    """Map ``ref`` to a :class:`BaseRef`, or raise :class:`ImageBuildError` saying why not.
    ``strict``: a substitution (``BaseRef.substituted``) is refused instead of warned about."""
    refuse = _Refuse(ref, file, line)
    base = _resolve(ref, refuse)
    if strict and base.substituted:
        raise refuse(f"{base.note}; refused by --strict-bases (drop it to accept the substitution)")
    return base


def _resolve(ref: str, refuse: _Refuse) -> BaseRef:
    name, tag = _split(ref)
    if name == "debian":
        suite = _suite_of(tag, "") if tag not in ("latest", "stable", "stable-slim") else None
        if not suite:
            raise refuse("only Debian 12 (bookworm) and 13 (trixie) are supported; name one")
        return BaseRef(ref, suite)
    if name == "python":
        return _python(ref, tag, refuse)
    if name == "buildpack-deps":
        suite = _suite_of(tag, "bookworm")
        if suite is None:
            raise refuse("only bookworm and trixie are supported")
        packages: tuple[str, ...] = BUILDPACK_FULL
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
        return BaseRef(ref, suite, ("ca-certificates",),
                       f"Ubuntu {tag} approximated by Debian {suite}, the nearest Debian release", True)
    if name == "ghcr.io/laude-institute/t-bench/ubuntu-24-04":
        return BaseRef(
            ref,
            "trixie",
            TBENCH_TOOLS + BUILDPACK_FULL + PYTHON_PACKAGES,
            "Terminal-Bench's ubuntu-24-04 base approximated by Debian trixie with "
            "tmux, asciinema, build tools and python3",
            True,
            PYTHON_OF["trixie"],
            "python",
        )
    if name == "ghcr.io/laude-institute/t-bench/python-3-13":
        return BaseRef(
            ref,
            "trixie",
            TBENCH_TOOLS + PYTHON_PACKAGES,
            "Terminal-Bench's python-3-13 base approximated by Debian trixie "
            "(Python 3.13) with tmux and asciinema",
            True,
            PYTHON_OF["trixie"],
            "python",
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
