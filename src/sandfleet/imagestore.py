"""The image store: environment images on disk (a root filesystem of layers over a base, plus
metadata), found by name or hash. The sandbox backends read it; the builder
(:mod:`sandfleet.images`) writes it.

- ``host``: this host's own ``/``, read-only (the embedded default, nothing to build);
- built images live under ``<cache>/images/<hash>/`` with ``image.json`` and their layer;
  a task image is a thin layer over a shared base, so a hundred tasks don't cost a
  hundred root filesystems.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandfleet.agent.build import cache_dir
from sandfleet.errors import ConfigError
from sandfleet.settings import current as current_settings

log = logging.getLogger(__name__)

__all__ = ["Image", "host_image", "images_dir", "list_images", "resolve_image", "save_image"]


@dataclass(frozen=True)
class Image:
    """An image: its name, root layers (top first, then the base), and what it's built for."""

    name: str
    lowers: list[Path]
    arch: str
    page_size: int
    hash: str
    is_host: bool = False
    base: str | None = None
    meta: dict[str, object] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.lowers[-1]

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["lowers"] = [str(p) for p in self.lowers]
        return d


def arch() -> str:
    """Debian's name of the architecture images are built and run for: this machine's, or the
    one ``--arch`` chose (``$SANDFLEET_ARCH``, run under emulation: sandfleet/images/emulation.py)."""
    return current_settings().arch or host_arch()


def host_arch() -> str:
    """Debian's name for this machine's own architecture."""
    m = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "armhf"}.get(m, m)


@functools.cache
def host_image() -> Image:
    osr = ""
    try:
        osr = Path("/etc/os-release").read_text()
    except OSError:
        pass
    # Keyed by what is installed too: a package upgrade changes the package databases, and
    # so the hash of every task image layered over this host.
    installed = []
    for db in ("/var/lib/dpkg/status", "/var/lib/rpm/rpmdb.sqlite", "/var/lib/rpm/Packages", "/lib/apk/db/installed"):
        try:
            st = Path(db).stat()
        except OSError:
            continue
        installed.append(f"{db}:{st.st_size}:{st.st_mtime_ns}")
    key = f"host:{os.uname().nodename}:{osr}:{':'.join(installed)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Image(name="host", lowers=[Path("/")], arch=host_arch(), page_size=os.sysconf("SC_PAGE_SIZE"),
                 hash=digest, is_host=True, base="host")


def images_dir() -> Path:
    d = cache_dir() / "images"
    d.mkdir(parents=True, exist_ok=True)
    return d


def save_image(image: Image) -> None:
    """Record an image's metadata in the cache (its layers are already in place)."""
    d = images_dir() / image.hash
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "image.json.tmp"
    tmp.write_text(json.dumps(image.to_json(), indent=2))
    tmp.replace(d / "image.json")
    os.utime(images_dir())  # (resolve_image reuses an answer while the directory is untouched)


def _load(path: Path) -> Image | None:
    """An image's metadata; None (with a warning naming the file and what is wrong) when
    it is unreadable or malformed, so one broken cache entry never breaks the others."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(d, dict):
            raise TypeError(f"a JSON {type(d).__name__}, not an object")
        meta = d.get("meta") or {}
        if not isinstance(meta, dict) or not isinstance(d["lowers"], list):
            raise TypeError("'meta' must be an object and 'lowers' a list")
        return Image(name=str(d["name"]), lowers=[Path(str(p)) for p in d["lowers"]], arch=str(d["arch"]),
                     page_size=int(d["page_size"]), hash=str(d["hash"]), is_host=False, base=d.get("base"),
                     meta=meta)
    except (OSError, ValueError, TypeError, KeyError) as e:
        what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        log.warning("ignoring a malformed image in the cache: %s: %s", path, what)
        return None


def list_images() -> list[Image]:
    """The host image and every built image in the cache."""
    found = [host_image()]
    for p in sorted(images_dir().glob("*/image.json")):
        img = _load(p)
        if img is not None and all(layer.exists() for layer in img.lowers):
            found.append(img)
    return found


def resolve_image(name: str) -> Image:
    """Find an image by name or hash (prefix); ConfigError naming what exists otherwise.

    The answer is reused while the cache directory and each matching ``image.json`` keep
    their modification times and the answer's layers exist (on a host with 79 built images,
    reading all of them took 5.2 ms of every sandbox's start, measured under load): an image built,
    copied in or removed changes the directory (:func:`save_image` touches it too), and one
    renewed in place (``os.utime``, as the E2B base does) changes its ``image.json``."""
    if name == "host":
        return host_image()
    d = images_dir()
    key = (str(d), name)
    hit = _resolved.get(key)
    if hit is not None and _stamp(d, hit[1]) == hit[0]:
        return hit[1][0]
    matches = [i for i in list_images()[1:] if i.name == name or i.hash.startswith(name)]
    if not matches:
        known = textwrap.fill(", ".join(sorted({i.name for i in list_images()})), width=100,
                              initial_indent="known images: ", subsequent_indent="  ")
        raise ConfigError(f"unknown image {name!r} (sandfleet image build makes one)\n{known}")
    matches.sort(key=_built_at, reverse=True)  # the newest build first, whatever its hash
    stamp = _stamp(d, matches)
    if stamp[0] is not None and time.time_ns() - max(t or 0 for t in stamp) > SETTLED_S * 1e9:
        _resolved[key] = (stamp, matches)
    return matches[0]


SETTLED_S = 1.0
"""How old the modification times :func:`resolve_image` relies on must be before its answer is
reused (file systems stamp them with a coarse clock: a change within the same tick as the
scan would leave the stamp as it was)."""
_resolved: dict[tuple[str, str], tuple[tuple[int | None, ...], list[Image]]] = {}


def _stamp(d: Path, images: list[Image]) -> tuple[int | None, ...]:
    """The modification times of the cache directory and of each image's ``image.json``, None
    for one that is gone or whose layers are not all there."""
    def mtime(p: Path) -> int | None:
        try:
            return p.stat().st_mtime_ns
        except OSError:
            return None

    return (mtime(d), *(mtime(d / i.hash / "image.json") if all(p.exists() for p in i.lowers) else None
                        for i in images))


def _built_at(image: Image) -> float:
    try:
        return (images_dir() / image.hash / "image.json").stat().st_mtime
    except OSError:
        return 0.0
