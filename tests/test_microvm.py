"""The microvm backend on a real QEMU guest (TCG where KVM can't run it).

All tests share one template (128 MiB guest), built once and cached on disk; each test
restores fresh VMs from it in a fraction of a second. The shared contract tests in
test_sandbox_contract.py run against microvm too when SANDFLEET_TEST_MICROVM=1.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandfleet.errors import ConfigError, HostUnsupportedError, SandboxClosedError
from sandfleet.sandbox.microvm import MicrovmBackend, MicrovmSandbox
from sandfleet.sandbox.microvm.guest import _cpio
from sandfleet.sandbox.spec import MicrovmConfig, SandboxSpec, make_spec
from sandfleet.sandbox.state import owner_alive, proc_start_time, read_meta, reap_one, state_root

pytestmark = pytest.mark.microvm

try:
    BACKEND: MicrovmBackend | None = MicrovmBackend()
    SKIP = ""
except HostUnsupportedError as exc:
    BACKEND, SKIP = None, str(exc)

needs_vm = pytest.mark.skipif(BACKEND is None, reason=f"microvm unavailable: {SKIP}")
SPEC = make_spec(backend="microvm", memory_mib=128, ttl_s=300)


@pytest.fixture
async def vm() -> AsyncIterator[MicrovmSandbox]:
    assert BACKEND is not None
    box = await BACKEND.create(SPEC)
    try:
        yield box
    finally:
        await box.close()


def test_cpio_is_readable_by_cpio(tmp_path: Path) -> None:
    blob = _cpio([("d", 0o40755, b""), ("d/f", 0o100644, b"hello")])
    out = subprocess.run(["cpio", "-i", "-d", "--quiet"], input=blob, cwd=tmp_path, capture_output=True, check=False)
    if out.returncode == 127:
        pytest.skip("cpio not installed")
    assert (tmp_path / "d/f").read_bytes() == b"hello"


def test_bad_limits_and_options() -> None:
    with pytest.raises(ConfigError, match="options"):
        MicrovmBackend(MicrovmConfig(options={"nope": 1}))
    if BACKEND is None:
        pytest.skip(SKIP)
    with pytest.raises(ConfigError, match="at least"):
        BACKEND.vm_spec(SandboxSpec.model_validate({"limits": {"memory_mib": 64}}))
    with pytest.raises(ConfigError, match="network"):
        BACKEND.vm_spec(SandboxSpec.model_validate({"limits": {"network": True}}))


@needs_vm
async def test_exec_files_session(vm: MicrovmSandbox) -> None:
    r = await vm.exec("echo $((6*7)); cat /proc/sys/kernel/hostname; pwd")
    assert r.stdout.split() == ["42", "sandfleet", "/work"]
    await vm.write_file("d/x.txt", "data")
    assert await vm.read_file("/work/d/x.txt") == b"data"
    s = vm.session()
    await s.run("cd d && export K=v")
    assert (await s.run("pwd; echo $K")).stdout.split() == ["/work/d", "v"]
    clock = float((await vm.exec(["date", "+%s"])).stdout)
    assert abs(clock - time.time()) < 3  # restored guests get the host's clock


@needs_vm
async def test_timeout_kills_the_tree(vm: MicrovmSandbox) -> None:
    r = await vm.exec("setsid sh -c 'sleep 300' & sleep 300", timeout=0.5)
    assert r.timed_out
    assert (await vm.exec("ps -o args | grep -c '[s]leep 300' || true")).stdout.strip() == "0"


@needs_vm
async def test_fork_from_snapshot_is_isolated() -> None:
    assert BACKEND is not None
    parent = await BACKEND.create(SPEC)
    try:
        await parent.write_file("state.txt", "prepared")
        snap = await parent.snapshot()
        try:
            kids = await BACKEND.fork(snap, 2)
            try:
                await kids[0].write_file("state.txt", "changed")
                assert await kids[1].read_file("state.txt") == b"prepared"
                assert await parent.read_file("state.txt") == b"prepared"
            finally:
                await asyncio.gather(*(k.close() for k in kids))
        finally:
            snap.delete()
    finally:
        await parent.close()


@needs_vm
async def test_close_leaves_nothing_and_vms_share_memory() -> None:
    assert BACKEND is not None
    boxes = await asyncio.gather(*(BACKEND.create(SPEC) for _ in range(2)))
    pids = [b.vm.proc.pid for b in boxes]
    rollup = (await asyncio.to_thread(Path(f"/proc/{pids[0]}/smaps_rollup").read_text)).split()
    pss, rss = (int(rollup[rollup.index(k) + 1]) for k in ("Pss:", "Rss:"))
    assert pss < rss  # untouched template pages are shared
    for b in boxes:
        await b.close()
        assert not b.vm.run.exists()
        with pytest.raises(SandboxClosedError):
            await b.exec("true")
    assert all(proc_start_time(p) is None for p in pids)


@needs_vm
async def test_prestarted_qemus_restore_fresh_vms_and_end_with_aclose() -> None:
    """prestart: QEMUs started ahead with the template's state loaded (paused, never run); a
    create takes one, gets its own marker fields, and a refill starts another; aclose ends the
    waiting ones and leaves no process or directory (and a later event loop drops them too)."""
    backend = MicrovmBackend(MicrovmConfig(options={"prestart": 1}))
    spec = make_spec(backend="microvm", memory_mib=128, ttl_s=300, labels={"run": "prestart"})
    first = await backend.create(spec)  # no spare yet: a cold restore, then the refill starts
    try:
        assert (await first.exec("echo cold")).output == "cold\n"
        for _ in range(200):  # the refill: one QEMU launched and loaded
            spares = [vm for s in backend._spares.values() for vm in s.vms]
            if spares:
                break
            await asyncio.sleep(0.05)
        assert len(spares) == 1 and spares[0].loaded and spares[0].alive()
        spare = spares[0]
        box = await backend.create(spec)
        try:
            assert box.vm is spare and box.id == spare.id == spare.run.name
            meta = read_meta(spare.run)
            assert meta is not None and meta["labels"] == {"run": "prestart"} and meta["ttl_s"] == 300
            res = await box.exec("echo $((6 * 7)); cat /proc/uptime")
            assert res.exit_code == 0 and res.output.startswith("42\n")
            await box.write_file("/tmp/x", b"mine")
            assert (await first.exec("test -e /tmp/x")).exit_code == 1  # separate guests
        finally:
            await box.close()
        assert not spare.run.exists()
    finally:
        await first.close()
    for _ in range(200):
        waiting = [vm for s in backend._spares.values() for vm in s.vms]
        if waiting:
            break
        await asyncio.sleep(0.05)
    assert waiting
    await backend.aclose()
    assert not backend._spares
    for vm in waiting:
        assert vm.proc.returncode is not None and not vm.run.exists()


@needs_vm
def test_spares_end_with_the_event_loop_that_started_them() -> None:
    backend = MicrovmBackend(MicrovmConfig(options={"prestart": 1}))

    async def one() -> list[tuple[int, Path]]:
        box = await backend.create(SPEC)
        await box.close()
        for _ in range(200):
            vms = [vm for s in backend._spares.values() for vm in s.vms]
            if vms:
                assert all(proc_start_time(vm.proc.pid) is not None for vm in vms)
                return [(vm.proc.pid, vm.run) for vm in vms]
            await asyncio.sleep(0.05)
        raise AssertionError("no QEMU was started ahead")

    for _ in range(2):  # the second loop starts its own: none of the first is taken or left
        waiting = asyncio.run(one())  # ends: asyncio.run cancels the keeper, which stops them
        assert all(proc_start_time(pid) is None and not run.exists() for pid, run in waiting)


@needs_vm
async def test_ttl_kills_the_vm() -> None:
    assert BACKEND is not None
    box = await BACKEND.create(make_spec(backend="microvm", memory_mib=128, ttl_s=0.5))
    try:
        await asyncio.sleep(1.0)
        assert not box.alive
    finally:
        await box.close()


@needs_vm
def test_killed_owner_leaves_no_vm(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys
        from sandfleet.sandbox.microvm import MicrovmBackend
        from sandfleet.sandbox.spec import make_spec
        async def main():
            box = await MicrovmBackend().create(make_spec(memory_mib=128))
            print(box.vm.proc.pid, box.vm.run, flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    assert owner.stdout is not None
    with owner.stdout:
        try:
            pid_s, run = owner.stdout.readline().decode().split()
        finally:
            owner.send_signal(signal.SIGKILL)
            owner.wait()
    deadline = time.monotonic() + 5
    while proc_start_time(int(pid_s)) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc_start_time(int(pid_s)) is None  # PR_SET_PDEATHSIG took QEMU down
    meta = read_meta(Path(run))
    assert meta is not None and Path(run).parent == state_root() and not owner_alive(meta)
    reap_one(meta)  # what reap_leftovers() does for every marker whose owner is dead
    assert not Path(run).exists()


@needs_vm
def test_bench_micro_reports_cold_and_prestarted_restores_and_leaves_nothing() -> None:
    from sandfleet.bench import microvm as bench

    before = set(state_root().glob("sf-microvm-*"))
    out = bench.run(n=2, restores=2, execs=3)
    assert out["prestart"] == bench.PRESTART and out["restores"] == 2
    for key in ("restore_to_ready_p50_s", "restore_to_ready_prestarted_p50_s", "exec_rtt_p50_s"):
        assert 0 < out[key] < 30, (key, out[key])
    assert set(state_root().glob("sf-microvm-*")) <= before  # no VM, spare or not, left behind
