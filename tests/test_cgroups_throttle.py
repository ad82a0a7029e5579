"""throttled_parent holds per context, never in the process environment (issue 13, house)."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path

import pytest

from sandfleet.sandbox import cgroups, create_sandbox

KEYS = ("SANDFLEET_CGROUP_PARENT", "SANDFLEET_CPU_FRACTION")


def _need_cpu_controller() -> None:
    lay = cgroups.detect()
    if not lay.usable or "cpu" not in lay.mounts:
        pytest.skip("needs a writable cgroup cpu controller (root)")


def test_throttle_is_per_context_and_leaves_environ_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    _need_cpu_controller()
    for k in KEYS:
        monkeypatch.delenv(k, raising=False)
    seen: dict[str, tuple[str, float]] = {}

    def look(key: str) -> None:
        seen[key] = (cgroups.group(), cgroups.cpu_fraction())

    with cgroups.throttled_parent(0.5, threads=1) as top:
        assert {k: os.environ.get(k) for k in KEYS} == dict.fromkeys(KEYS)  # the process env is untouched
        look("here")
        other = threading.Thread(target=look, args=("thread",))  # a plain thread: its own, empty context
        other.start()
        other.join()

        async def inside() -> None:
            await asyncio.to_thread(look, "to_thread")  # to_thread carries the caller's context

        asyncio.run(inside())
    look("after")
    throttled = (f"{top}/{cgroups.GROUP_DEFAULT}", 0.5)
    plain = (cgroups.GROUP_DEFAULT, 1.0)
    assert seen == {"here": throttled, "to_thread": throttled, "thread": plain, "after": plain}
    assert not any((root / top).exists() for root in cgroups.detect().mounts.values())


async def test_sandbox_created_in_a_task_lands_under_the_throttled_parent() -> None:
    _need_cpu_controller()
    if not shutil.which("bwrap") or os.geteuid() != 0:
        pytest.skip("needs bubblewrap and root")
    with cgroups.throttled_parent(0.5, threads=1) as top:
        sb = await asyncio.create_task(create_sandbox(backend="bwrap", cpus=1))
        try:
            parent = f"{top}/{cgroups.GROUP_DEFAULT}"
            assert (sb.id, parent) in cgroups.leftover_groups()
            cpu = cgroups.detect().mounts["cpu"] / parent / sb.id
            if (cpu / "cpu.max").exists():
                assert (cpu / "cpu.max").read_text().split() == ["5000", "10000"]
            else:
                assert Path(cpu / "cpu.cfs_quota_us").read_text().strip() == "5000"
                assert Path(cpu / "cpu.cfs_period_us").read_text().strip() == "10000"
        finally:
            await sb.close()
    assert sb.id not in cgroups.leftover_names()


async def test_a_sandbox_cpu_limit_is_its_quota_over_the_default_period() -> None:
    """cgroup v1: the period is written only where a new group's (100 ms) is not the one wanted
    (each write walks every cpu cgroup on the host, issue 46); the limit holds all the same."""
    _need_cpu_controller()
    if not shutil.which("bwrap") or os.geteuid() != 0:
        pytest.skip("needs bubblewrap and root")
    sb = await create_sandbox(backend="bwrap", cpus=1.5)
    try:
        cpu = cgroups.detect().mounts["cpu"] / cgroups.GROUP_DEFAULT / sb.id
        if (cpu / "cpu.max").exists():
            assert (cpu / "cpu.max").read_text().split() == ["150000", "100000"]
        else:
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "150000"
            assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
    finally:
        await sb.close()
