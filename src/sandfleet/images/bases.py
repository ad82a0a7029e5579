"""Mapping a FROM reference to a Debian release plus what the named image would have had.

sandfleet builds images from Debian (debootstrap), so a base is only buildable when it is a
Debian image or close to one. Every mapping is either **exact** or a **substitution**; a
substitution carries a warning (``BaseRef.note``), is recorded in the image and in the
validation report, and ``strict=True`` (``--strict-bases``) refuses it instead. Never silent.

- A reference is an image name whatever registry host or mirror prefix stands before it:
  ``docker.io/library/debian``, ``public.ecr.aws/docker/library/debian``, ``mirror.gcr.io/debian``
  or ``<any host>/library/debian`` resolve like ``debian``. A digest pin (``@sha256:...``) can't
  be honoured without the registry: a substitution that says so.
- ``debian:12|13|bookworm|trixie[-slim]`` and point tags (``debian:12.7``): exact.
  ``debian:11|bullseye``: exact where debootstrap can reach bullseye from the configured mirror
  (:func:`sandfleet.images.debootstrap.suite_available`), else bookworm, a substitution.
- ``python:X[.Y[.Z]][-slim][-bookworm|-trixie]``: the Debian release that ships Python X (3.11:
  bookworm, 3.13: trixie) with official-image semantics: ``python``, ``python3`` and ``pip`` on
  PATH, no ``EXTERNALLY-MANAGED`` marker, so ``pip install`` works as in the official image.
  A version no Debian ships (3.12) takes the next newer one that is shipped (3.13), a
  substitution; so does a variant naming a release that does not ship X.
- ``buildpack-deps:bookworm|trixie[-curl|-scm]``: exact (its package set);
  ``buildpack-deps:jammy|focal|noble``: the nearest Debian release's set, a substitution.
- ``golang``, ``rust``, ``gcc``, ``node``, ``eclipse-temurin``, ``openjdk``: Debian's packages
  of the language, a substitution (:mod:`sandfleet.images.langbases`).
- ``ubuntu:22.04|24.04``: the nearest Debian release, a substitution.
- Terminal-Bench-1's two public bases: Debian trixie with their tools, a substitution.

Anything else exists only in a registry and raises :class:`ImageBuildError` naming it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

from sandfleet.errors import ImageBuildError

SUITES = {"bookworm": "12", "trixie": "13"}
OLD_SUITES = {"bullseye": "11"}
"""Built only where debootstrap can reach them from the configured mirror, else bookworm."""
MIRRORS = ("docker.io/library/", "index.docker.io/library/", "registry-1.docker.io/library/",
           "registry.hub.docker.com/library/", "public.ecr.aws/docker/library/", "mirror.gcr.io/library/",
           "mirror.gcr.io/", "docker.io/", "index.docker.io/", "library/", "amd64/", "arm64v8/")
"""Prefixes under which published tasks name the official images (an unknown registry host
before ``library/`` or before a bare name counts as one too)."""
LANGUAGES = ("golang", "rust", "gcc", "node", "eclipse-temurin", "openjdk")
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
    env: tuple[tuple[str, str], ...] = ()
    """The named image's environment (``GOPATH``, ``CARGO_HOME``, ``JAVA_HOME``, its PATH)."""
    workdir: str | None = None
    """The named image's working directory (``/go``), where the Dockerfile sets none."""
    dirs: tuple[str, ...] = ()
    """Directories the named image has (world-writable, as ``$GOPATH`` is there)."""
    links: tuple[tuple[str, str], ...] = ()
    """Symlinks (path, target; ``{arch}`` is Debian's architecture) to where Debian's packages
    put what the named image has elsewhere (``/opt/java/openjdk``)."""
    asked: str | None = None
    """The language version the task asked for (``Go 1.22``); None for plain Debian bases."""
    got: str | None = None
    """The language version it gets (``Go 1.24``)."""
    kind: str = "exact"
    """The coverage group: ``exact``, or the substitution (``golang -> Debian trixie golang-go``)."""

    def describe(self) -> str:
        """One line: what the FROM became, e.g. ``python:3.12-slim -> debian trixie (python 3.13)``."""
        what = f"{self.image} -> debian {self.suite}"
        if self.got:
            return what + f" ({self.got})"
        return what + (f" (python {self.python})" if self.python else "")


def split_ref(ref: str) -> tuple[str, str, str | None]:
    """(name, tag, digest) of an image reference, the name without a mirror prefix of the
    official images: ``public.ecr.aws/docker/library/debian:bookworm@sha256:..`` is
    ``("debian", "bookworm", "sha256:..")``."""
    ref, _, digest = ref.strip().partition("@")
    name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
    name = name.lower()
    for prefix in MIRRORS:
        if name.startswith(prefix) and "/" not in name[len(prefix):]:
            return name[len(prefix):], tag or "latest", digest or None
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):  # a registry host
        for inner in ("library/", "docker/library/", ""):
            if rest.startswith(inner) and "/" not in rest[len(inner):]:
                return rest[len(inner):], tag or "latest", digest or None
    return name, tag or "latest", digest or None


def _suite_of(tag: str, default: str) -> str | None:
    for suite, version in {**SUITES, **OLD_SUITES}.items():
        if suite in tag.split("-") or tag.split("-")[0].split(".")[0] == version:
            return suite
    if any(old in tag for old in ("buster", "stretch", "sid", "forky")):
        return None
    return default


def _reachable(suite: str) -> bool:
    from sandfleet.images.debootstrap import suite_available

    return suite_available(suite)


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
    asked = f"python:{version or 'latest'}" + (f"-{named}" if named else "")
    kind = "exact" if note is None else f"{asked} -> python {python} (Debian {suite})"
    return BaseRef(ref, suite, packages, note, note is not None, python, "python", kind=kind)


