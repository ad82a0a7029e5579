"""Networking in its own namespace (finding 23; finding 9's "eth" test): ``network=True``
gets user-mode networking (pasta, as a dedicated host uid, behind nftables) that reaches
other machines but nothing on this host: not its loopback, not its other addresses, not
link-local (cloud metadata), unless a loopback port is forwarded on request.

Every address used here lives on this machine: loopback, a dummy interface, and network
namespaces reached over veth pairs that the tests create and remove. Before any packet is
sent to a test address, the host's route to it is checked to go through the test's own veth,
so nothing ever leaves the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandfleet.errors import HostUnsupportedError
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox

try:
    from sandfleet.sandbox import network as netmod
except ImportError:  # 490e57a had no user-mode networking: the tests below fail by assertion there
    netmod = None  # type: ignore[assignment]
from sandfleet.sandbox.spec import BwrapConfig
from sandfleet.sandbox.state import proc_start_time, read_meta, reap_one

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("bwrap") or not shutil.which("ip"),
    reason="network tests need root, bubblewrap and iproute2",
)
needs_net = pytest.mark.skipif(netmod is not None and not netmod.availability()["available"],
                               reason="" if netmod is None else str(netmod.availability()["reason"]))


def availability() -> dict[str, object]:
    assert netmod is not None, "no user-mode networking (sandfleet.sandbox.network)"
    return netmod.availability()


def helper_uid() -> int:
    assert netmod is not None, "no user-mode networking (sandfleet.sandbox.network)"
    return netmod.helper_uid()

TAG = f"{os.getpid() % 100000}"
REMOTE = "203.0.113.10"  # TEST-NET-3, inside a namespace of ours
METADATA = "169.254.169.254"
LOCAL_EXTRA = "198.51.100.77"  # TEST-NET-2, on an interface of ours
GATEWAY = "169.254.1.1"  # the sandbox's gateway: pasta's side

CLIENT = r"""
import socket, sys, threading
lock = threading.Lock()
def probe(target):
    host, port = target.rsplit(":", 1)
    try:
        s = socket.create_connection((host, int(port)), timeout=3)
        s.settimeout(3)
        line = f"{target} GOT {s.recv(64).decode(errors='replace').strip()}"
    except OSError as e:
        line = f"{target} ERR {type(e).__name__}"
    with lock:
        print(line, flush=True)
threads = [threading.Thread(target=probe, args=(t,)) for t in sys.argv[1:]]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""

SERVER = r"""
import socket, sys, threading
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the same secret to any datagram on the port
u.bind((sys.argv[1], int(sys.argv[2])))
def answer():
    while True:
        _, src = u.recvfrom(512)
        u.sendto(sys.argv[3].encode() + b"\n", src)
threading.Thread(target=answer, daemon=True).start()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[3].encode() + b"\n")
    c.close()
"""


def sh(*argv: str) -> str:
    p = subprocess.run(argv, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(argv)}: {p.stderr.strip()}"
    return p.stdout


def route_dev(addr: str) -> str:
    out = sh("ip", "-o", "route", "get", addr).split()
    return out[out.index("dev") + 1]


def assert_contained(*targets: str) -> None:
    """The safety net, before any probe: every target is an address of this host or is
    routed into a namespace of ours; never out of the machine, even if the code under test
    were wrong."""
    for t in targets:
        addr = t.rsplit(":", 1)[0]
        route = sh("ip", "-o", "route", "get", addr)
        assert route.startswith("local ") or route_dev(addr).startswith("sf"), f"{addr} would leave the host: {route}"


class Listener:
    """A TCP server in this process that sends ``secret`` to whoever connects."""

    def __init__(self, host: str, secret: str):
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        self.secret, self.hits = secret, 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                c, _ = self.sock.accept()
                self.hits += 1
                c.sendall(self.secret.encode() + b"\n")
                c.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@contextlib.contextmanager
def listener(host: str, secret: str) -> Iterator[Listener]:
    lst = Listener(host, secret)
    try:
        yield lst
    finally:
        lst.close()


