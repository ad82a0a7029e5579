"""cgroup v2 with throttling (audit finding 33), run for real inside a microVM guest.

This host's cpu, memory and pids controllers are v1, so the v2 code path is exercised in a
guest, whose kernel has them on cgroup2: the test mounts cgroup2 there and runs sandfleet's
own ``cgroups`` module with the guest's python3, with our source and pydantic copied in.
Throttled and unthrottled sandbox groups are made in one process (the parent in use
changes: each chain needs its own ``subtree_control``) and the reaper's listing finds both."""

from __future__ import annotations

import ast
import io
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from conftest import backend_skip
from sandfleet.sandbox import create_sandbox

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import os
    from sandfleet.sandbox import cgroups
    from sandfleet.sandbox.spec import Limits
    lay = cgroups.detect()
    assert lay.version == "v2" and lay.usable, lay
    limits = Limits(cpus=1, memory_mib=64, pids=64)
    plain = cgroups.Cgroup("sf-plain", lay)
    plain.create(limits)
    with cgroups.throttled_parent(0.5, threads=1) as top:
        slow = cgroups.Cgroup("sf-slow", lay, parent=cgroups.group())
        slow.create(limits)  # finding 33: memory.max failed under the second parent
        again = cgroups.Cgroup("sf-plain2", lay, parent="sandfleet")
        again.create(limits)
        d = slow.dirs[0]
        print("SLOW", (d / "memory.max").read_text().strip(), (d / "pids.max").read_text().strip(),
              (d / "cpu.max").read_text().strip())
        print("LEFT", sorted(n for n, _ in cgroups.leftover_groups(lay)))
        slow.remove()
        again.remove()
    plain.remove()
    print("AFTER", sorted(n for n, _ in cgroups.leftover_groups(lay)))
""")


def _bundle() -> bytes:
    """sandfleet's source and the pure/compiled packages it imports, for the guest's python3."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    src = Path(__file__).resolve().parents[1] / "src" / "sandfleet"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(src, arcname="sandfleet", filter=lambda t: None if "__pycache__" in t.name else t)
        for name in ("pydantic", "pydantic_core", "typing_extensions.py", "annotated_types", "typing_inspection"):
            tar.add(site / name, arcname=name, filter=lambda t: None if "__pycache__" in t.name else t)
    return buf.getvalue()


async def test_v2_throttled_and_plain_groups_in_one_process_in_a_guest(tmp_path: Path) -> None:
    why = backend_skip("microvm")
    if why:
        pytest.skip(why)
    vm = await create_sandbox(backend="microvm", memory_mib=512, ttl_s=600)
    try:
        probe = await vm.exec("python3 -c 'import sys; print(sys.version_info[:2])'; "
                              "grep -w cgroup2 /proc/filesystems", user="root")
        if "(3, 11)" not in probe.stdout or "cgroup2" not in probe.stdout:
            pytest.skip(f"the guest has no python3.11 or no cgroup2: {probe.output.strip()[:200]}")
        r = await vm.exec("mkdir -p /tmp/py && tar -x -C /tmp/py && mkdir -p /sys/fs/cgroup && "
                          "(mountpoint -q /sys/fs/cgroup || mount -t cgroup2 none /sys/fs/cgroup) && "
                          "cat /sys/fs/cgroup/cgroup.controllers", stdin=_bundle(), user="root", timeout=120)
        assert r.exit_code == 0, r.output
        if not {"cpu", "memory", "pids"} <= set(r.stdout.split()):
            pytest.skip(f"the guest kernel's cgroup2 lacks cpu/memory/pids: {r.stdout.strip()}")
        r = await vm.exec(["python3", "-c", SCRIPT], env={"PYTHONPATH": "/tmp/py"}, user="root", timeout=300)
        assert r.exit_code == 0, r.output
        out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
        mem, pids, cpu = out["SLOW"].split(" ", 2)
        assert mem == str(64 << 20) and pids == "64" and cpu.split()[1] == "10000", out["SLOW"]
        # the reaper's listing sees groups under both parents
        assert {"sf-slow", "sf-plain", "sf-plain2"} <= set(ast.literal_eval(out["LEFT"])), out["LEFT"]
        assert ast.literal_eval(out["AFTER"]) == [], out["AFTER"]
    finally:
        await vm.close()
