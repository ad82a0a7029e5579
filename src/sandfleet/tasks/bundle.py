"""Task folders shipped to other hosts by content hash (Ray nodes, sandbox services).

A task is a folder on the driver's host (its tests, solution, Dockerfile). A Ray node, or a
``sandfleet serve`` that builds the task's image, gets it once, as a tar of the folder named
by the SHA-256 of its contents (paths, modes, bytes, link targets), unpacks it under its
cache (``cluster/tasks/<hash>``, ``service/tasks/<hash>``; checked against the hash,
renamed into place, so a half-written one is never used) and loads the same
:class:`~sandfleet.tasks.model.Task` with every host path moved there. The same folder on
two runs is one upload; a changed file is a new hash.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfleet.errors import ConfigError
from sandfleet.tasks.model import Task

MAX_BYTES = 256 << 20
"""A task folder larger than this (packed) is refused: ship data with the image instead."""


@dataclass(frozen=True)
class Bundle:
    """A task folder packed: its content hash and the tar's bytes."""

    digest: str
    data: bytes


def _entries(folder: Path) -> list[Path]:
    out = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(dirs + files):
            out.append(Path(root) / name)
    return out


def content_hash(folder: Path) -> str:
    """SHA-256 of a folder's tree: relative paths, kinds, permission bits, bytes, link targets."""
    h = hashlib.sha256()
    for p in _entries(folder):
        st = p.lstat()
        rel = p.relative_to(folder).as_posix()
        h.update(f"{rel}\0{stat.S_IFMT(st.st_mode)}\0{stat.S_IMODE(st.st_mode) & 0o755}\0".encode())
        if stat.S_ISLNK(st.st_mode):
            h.update(str(p.readlink()).encode())
        elif stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        h.update(b"\1")
    return h.hexdigest()


def pack(task: Task) -> Bundle:
    """The task's folder as a bundle (every host path the task names must lie inside it)."""
    folder = task.path
    outside = [str(p) for p in host_paths(task) if not p.is_relative_to(folder)]
    if outside:
        raise ConfigError(f"task {task.name}: {', '.join(outside)} lie outside its folder {folder}, "
                          "so they can't be shipped to another node")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in _entries(folder):
            tar.add(p, arcname=p.relative_to(folder).as_posix(), recursive=False)
    data = buf.getvalue()
    if len(data) > MAX_BYTES:
        raise ConfigError(f"task {task.name}: its folder packs to {len(data) >> 20} MiB, over the "
                          f"{MAX_BYTES >> 20} MiB a task may ship")
    return Bundle(content_hash(folder), data)


def unpack(bundle_digest: str, data: bytes, root: Path) -> Path:
    """``root/<digest>``, made from ``data`` unless already there; the unpacked tree must hash
    to the digest. Concurrent callers race harmlessly (one rename wins)."""
    final = root / bundle_digest
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{bundle_digest[:12]}-", dir=root))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(tmp, filter="tar")
        got = content_hash(tmp)
        if got != bundle_digest:
            raise ConfigError(f"task bundle {bundle_digest[:12]} unpacked to content {got[:12]}: corrupt in transit")
        try:
            tmp.rename(final)
        except OSError:  # another caller put it there first
            if not final.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def host_paths(task: Task) -> list[Path]:
    """Every host path a task names."""
    out: list[Path] = []

    def walk(value: Any) -> None:
        if isinstance(value, Path):
            out.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)

    walk(task.model_dump())
    return out


def relocate(task: Task, folder: Path) -> Task:
    """The same task with every host path under its folder moved under ``folder``."""
    old = task.path

    def move(value: Any) -> Any:
        if isinstance(value, Path):
            return folder / value.relative_to(old) if value.is_relative_to(old) else value
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(move(v) for v in value)
        return value

    return Task.model_validate(move(task.model_dump()))
