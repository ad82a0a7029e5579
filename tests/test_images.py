"""Images: task images as a layer over a base, cached by content hash; debootstrap bases (slow)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from sandfleet.errors import ImageBuildError
from sandfleet.imagestore import Image, images_dir, list_images
from sandfleet.sandbox import create_sandbox
from sandfleet.tasks import load_task
from sandfleet.tasks.images import build_task_image
from support import dockerfile_task

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="image builds run steps in bwrap as root")


@pytest.fixture(scope="session")
def python_base() -> Image:
    """The Debian base of ``python:3.11-slim`` in the real cache (built once, minutes)."""
    from sandfleet.images.bases import resolve_base
    from sandfleet.images.debootstrap import base_image_for, why_no_build

    why = why_no_build()
    if why:
        pytest.skip(f"no Debian base can be built here: {why}")
    return base_image_for(resolve_base("python:3.11-slim"))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private image cache that shares the real cache's Debian bases (linked, read-only use)."""
    real = images_dir()
    monkeypatch.setenv("SANDFLEET_CACHE", str(tmp_path / "cache"))
    mine = images_dir()
    for meta in real.glob("*/image.json"):
        if json.loads(meta.read_text()).get("meta", {}).get("kind") == "debian-base":
            (mine / meta.parent.name).symlink_to(meta.parent)
    return tmp_path / "cache"


@needs_root
async def test_task_image_layers_cache_and_runs(tmp_path: Path, python_base: Image, cache: Path) -> None:
    task = dockerfile_task(tmp_path, (
        "FROM python:3.11-slim-bookworm\nARG GREETING=hi\nWORKDIR /app\nCOPY app/ /app/\n"
        "ENV MODE=test\nRUN echo $GREETING > made.txt && rm -f remove-me.txt && mkdir -p /tool\n"
        "COPY --chown=1000:1000 data/ /data/\n"
    ), {"app/keep.txt": "kept\n", "app/remove-me.txt": "gone\n", "data/d.txt": "d\n"})
    t0 = time.monotonic()
    img = build_task_image(load_task(task))
    cold = time.monotonic() - t0
    t0 = time.monotonic()
    again = build_task_image(load_task(task))
    assert again.hash == img.hash and time.monotonic() - t0 < cold
    assert any(i.hash == img.hash for i in list_images())
    sb = await create_sandbox(image=img.hash, workdir="/app")
    try:
        r = await sb.exec("cat keep.txt made.txt; ls; test -d /tool && echo tool; touch new && echo w;"
                          " echo more >> /data/d.txt && echo chowned-to-the-sandbox-user")
        assert r.stdout.splitlines() == ["kept", "hi", "keep.txt", "made.txt", "tool", "w",
                                         "chowned-to-the-sandbox-user"]
    finally:
        await sb.close()
    (task / "environment" / "app" / "keep.txt").write_text("changed\n")
    assert build_task_image(load_task(task)).hash != img.hash  # content is part of the hash


@needs_root
def test_failing_run_names_the_line(tmp_path: Path, python_base: Image, cache: Path) -> None:
    task = dockerfile_task(tmp_path, "FROM python:3.11-slim\nWORKDIR /app\n\nRUN echo building && false\n")
    with pytest.raises(ImageBuildError, match=r"Dockerfile:4: RUN exited with 1"):
        build_task_image(load_task(task))


def test_registry_only_base_is_refused(tmp_path: Path, cache: Path) -> None:
    task = dockerfile_task(tmp_path, "FROM ghcr.io/someone/private-image:3\nRUN true\n")
    with pytest.raises(Exception, match=r"Dockerfile:1"):
        build_task_image(load_task(task))


@pytest.mark.slow
@needs_root
async def test_debootstrap_base_and_a_task_over_it(tmp_path: Path, cache: Path) -> None:
    from sandfleet.images.debootstrap import build_base

    base = build_base("bookworm", ("python3",))
    assert base.meta["kind"] == "debian-base" and (base.root / "usr/bin/python3").exists()
    sb = await create_sandbox(image=base.name)
    try:
        r = await sb.exec("cat /etc/debian_version; python3 -c 'print(6*7)'")
        assert r.stdout.splitlines()[1] == "42"
    finally:
        await sb.close()
    task = dockerfile_task(tmp_path, "FROM debian:bookworm-slim\nWORKDIR /app\nRUN echo ok > built.txt\n")
    img = build_task_image(load_task(task))
    assert img.base == base.name
    assert img.meta["layer_bytes"] < 1 << 20  # a thin layer: the base is shared
