"""Shared fixtures: backends to parametrize over, skipped with the reason where the host lacks them."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

# hypothesis's pytest plugin imports hypothesis at the end of a run if no test did; under
# CPython 3.11.7 that late import (assertion-rewritten, deep in pluggy's stack) can die with
# "AST constructor recursion depth mismatch". Importing it here, early, avoids that.
try:
    import hypothesis  # noqa: F401
except ImportError:  # pragma: no cover
    pass

from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox


def backend_skip(name: str) -> str | None:
    if name == "bwrap":
        if not shutil.which("bwrap"):
            return "bubblewrap not installed (apt-get install bubblewrap)"
        if os.geteuid() != 0:
            return "the bwrap backend needs root"
    if name == "gvisor":
        if not shutil.which("runsc"):
            return "gVisor not installed (apt-get install runsc)"
        if os.geteuid() != 0:
            return "the gvisor backend needs root"
        if os.environ.get("SANDFLEET_TEST_GVISOR") == "0":
            return "gvisor tests turned off (SANDFLEET_TEST_GVISOR=0)"
    if name == "microvm":
        if os.environ.get("SANDFLEET_TEST_MICROVM") == "0":
            return "microvm tests turned off (SANDFLEET_TEST_MICROVM=0)"
        try:
            from sandfleet.doctor import report

            b = report()["backends"]["microvm"]
            if not b["available"]:
                return str(b["reason"])
        except Exception as e:  # pragma: no cover
            return f"microvm unavailable: {e}"
    return None


BACKENDS = ["process", "bwrap", "microvm", "gvisor"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    why = backend_skip(request.param)
    if why:
        pytest.skip(why)
    return str(request.param)


@pytest.fixture(params=["bwrap", "microvm", "gvisor"])
def isolated_backend(request: pytest.FixtureRequest) -> str:
    why = backend_skip(request.param)
    if why:
        pytest.skip(why)
    return str(request.param)


@pytest.fixture
async def sb(backend: str) -> AsyncIterator[Sandbox]:
    box = await create_sandbox(backend=backend, ttl_s=300)
    try:
        yield box
    finally:
        await box.close()


@pytest.fixture
async def isb(isolated_backend: str) -> AsyncIterator[Sandbox]:
    box = await create_sandbox(backend=isolated_backend, ttl_s=300, memory_mib=256, pids=128)
    try:
        yield box
    finally:
        await box.close()


@pytest.fixture(scope="session")
def python_base_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory (``SANDFLEET_CACHE``) for the tests that build task images FROM
    python:3.11-slim-bookworm in a cache away from the user's: its debootstrap base (85-99 s
    each on 2 busy cores, 5 tests, 38 % of a loaded fast pass) is made once per run, not once
    per test. Their images and build directories go in it too; each test's Dockerfile differs."""
    return tmp_path_factory.mktemp("python-base-cache")


@pytest.fixture
def with_python_base_cache(python_base_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """:func:`python_base_cache` as this test's ``SANDFLEET_CACHE``."""
    monkeypatch.setenv("SANDFLEET_CACHE", str(python_base_cache))
    return python_base_cache