class _Refuse:
    def __init__(self, ref: str, file: str | None, line: int | None):
        self.ref, self.file, self.line = ref, file, line

    def __call__(self, why: str, reason: str | None = None) -> ImageBuildError:
        error = ImageBuildError(f"base image {self.ref!r}: {why}", file=self.file, line=self.line)
        # the coverage group (tasks/coverage.py): the reason without its details
        error.reason = reason or re.split(r" \(|;|: | -- ", why)[0]
        return error


def resolve_base(ref: str, *, strict: bool = False, accept_older: bool = False, file: str | None = None,
                 line: int | None = None, reachable: Callable[[str], bool] | None = None) -> BaseRef:
    """Map ``ref`` to a :class:`BaseRef`, or raise :class:`ImageBuildError` saying why not.
    ``strict``: a substitution (``BaseRef.substituted``) is refused instead of warned about.
    ``accept_older``: a language image asking for a version newer than any Debian release
    ships gets the newest there is (a substitution) instead of being refused.
    ``reachable(suite)``: whether a suite beyond bookworm and trixie (bullseye) can be built
    here (default: :func:`sandfleet.images.debootstrap.suite_available`)."""
    refuse = _Refuse(ref, file, line)
    base = _resolve(ref, refuse, accept_older, reachable or _reachable)
    _, _, digest = split_ref(ref)
    if digest:
        pin = (f"the digest pin @{digest[:19]}... can't be honoured without the registry: the image is built "
               "from Debian's packages, not those bytes")
        base = dataclasses.replace(base, note=f"{base.note}; {pin}" if base.note else pin, substituted=True,
                                   kind=base.kind if base.kind != "exact" else "digest pin not honoured")
    if strict and base.substituted:
        raise refuse(f"{base.note}; refused by --strict-bases (drop it to accept the substitution)",
                     f"refused by --strict-bases: {base.kind}")
    return base


def _resolve(ref: str, refuse: _Refuse, accept_older: bool, reachable: Callable[[str], bool]) -> BaseRef:
    name, tag, _ = split_ref(ref)
    if name == "debian":
        suite = _suite_of(tag, "") if tag not in ("latest", "stable", "stable-slim") else None
        if not suite:
            raise refuse("only Debian 12 (bookworm), 13 (trixie) and 11 (bullseye) are supported; name one")
        if suite in OLD_SUITES and not reachable(suite):
            return BaseRef(ref, "bookworm", (), f"Debian {suite} can't be bootstrapped from the configured mirror: "
                           "Debian bookworm stands in for it", True, kind=f"debian {suite} -> bookworm")
        return BaseRef(ref, suite)
    if name in LANGUAGES:
        from sandfleet.images.langbases import resolve_language

        suites = [*(s for s in OLD_SUITES if reachable(s) and s in tag), *SUITES]
        lang = resolve_language(name, tag, ref, suites=suites, accept_older=accept_older, refuse=refuse,
                                buildpack={"curl": BUILDPACK_CURL, "scm": BUILDPACK_SCM, "full": BUILDPACK_FULL})
        return BaseRef(ref, lang.suite, lang.packages, lang.note, True, env=lang.env, workdir=lang.workdir,
                       dirs=lang.dirs, links=lang.links, asked=lang.asked, got=lang.got, kind=lang.kind)
    if name == "python":
        return _python(ref, tag, refuse)
    if name == "buildpack-deps":
        packages: tuple[str, ...] = BUILDPACK_FULL
        if tag.endswith("-curl"):
            packages = BUILDPACK_CURL
        elif tag.endswith("-scm"):
            packages = BUILDPACK_SCM
        like = {"jammy": "bookworm", "focal": "bookworm", "noble": "trixie"}.get(tag.split("-")[0])
        if like:
            return BaseRef(ref, like, packages, f"buildpack-deps:{tag} is Ubuntu's: Debian {like}'s "
                           "packages of the same set stand in for it", True,
                           kind=f"buildpack-deps:{tag.split('-')[0]} -> Debian {like}")
        suite = _suite_of(tag, "bookworm")
        if suite is None or (suite in OLD_SUITES and not reachable(suite)):
            raise refuse("only bookworm and trixie (and bullseye where the mirror has it) are supported")
        return BaseRef(ref, suite, packages)
    if name == "ubuntu":
        ubuntu = {"22.04": "bookworm", "jammy": "bookworm", "24.04": "trixie", "noble": "trixie"}
        suite = ubuntu.get(tag.split("-")[0])
        if suite is None:
            raise refuse("only ubuntu:22.04 and ubuntu:24.04 are approximated")
        return BaseRef(ref, suite, ("ca-certificates",),
                       f"Ubuntu {tag} approximated by Debian {suite}, the nearest Debian release", True,
                       kind=f"ubuntu:{tag.split('-')[0]} -> Debian {suite}")
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
            kind="t-bench/ubuntu-24-04 -> Debian trixie",
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
            kind="t-bench/python-3-13 -> Debian trixie",
        )
    if name in ("scratch",):
        raise refuse("FROM scratch has no operating system to run tasks in")
    if "/" in name or name in ("alpine", "fedora", "centos", "archlinux", "nvidia/cuda"):
        raise refuse(
            "exists only in a registry (or isn't Debian); sandfleet builds from Debian "
            "and can't pull it -- rebase the task on debian:bookworm or python:3.x"
        )
    raise refuse(
        "unknown base; supported: debian:11/12/13, python:3.x[-slim][-bookworm|-trixie], "
        "buildpack-deps:bookworm|trixie|jammy, ubuntu:22.04/24.04, golang, rust, gcc, node, eclipse-temurin, "
        "openjdk"
    )