@contextlib.contextmanager
def peer_namespace(kind: str, host_cidr: str, peer_cidr: str, secret: str, port: int = 8080) -> Iterator[str]:
    """A network namespace of ours behind a veth pair, serving ``secret`` on its address;
    yields ``addr:port``. Removed (with its veth and routes) afterwards."""
    ns, hif, pif = f"sft{kind}{TAG}", f"sf{kind}{TAG}h", f"sf{kind}{TAG}p"
    peer = peer_cidr.split("/")[0]
    server = None
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", hif, "type", "veth", "peer", "name", pif)
        sh("ip", "link", "set", pif, "netns", ns)
        sh("ip", "addr", "add", host_cidr, "dev", hif)
        sh("ip", "link", "set", hif, "up")
        sh("ip", "-n", ns, "addr", "add", peer_cidr, "dev", pif)
        sh("ip", "-n", ns, "link", "set", pif, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "route", "add", "default", "dev", pif)
        # the safety check: this address is reached through our veth, nowhere else
        assert route_dev(peer) == hif, f"{peer} is not routed through the test veth"
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVER, peer, str(port), secret],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield f"{peer}:{port}"
    finally:
        if server is not None:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()
        subprocess.run(["ip", "link", "del", hif], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert ns not in sh("ip", "netns", "list")


@pytest.fixture
def remote() -> Iterator[str]:
    """A "remote" service: a non-local address routed to a namespace of ours."""
    with peer_namespace("r", "203.0.113.1/24", f"{REMOTE}/24", "REMOTE-OK") as addr:
        yield addr


@pytest.fixture
def metadata() -> Iterator[str]:
    """A stand-in for a cloud metadata service at 169.254.169.254, in a namespace of ours;
    all of 169.254/16 (the sandbox's gateway address too) is routed there meanwhile."""
    with peer_namespace("m", "169.254.169.1/16", f"{METADATA}/16", "METADATA-SECRET", port=80) as addr:
        yield addr


@pytest.fixture
def local_extra() -> Iterator[Listener]:
    """A listener on another address of this host (on a veth pair of ours: this kernel may
    lack the dummy driver)."""
    dev = f"sfd{TAG}"
    sh("ip", "link", "add", dev, "type", "veth", "peer", "name", f"sfd{TAG}p")
    try:
        sh("ip", "addr", "add", f"{LOCAL_EXTRA}/32", "dev", dev)
        sh("ip", "link", "set", dev, "up")
        with listener(LOCAL_EXTRA, "HOST-ADDRESS-SECRET") as lst:
            yield lst
    finally:
        subprocess.run(["ip", "link", "del", dev], capture_output=True)


def host_client(*targets: str) -> str:
    """The positive control: a plain host process connecting to the same targets."""
    assert_contained(*targets)
    return subprocess.run([sys.executable, "-c", CLIENT, *targets], capture_output=True, text=True, timeout=30).stdout


async def in_sandbox(sb: Sandbox, *targets: str) -> str:
    assert_contained(*targets)
    r = await sb.exec(["python3", "-c", CLIENT, *targets], timeout=60)
    assert r.exit_code == 0, r.stderr
    return r.stdout


def in_build_step(tmp: Path, *targets: str) -> str:
    """An image-build RUN step exactly as the builder runs it (images.run.build_command: the
    launcher, a user namespace over the sandbox uid range, bwrap with its own network
    namespace), given networking through the builder's hook, StepNetwork."""
    assert netmod is not None, "no network hook for build steps"
    from sandfleet.images.run import build_command

    assert_contained(*targets)
    (tmp / "layer").mkdir()
    (tmp / "out").mkdir()
    from sandfleet.sandbox import uids

    slot = uids.take_slot(BwrapConfig())  # as the builder does: the step's uids and its helper's, held
    net = netmod.StepNetwork(tmp / "net", uid=netmod.helper_uid(slot_base=slot.base))
    cmd = build_command(tmp / "out", tmp / "layer", [Path("/")], ["/usr/bin/python3", "-c", CLIENT, *targets],
                        env={"PATH": "/usr/bin:/bin"}, cwd="/", config=BwrapConfig(), network=net, slot=slot)
    p = subprocess.Popen(cmd, pass_fds=net.pass_fds, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        helper = net.start(p.pid)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    finally:
        if p.returncode is None:
            p.kill()
            p.communicate()
        net.close()
        slot.release()
    assert not helper.alive()
    return out


def got(out: str, target: str) -> str | None:
    for line in out.splitlines():
        t, verdict, *rest = line.split(" ", 2) + [""]
        if t == target and verdict == "GOT":
            return rest[0].strip()
    return None


@pytest.fixture(params=["bwrap", "gvisor"])
async def netbox(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    """A sandbox with network=True on each backend that has one (gvisor: gVisor's own TCP/IP
    stack behind the same pasta and firewall)."""
    if request.param == "gvisor" and not shutil.which("runsc"):
        pytest.skip("runsc is not installed: apt-get install runsc")
    sb = await create_sandbox(backend=request.param, network=True, ttl_s=300)
    try:
        yield sb
    finally:
        await sb.close()


# ------------------------------------------------------------------ without network


async def test_no_network_means_loopback_only() -> None:
    """network=False: the sandbox's namespace has exactly ``lo`` (whatever the host's
    interfaces are called), and it is not the host's namespace."""
    sb = await create_sandbox(backend="bwrap", ttl_s=120)
    try:
        r = await sb.exec("cat /proc/net/dev; readlink /proc/self/ns/net")
    finally:
        await sb.close()
    lines = r.stdout.splitlines()
    ifaces = {ln.split(":")[0].strip() for ln in lines[2:-1]}
    assert ifaces == {"lo"}, r.stdout
    assert lines[-1] != str(Path("/proc/self/ns/net").readlink())


# ------------------------------------------------------------------ with network


@needs_net
async def test_network_is_its_own_namespace(netbox: Sandbox) -> None:
    """network=True used to share the host's namespace (its interfaces, its loopback, its
    abstract unix sockets). Now: its own, with lo and pasta's eth0 only."""
    r = await netbox.exec("cat /proc/net/dev; readlink /proc/self/ns/net")
    lines = r.stdout.splitlines()
    assert lines[-1] != str(Path("/proc/self/ns/net").readlink())
    assert {ln.split(":")[0].strip() for ln in lines[2:-1]} == {"lo", "eth0"}


@needs_net
async def test_remote_service_is_reachable(netbox: Sandbox, remote: str) -> None:
    """The positive control: networking works at all (a non-local address, in our namespace)."""
    assert got(host_client(remote), remote) == "REMOTE-OK"
    assert got(await in_sandbox(netbox, remote), remote) == "REMOTE-OK"


@needs_net
async def test_host_loopback_is_unreachable(netbox: Sandbox, metadata: str) -> None:
    """A service on the host's 127.0.0.1 (a model server, say) is out of reach: not as
    127.0.0.1 (the sandbox's own loopback), not through the gateway address."""
    with listener("127.0.0.1", "LOOPBACK-SECRET") as lst:
        targets = [f"127.0.0.1:{lst.port}", f"{GATEWAY}:{lst.port}"]
        assert got(host_client(targets[0]), targets[0]) == "LOOPBACK-SECRET"
        hits = lst.hits
        out = await in_sandbox(netbox, *targets)
        assert "LOOPBACK-SECRET" not in out, out
        assert lst.hits == hits


@needs_net
async def test_other_host_addresses_are_unreachable(netbox: Sandbox, local_extra: Listener) -> None:
    """Any other address of this host is blocked for the helper (nftables, fib local)."""
    target = f"{LOCAL_EXTRA}:{local_extra.port}"
    assert got(host_client(target), target) == "HOST-ADDRESS-SECRET"
    hits = local_extra.hits
    out = await in_sandbox(netbox, target)
    assert "HOST-ADDRESS-SECRET" not in out, out
    assert local_extra.hits == hits


@needs_net
async def test_metadata_address_is_unreachable(netbox: Sandbox, metadata: str) -> None:
    """169.254.169.254 (here: a listener in a namespace of ours) answers the host, not the sandbox."""
    assert got(host_client(metadata), metadata) == "METADATA-SECRET"
    out = await in_sandbox(netbox, metadata)
    assert "METADATA-SECRET" not in out, out


@needs_net
async def test_forward_reaches_only_the_asked_port(metadata: str) -> None:
    """Limits(forward=(port,)) makes exactly that host-loopback port reachable as
    127.0.0.1:port inside; another host-loopback port stays out of reach."""
    with listener("127.0.0.1", "MODEL-SERVER") as model, listener("127.0.0.1", "OTHER-SECRET") as other:
        sb = await create_sandbox(backend="bwrap", network=True, forward=(model.port,), ttl_s=120)
        try:
            out = await in_sandbox(sb, f"127.0.0.1:{model.port}", f"127.0.0.1:{other.port}",
                                   f"{GATEWAY}:{other.port}")
        finally:
            await sb.close()
    assert got(out, f"127.0.0.1:{model.port}") == "MODEL-SERVER", out
    assert "OTHER-SECRET" not in out, out


@needs_net
async def test_helper_is_unprivileged_and_dies_with_the_sandbox() -> None:
    """pasta runs as the dedicated uid (not a sandbox uid, not root), inside the sandbox's
    user namespace (no capability on the host); close() kills it, and so does the reaper
    from the marker alone (an owner that died)."""
    sb = await create_sandbox(backend="bwrap", network=True, ttl_s=120)
    try:
        meta = read_meta(sb.dir)  # type: ignore[attr-defined]
        assert meta is not None
        pid = int(meta["net_pid"])
        assert pid in meta["pids"] and proc_start_time(pid) is not None
        status = Path(f"/proc/{pid}/status").read_text()
        uids = next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1:]
        slot = getattr(sb, "slot", None)  # the helper is its uid slot's owner (sandbox/uids.py)
        expected = helper_uid() if slot is None or netmod is None else netmod.helper_uid(None, slot.base)
        assert set(uids) == {str(expected)}
        assert str(Path(f"/proc/{pid}/ns/user").readlink()) != str(Path("/proc/self/ns/user").readlink())
        await sb.close()
        assert proc_start_time(pid) is None
        sb2 = await create_sandbox(backend="bwrap", network=True, ttl_s=120)
        meta2 = read_meta(sb2.dir)  # type: ignore[attr-defined]
        assert meta2 is not None
        pid2 = int(meta2["net_pid"])
        reap_one({**meta2, "dir": str(sb2.dir)})  # type: ignore[attr-defined]
        deadline = time.monotonic() + 5
        while proc_start_time(pid2) is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert proc_start_time(pid2) is None
        await sb2.close()
    finally:
        await sb.close()


@needs_net
def test_helper_ends_with_an_owner_killed_by_sigkill(tmp_path: Path) -> None:
    """No reaper runs: the owner is SIGKILLed (no close, no finally) and pasta must end with
    it all the same. A daemonized pasta moved to a pid namespace of its own and lived on; it
    now runs under a tether that ends it when the owner process ends (tests also that the
    sandbox was made from a worker thread that ended long before: a parent-death signal
    names a thread, the tether the process)."""
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent("""
        import asyncio, json, sys, threading
        from sandfleet.sandbox import create_sandbox
        from sandfleet.sandbox.state import read_meta
        box = {}
        def make():  # its own thread and event loop, both ended before the kill
            async def go():
                sb = await create_sandbox(backend="bwrap", network=True, ttl_s=120)
                box["meta"] = {**read_meta(sb.dir), "dir": str(sb.dir)}
            asyncio.run(go())
        t = threading.Thread(target=make)
        t.start()
        t.join()
        print(json.dumps(box["meta"]), flush=True)
        threading.Event().wait()
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    meta = json.loads(proc.stdout.readline())
    pid = int(meta["net_pid"])
    start = proc_start_time(pid)
    try:
        assert start is not None, "pasta must live while its owner does"
        time.sleep(0.3)
        assert proc_start_time(pid) == start, "pasta died although its owner lives (its thread ended)"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while proc_start_time(pid) == start and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc_start_time(pid) != start, "pasta outlived its owner"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        reap_one(meta)  # the sandbox's marker and cgroups (its processes ended with the owner)


async def test_missing_pasta_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_PASTA", "/nonexistent/pasta")
    with pytest.raises(HostUnsupportedError, match=r"network=True .*pasta.*apt-get install passt"):
        sb = await create_sandbox(backend="bwrap", network=True, ttl_s=60)
        await sb.close()  # (only reached when the error is missing)


def test_firewall_table_is_in_place() -> None:
    """The nftables table judges only the helper uid's sockets."""
    if not availability()["available"]:
        pytest.skip(str(availability()["reason"]))
    assert netmod is not None
    netmod.ensure_firewall(helper_uid())
    table = json.loads(sh("nft", "-j", "list", "table", "inet", "sandfleet"))
    text = json.dumps(table)
    assert str(helper_uid()) in text and "fib" in text and "169.254.0.0" in text


# ------------------------------------------------------------------ build steps


@needs_net
def test_build_step_network(tmp_path: Path, remote: str, metadata: str, local_extra: Listener) -> None:
    """A RUN step with the builder's network hook: reaches a remote service, nothing on this
    host, no metadata (on 490e57a RUN steps shared the host's network namespace)."""
    with listener("127.0.0.1", "LOOPBACK-SECRET") as lo:
        local = f"{LOCAL_EXTRA}:{local_extra.port}"
        targets = [remote, f"127.0.0.1:{lo.port}", f"{GATEWAY}:{lo.port}", local, metadata]
        host = host_client(remote, f"127.0.0.1:{lo.port}", local, metadata)
        assert got(host, remote) == "REMOTE-OK" and got(host, local) == "HOST-ADDRESS-SECRET"
        out = in_build_step(tmp_path, *targets)
    assert got(out, remote) == "REMOTE-OK", out
    for secret in ("LOOPBACK-SECRET", "HOST-ADDRESS-SECRET", "METADATA-SECRET"):
        assert secret not in out, out


def test_doctor_says_whether_networking_works(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandfleet.doctor import report

    assert report().get("network") == availability()
    monkeypatch.setenv("SANDFLEET_NFT", "/nonexistent/nft")
    net = report()["network"]
    assert net["available"] is False and "apt-get install nftables" in net["reason"]
