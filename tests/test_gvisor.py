"""The gvisor backend's own behaviour: what differs from bwrap, and that it still holds.

The contract suite (test_sandbox_contract.py), the faults (test_sandbox_faults.py) and the
seccomp suite run on gvisor too, through the backend fixtures of conftest.py."""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import backend_skip
from sandfleet.errors import ConfigError, SandboxDiedError
from sandfleet.sandbox import cgroups, create_sandbox
from sandfleet.sandbox.spec import DEFAULT_UID_BASE, Limits, SandboxSpec
from sandfleet.sandbox.state import reap_leftovers, state_root

pytestmark = pytest.mark.skipif(bool(backend_skip("gvisor")), reason=str(backend_skip("gvisor")))


def _alive(pids: set[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie that init has yet to reap is not: orphans of a
    library user, which is no subreaper, go to init)."""
    alive = []
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(p)
    return alive


async def test_commands_run_on_gvisors_kernel_as_their_users() -> None:
    async with await create_sandbox(backend="gvisor", ttl_s=120) as sb:
        r = await sb.exec("uname -r; id -u; id -u root 2>/dev/null; echo x > /etc/nope", timeout=30)
        kernel, uid = r.stdout.split()[:2]
        assert kernel != platform.release(), "the command saw the host's kernel"
        assert uid == "1000" and "Permission denied" in r.stderr
        # as on bwrap: the host's files belong to nobody inside (host root is unmapped in the
        # gofer's user namespace), what the sandbox's root owns it may write
        root = await sb.exec("id -u; echo y > /root/mine && cat /root/mine; echo z > /etc/nope", user="root",
                             timeout=30)
        assert root.stdout.split() == ["0", "y"] and "Permission denied" in root.stderr, root.output
        no_net = await sb.exec("cat /proc/net/dev", network=False, timeout=30)  # the verifier's no-network
        assert no_net.exit_code == 0 and "lo:" in no_net.stdout, no_net.output


def _loopback_server(reply: bytes) -> tuple[socket.socket, int]:
    """A TCP server on the host's loopback that answers ``reply`` to each connection."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


async def test_network_reaches_only_forwarded_host_ports_through_the_gateway() -> None:
    """network=True: pasta serves eth0 in a namespace sandfleet made, gVisor's own TCP/IP
    stack speaks through it; a forwarded host-loopback port is reached at the gateway
    address (gVisor's 127.0.0.1 is its own), another listening host port is not; a per-exec
    network=False has no eth0; close leaves neither pasta nor the namespace's holder."""
    (fwd, fport), (other, oport) = _loopback_server(b"forwarded\n"), _loopback_server(b"other\n")
    probe = ("import socket, sys; s = socket.create_connection(('169.254.1.1', int(sys.argv[1])), timeout=5); "
             "print(s.recv(64).decode().strip())")
    try:
        sb = await create_sandbox(backend="gvisor", network=True, forward=(fport,), ttl_s=120)
        try:
            helpers = [sb.net.helper.pid, sb.net.holder.pid]  # type: ignore[attr-defined]
            r = await sb.exec(["python3", "-c", probe, str(fport)], timeout=60)
            assert (r.exit_code, r.stdout) == (0, "forwarded\n"), r.output
            r = await sb.exec(["python3", "-c", probe, str(oport)], timeout=60)
            assert r.exit_code != 0 and "other" not in r.stdout, r.output
            r = await sb.exec("cat /proc/net/dev", network=False, timeout=30)
            assert r.exit_code == 0 and "eth0" not in r.stdout and "lo:" in r.stdout, r.output
        finally:
            await sb.close()
        assert not _alive(set(helpers)), f"network helpers outlived the sandbox: {_alive(set(helpers))}"
    finally:
        fwd.close()
        other.close()


async def test_allowlisted_network_is_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="no allowlisted network"):
        await create_sandbox(backend="gvisor", network=True, allow=["example.org"])


async def test_fork_bomb_ends_only_its_own_sandbox() -> None:
    """The pids limit holds runsc's sandbox, gofer and ptrace stubs (every guest process needs
    a host stub): a bomb that reaches it ends the sandbox with a clear error, the host and
    other sandboxes carry on, and nothing is left."""
    other = await create_sandbox(backend="gvisor", ttl_s=120)
    sb = await create_sandbox(backend="gvisor", ttl_s=120, pids=128)
    try:
        assert sb.cgroup is not None  # type: ignore[attr-defined]
        try:
            r = await sb.exec("bomb() { bomb | bomb & }; bomb; sleep 5", timeout=5)
            assert r.timed_out or r.exit_code != 0
        except SandboxDiedError as e:
            assert "its process" in str(e), e
        assert (await other.exec("echo alive", timeout=30)).stdout == "alive\n"
    finally:
        await sb.close()
        await other.close()
    assert not (state_root() / sb.id).exists()


