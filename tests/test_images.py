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


def test_resolve_image_reuses_its_answer_only_while_the_cache_is_unchanged(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """resolve_image skips reading every image.json while nothing it relied on changed, and
    sees each kind of change at once: a newer build, a renewed one, a removed layer or image."""
    import shutil

    from sandfleet.imagestore import resolve_image, save_image

    monkeypatch.setenv("SANDFLEET_CACHE", str(tmp_path / "cache"))
    d = images_dir()

    def image(digest: str, name: str = "img") -> Image:
        (d / digest / "layer").mkdir(parents=True)
        img = Image(name=name, lowers=[d / digest / "layer", Path("/")], arch="amd64", page_size=4096,
                    hash=digest, base="host")
        save_image(img)
        return img

    def settle(*paths: Path) -> None:  # as if written long ago: an answer over them is reused
        old = time.time_ns() - 3_600 * 10**9
        for p in paths:
            os.utime(p, ns=(old, old))

    def age(digest: str, seconds: int) -> None:
        t = time.time_ns() - seconds * 10**9
        os.utime(d / digest / "image.json", ns=(t, t))

    image("aaaa1111")
    image("bbbb2222")
    image("cccc3333", name="other")
    age("aaaa1111", 7200)
    age("bbbb2222", 5400)
    settle(d)
    assert resolve_image("img").hash == "bbbb2222"  # the newest of its name
    assert resolve_image("aaaa").hash == "aaaa1111"  # a hash prefix
    # reused: a matching image.json rewritten behind its back (same mtime) is not read again
    meta = d / "bbbb2222" / "image.json"
    st = meta.stat()
    meta.write_text("not json")
    os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert resolve_image("img").hash == "bbbb2222"
    save_image(Image(name="img", lowers=[d / "bbbb2222" / "layer", Path("/")], arch="amd64", page_size=4096,
                     hash="bbbb2222", base="host"))
    age("bbbb2222", 5400)
    settle(d)
    # an older one renewed in place (os.utime of its image.json, as the E2B base does)
    os.utime(d / "aaaa1111" / "image.json")
    assert resolve_image("img").hash == "aaaa1111"
    age("aaaa1111", 7200)
    settle(d)
    assert resolve_image("img").hash == "bbbb2222"
    # the newest's layer removed: it is no image any more
    shutil.rmtree(d / "bbbb2222" / "layer")
    assert resolve_image("img").hash == "aaaa1111"
    # a new build of the name (save_image touches the directory)
    image("dddd4444")
    assert resolve_image("img").hash == "dddd4444"
    settle(d, d / "dddd4444" / "image.json")
    assert resolve_image("img").hash == "dddd4444"
    # an image removed whole
    shutil.rmtree(d / "dddd4444")
    assert resolve_image("img").hash == "aaaa1111"
    shutil.rmtree(d / "aaaa1111")
    with pytest.raises(Exception, match=r"^unknown image 'img' \(sandfleet image build makes one\)\n"
                                        r"known images: host, other$"):
        resolve_image("img")
