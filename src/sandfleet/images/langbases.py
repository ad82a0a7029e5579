"""The official language images, approximated from Debian's own packages.

``golang``, ``rust``, ``gcc``, ``node``, ``eclipse-temurin`` and ``openjdk`` exist only in a
registry; sandfleet builds a Debian base with the language from the release's packages
instead (``golang-go``, ``rustc`` + ``cargo``, ``build-essential``, ``nodejs`` + ``npm``,
``openjdk-N-jdk``), with the official image's PATH, environment (``GOPATH``, ``CARGO_HOME``,
``JAVA_HOME``, ...) and working directory. Always a substitution (a warning naming the version
asked and the version got; ``--strict-bases`` refuses it).

Which release: the one the tag names when it ships the version asked or a newer one, else
the oldest release that does (a newer toolchain builds what an older one did). A version no
release ships (Go 1.26 where the newest Debian ships 1.24) is refused naming both, unless
``accept_older`` (``--accept-older-versions``) takes the newest there is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sandfleet.errors import ImageBuildError

SHIPS: dict[str, dict[str, str]] = {
    # read from each release's main/binary-amd64/Packages (2026-12): golang-go, rustc, nodejs, gcc
    "golang": {"bullseye": "1.15", "bookworm": "1.19", "trixie": "1.24"},
    "rust": {"bullseye": "1.48", "bookworm": "1.63", "trixie": "1.85"},
    "node": {"bullseye": "12", "bookworm": "18", "trixie": "20"},
    "gcc": {"bullseye": "10", "bookworm": "12", "trixie": "14"},
}
JDKS = {"bullseye": ("11", "17"), "bookworm": ("17",), "trixie": ("21", "25")}
"""The ``openjdk-N-jdk`` packages each release ships."""
LABEL = {"golang": "Go", "rust": "Rust", "node": "Node.js", "gcc": "GCC", "eclipse-temurin": "Java",
         "openjdk": "Java"}
PRECISION = {"golang": 2, "rust": 2, "node": 1, "gcc": 1, "eclipse-temurin": 1, "openjdk": 1}
"""How many parts of a version tell releases apart (Go 1.22, Node.js 20)."""
OS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UBUNTU = {"jammy": "bookworm", "focal": "bookworm", "noble": "trixie"}
"""Ubuntu variants of the Java images (eclipse-temurin is Ubuntu based): the nearest Debian."""
VARIANT_WORDS = {"slim", "jdk", "jre", "bookworm", "trixie", "bullseye", *UBUNTU}


@dataclass(frozen=True)
class Lang:
    """What a language image resolved to, for :class:`sandfleet.images.bases.BaseRef`."""

    suite: str
    packages: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    workdir: str | None
    dirs: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    asked: str
    got: str
    note: str
    kind: str


def _key(version: str, n: int) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:n])


def _choose(name: str, version: str, named: str | None, suites: list[str], accept_older: bool,
            refuse: Callable[[str], ImageBuildError]) -> tuple[str, str]:
    """(suite, version got) for ``name`` at ``version`` ('' = newest)."""
    n = PRECISION[name]
    label = LABEL[name]
    if name in ("eclipse-temurin", "openjdk"):
        offers = [(s, v) for s in suites for v in JDKS[s]]
    else:
        offers = [(s, SHIPS[name][s]) for s in suites]
    if not version:
        pick = next(((s, v) for s, v in offers if s == named), None)
        return pick or max(offers, key=lambda o: _key(o[1], n))
    want = _key(version, n)
    same = [o for o in offers if _key(o[1], n) == want]
    newer = sorted((o for o in offers if _key(o[1], n) > want), key=lambda o: _key(o[1], n))
    for group in (same, newer):
        if group:
            return next((o for o in group if o[0] == named), group[0])
    newest = max(offers, key=lambda o: _key(o[1], n))
    if accept_older:
        return newest
    raise refuse(f"{label} {version} is newer than any Debian release ships (the newest: {label} {newest[1]} in "
                 f"Debian {newest[0]}); --accept-older-versions builds it with {label} {newest[1]}")


def resolve_language(name: str, tag: str, ref: str, *, suites: list[str], accept_older: bool,
                     refuse: Callable[[str], ImageBuildError], buildpack: dict[str, tuple[str, ...]]) -> Lang:
    """The Debian stand-in for ``name:tag``; ``suites``: the releases that can be built here
    (bullseye only where the mirror has it); ``buildpack``: the buildpack-deps package sets."""
    m = re.match(r"^(\d+(?:\.\d+)*)?(?:[._+][\w.]*)?(?:-(.*))?$", tag) if tag != "latest" else None
    version, variant = (m.group(1) or "", m.group(2) or "") if m else ("", tag if tag != "latest" else "")
    if m is None and tag != "latest" and not re.match(r"^[a-z-]+$", tag):
        raise refuse(f"can't read a version from the tag {tag!r}")
    if version and name in ("eclipse-temurin", "openjdk") and version.split(".")[0] in ("1",):
        version = version.split(".")[1] if "." in version else version  # 1.8 is Java 8
    words = variant.split("-") if variant else []
    if any(w in ("alpine", "windowsservercore", "nanoserver", "ubi9", "ubi10") or w.startswith("alpine")
           or w.startswith("windows") for w in words):
        raise refuse("Alpine, UBI and Windows variants are not Debian")
    unknown = [w for w in words if w not in VARIANT_WORDS and not re.match(r"^(ltsc\d+|\d+)$", w)]
    if unknown:
        raise refuse(f"unknown variant {'-'.join(unknown)!r}")
    word = next((w for w in words if w in (*SHIPS["gcc"], *UBUNTU)), None)
    named = UBUNTU.get(word, word) if word else None
    if named == "bullseye" and "bullseye" not in suites:
        named = "bookworm"
    suite, got = _choose(name, version, named, suites, accept_older, refuse)
    label = LABEL[name]
    slim = "slim" in words
    env: list[tuple[str, str]] = []
    dirs: tuple[str, ...] = ()
    links: tuple[tuple[str, str], ...] = ()
    workdir = None
    if name == "golang":
        packages = ("golang-go", *buildpack["scm"])
        env = [("GOLANG_VERSION", got), ("GOTOOLCHAIN", "local"), ("GOPATH", "/go"),
               ("PATH", f"/go/bin:/usr/local/go/bin:{OS_PATH}")]
        dirs, links, workdir = ("/go", "/go/src", "/go/bin"), (("/usr/local/go", "/usr/lib/go"),), "/go"
    elif name == "rust":
        packages = ("rustc", "cargo", *(("ca-certificates", "gcc", "libc6-dev") if slim else buildpack["full"]))
        env = [("RUSTUP_HOME", "/usr/local/rustup"), ("CARGO_HOME", "/usr/local/cargo"),
               ("PATH", f"/usr/local/cargo/bin:{OS_PATH}"), ("RUST_VERSION", got)]
        dirs = ("/usr/local/cargo", "/usr/local/cargo/bin", "/usr/local/rustup")
    elif name == "gcc":
        packages = ("build-essential", *buildpack["full"])
    elif name == "node":
        packages = ("nodejs", "npm", *(() if slim else buildpack["full"]))
        env = [("NODE_VERSION", got)]
    else:  # eclipse-temurin, openjdk
        jdk = f"openjdk-{got}-jdk" + ("-headless" if slim or "jre" in words else "")
        home = "/opt/java/openjdk" if name == "eclipse-temurin" else f"/usr/local/openjdk-{got}"
        extra = ("curl", "wget", "tzdata", "locales") if name == "eclipse-temurin" else buildpack["scm"]
        packages = (jdk, "ca-certificates", *(() if slim else extra))
        env = [("JAVA_HOME", home), ("PATH", f"{home}/bin:{OS_PATH}"), ("JAVA_VERSION", got)]
        links = ((home, f"/usr/lib/jvm/java-{got}-openjdk-{{arch}}"),)
    package = {"golang": "golang-go", "rust": "rustc + cargo", "gcc": "build-essential", "node": "nodejs + npm"}
    what = package.get(name) or f"openjdk-{got}-jdk"
    asked = f"{label} {version}" if version else f"{label} (latest)"
    note = (f"{ref}: the official {name} image is approximated by Debian {suite}'s {what}: "
            f"asked {asked}, got {label} {got}")
    if version and _key(got, PRECISION[name]) < _key(version, PRECISION[name]):
        note += ", an older version than asked (--accept-older-versions)"
    if word and named != suite or word in UBUNTU:
        note += f"; Debian {suite} stands in for the {word} variant"
    return Lang(suite, tuple(dict.fromkeys(packages)), tuple(env), workdir, dirs, links, asked, f"{label} {got}",
                note, f"{name} -> Debian {suite} {what}")