async def test_memory_hog_ends_only_its_own_sandbox() -> None:
    sb = await create_sandbox(backend="gvisor", ttl_s=120, memory_mib=256)
    hog = "mkfifo /tmp/hog; head -c 1200000000 /dev/zero > /tmp/hog & exec tail -c 1200000000 < /tmp/hog"
    try:
        try:
            r = await sb.exec(hog, timeout=90)
            assert r.exit_code != 0, "the hog outgrew its memory limit"
        except SandboxDiedError as e:
            assert "OOM kill" in str(e), e  # said how it died (rollout/verdict.py reads it)
    finally:
        await sb.close()


def test_killed_owner_leaves_nothing_after_reap(tmp_path: Path) -> None:
    """runsc's processes all live in the sandbox's cgroup, and runsc run dies with its owner
    (PR_SET_PDEATHSIG): the reaper finds nothing running, the cgroup and marker go."""
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent("""
        import asyncio
        from sandfleet.sandbox import create_sandbox
        async def main():
            sb = await create_sandbox(backend="gvisor")
            await sb.exec("sleep 1000 > /dev/null 2>&1 &")
            print(sb.id, sorted(sb.cgroup.pids()), flush=True)
            await asyncio.sleep(1000)
        asyncio.run(main())
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    sid, *rest = proc.stdout.readline().replace("[", " ").replace("]", " ").replace(",", " ").split()
    pids = {int(p) for p in rest}
    assert pids and (state_root() / sid).exists()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    time.sleep(0.3)
    assert sid in reap_leftovers()
    assert not (state_root() / sid).exists()
    assert sid not in cgroups.leftover_names()
    deadline = time.monotonic() + 5
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pids), f"runsc processes outlived their owner: {_alive(pids)}"


async def test_many_at_once_and_close_leaves_no_runsc() -> None:
    boxes = await asyncio.gather(*(create_sandbox(backend="gvisor", ttl_s=120) for _ in range(4)))
    pids: set[int] = set()
    try:
        outs = await asyncio.gather(*(b.exec("echo $((6*7))", timeout=30) for b in boxes))
        assert [o.stdout for o in outs] == ["42\n"] * 4
        for b in boxes:
            pids |= b.cgroup.pids()  # type: ignore[attr-defined]
    finally:
        await asyncio.gather(*(b.close() for b in boxes))
    assert pids and not _alive(pids)


async def test_built_image_layers_keep_their_owners() -> None:
    """A layer stored in the canonical range (what an image build writes) shows its owners
    inside, what the sandbox writes goes back there, and a snapshot's fork sees it all."""
    from sandfleet.sandbox.gvisor import GvisorBackend

    layer = Path(tempfile.mkdtemp(prefix="sf-gvisor-layer-"))
    try:
        (layer / "srv/app").mkdir(parents=True)
        (layer / "srv/app/data").write_text("stored\n")
        base = DEFAULT_UID_BASE
        for p in (layer, layer / "srv"):  # as a build stores them: the sandbox's root's
            os.chown(p, base, base)
            p.chmod(0o755)
        for p in (layer / "srv/app", layer / "srv/app/data"):
            os.chown(p, base + 1000, base + 1000)
        backend = GvisorBackend()
        spec = SandboxSpec(image="host", limits=Limits(ttl_s=120))
        sb = await backend.create(spec, layers=[layer])
        try:
            r = await sb.exec("find /srv/app /srv/app/data -printf '%U %G\\n'; echo new > /srv/app/mine", timeout=30)
            assert r.exit_code == 0 and r.stdout.split("\n")[:2] == ["1000 1000"] * 2, r.output
            snap = await sb.snapshot()
        finally:
            await sb.close()
        try:
            mine = snap.layer / "srv/app/mine"
            assert (mine.stat().st_uid, mine.read_text()) == (base + 1000, "new\n")  # stored canonical
            [child] = await backend.fork(snap, 1)
            try:
                r = await child.exec("cat /srv/app/mine; find /srv/app/mine -printf '%U'", timeout=30)
                assert r.stdout == "new\n1000", r.output
            finally:
                await child.close()
        finally:
            snap.delete()
    finally:
        shutil.rmtree(layer, ignore_errors=True)
