"""Allowlist networking (issue 31): ``Limits(network=True, allow=...)`` reaches the listed host
names and CIDRs only, through the same pasta and nftables path as ``network=True``; DNS answers
come from a resolver sandfleet runs for the sandbox, for listed names only; the host and
link-local stay blocked even when listed.

Offline: the "internet" is two network namespaces this test makes (behind veth pairs, in
198.18.0.0/15, the benchmarking range, a /24 of each half picked by the test's pid), and the
names are given to the sandbox's resolver (``Limits.hosts``). Every target is checked to be
routed into a namespace of ours first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_network import assert_contained, listener, peer_namespace  # noqa: E402

from sandfleet.sandbox import create_sandbox  # noqa: E402
from sandfleet.sandbox import network as netmod  # noqa: E402
from sandfleet.sandbox.base import Sandbox  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap") or not shutil.which("ip"),
                       reason="network tests need root, bubblewrap and iproute2"),
    pytest.mark.skipif(not netmod.availability()["available"], reason=str(netmod.availability()["reason"])),
]
NET = os.getpid() % 254 + 1  # two runs at once (two checkouts) must not route the same addresses
GOOD_NET, EVIL_NET = f"198.18.{NET}.0/24", f"198.19.{NET}.0/24"
GOOD, EVIL = f"198.18.{NET}.10", f"198.19.{NET}.10"

PROBE = r"""
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        addr = socket.gethostbyname(host)
    except OSError as e:
        print(target, "-", "DNS", type(e).__name__, flush=True)
        continue
    try:
        s = socket.create_connection((addr, int(port)), timeout=3)
        s.settimeout(3)
        print(target, addr, "GOT", s.recv(64).decode(errors="replace").strip(), flush=True)
    except OSError as e:
        print(target, addr, "ERR", type(e).__name__, flush=True)
"""


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    with peer_namespace("ag", f"198.18.{NET}.1/24", f"{GOOD}/24", "GOOD-OK") as good, \
            peer_namespace("ae", f"198.19.{NET}.1/24", f"{EVIL}/24", "EVIL-REACHED") as evil:
        yield good, evil


async def probe(sb: Sandbox, *targets: str) -> dict[str, list[str]]:
    r = await sb.exec(["python3", "-c", PROBE, *targets], timeout=120)
    assert r.exit_code == 0, r.stderr
    out = {}
    for line in r.stdout.splitlines():
        target, *rest = line.split()
        out[target] = rest
    assert set(out) == set(targets), r.stdout
    return out


def table() -> str:
    return subprocess.run(["nft", "list", "table", "inet", "sandfleet"], capture_output=True, text=True).stdout


HOSTS = (("good.test", GOOD), ("evil.test", EVIL), ("api.svc.test", GOOD), ("svc.test", GOOD))


async def test_a_listed_name_is_reached_an_unlisted_one_and_a_direct_ip_are_not(servers: tuple[str, str]) -> None:
    good, evil = servers
    assert_contained(good, evil)
    sb = await create_sandbox(backend="bwrap", network=True, ttl_s=300, allow=("good.test", "*.svc.test"),
                              hosts=HOSTS)
    uid = sb.net.uid if sb.net is not None else None  # type: ignore[attr-defined]
    try:
        out = await probe(sb, "good.test:8080", "api.svc.test:8080", "evil.test:8080", "svc.test:8080",
                          f"{EVIL}:8080", "unlisted.example:80")
        assert out["good.test:8080"] == [GOOD, "GOT", "GOOD-OK"]
        assert out["api.svc.test:8080"] == [GOOD, "GOT", "GOOD-OK"]  # *.svc.test: a subdomain
        assert out["evil.test:8080"][:2] == ["-", "DNS"]  # the resolver answers listed names only
        assert out["svc.test:8080"][:2] == ["-", "DNS"]  # *.svc.test lists subdomains, not the apex
        assert out["unlisted.example:80"][:2] == ["-", "DNS"]
        assert out[f"{EVIL}:8080"][:2] == [EVIL, "ERR"]  # dialled directly: refused by nftables
        assert uid is not None and f"al_{uid}" in table()
    finally:
        await sb.close()
    assert f"al_{uid}" not in table() and f"{uid} : jump" not in table()  # nothing left of it


async def test_the_same_servers_without_an_allowlist_and_with_a_cidr(servers: tuple[str, str]) -> None:
    """The controls: network=True reaches both servers; a CIDR entry reaches its addresses by IP."""
    _good, evil = servers
    sb = await create_sandbox(backend="bwrap", network=True, ttl_s=300)
    try:
        out = await probe(sb, f"{GOOD}:8080", f"{EVIL}:8080")
        assert out[f"{EVIL}:8080"] == [EVIL, "GOT", "EVIL-REACHED"] and out[f"{GOOD}:8080"][1] == "GOT"
    finally:
        await sb.close()
    sb = await create_sandbox(backend="bwrap", network=True, ttl_s=300, allow=(EVIL_NET,))
    try:
        out = await probe(sb, f"{GOOD}:8080", f"{EVIL}:8080")
        assert out[f"{EVIL}:8080"] == [EVIL, "GOT", "EVIL-REACHED"]
        assert out[f"{GOOD}:8080"][:2] == [GOOD, "ERR"]
    finally:
        await sb.close()


async def test_host_and_link_local_stay_blocked_even_when_listed() -> None:
    with listener("127.0.0.1", "HOST-LOOPBACK-SECRET") as lst:
        sb = await create_sandbox(backend="bwrap", network=True, ttl_s=300,
                                  allow=("127.0.0.0/8", "169.254.0.0/16", "host.test"),
                                  hosts=(("host.test", "127.0.0.1"),))
        try:
            out = await probe(sb, f"127.0.0.1:{lst.port}", f"host.test:{lst.port}", "169.254.1.1:80",
                              "169.254.169.254:80")
        finally:
            await sb.close()
    assert lst.hits == 0, out
    assert all(v[1] == "ERR" for v in out.values()), out  # host.test resolves (listed), then is refused


def test_bad_allowlists_are_refused_by_name() -> None:
    from pydantic import ValidationError

    from sandfleet.sandbox.spec import Limits

    for allow, why in ((("good.test",), "needs network=True"), (("fe80::/10",), "IPv6 is not served"),
                       (("host.test:443",), "ports are not part of an entry"), (("a b",), "neither a host name")):
        with pytest.raises(ValidationError, match=why):
            Limits(network="needs" not in why, allow=allow)
    with pytest.raises(ValidationError, match="need an allowlist"):
        Limits(network=True, hosts=(("a.test", "198.18.5.10"),))


FETCH = """\
import socket, sys
for target in sys.argv[2:]:
    host, port = target.rsplit(":", 1)
    try:
        s = socket.create_connection((host, int(port)), timeout=3)
        s.settimeout(3)
        got = s.recv(64).decode(errors="replace").strip()
    except OSError as e:
        got = "ERR " + type(e).__name__
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # and by UDP (the peers answer datagrams too)
    u.settimeout(3)
    try:
        u.sendto(b"hello", (host, int(port)))
        udp = u.recv(64).decode(errors="replace").strip()
    except OSError as e:
        udp = "ERR " + type(e).__name__
    with open(sys.argv[1], "a") as f:
        f.write(f"{target} {got}\\nudp {target} {udp}\\n")
"""


@pytest.mark.parametrize("verify", ["shared", "separate"])
async def test_harbor_allowlist_phases_in_a_real_rollout(tmp_path: Path, servers: tuple[str, str], verify: str) -> None:
    """A Harbor task whose agent may reach only GOOD's network and whose tests only EVIL's:
    the oracle (agent phase) reaches GOOD and not EVIL, by TCP and by UDP; the tests (in the same
    sandbox after the switch, or in a fresh one) reach EVIL and not GOOD. The no-op agent scores 0."""
    from sandfleet.images.debootstrap import why_no_build
    from sandfleet.rollout.validate import validate_tasks
    from sandfleet.tasks import load_task

    if why_no_build():
        pytest.skip(f"the task's Debian base can't be built here: {why_no_build()}")
    good, evil = servers
    assert_contained(good, evil)
    folder = tmp_path / "allow"
    for sub in ("tests", "solution", "environment"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text(
        f'schema_version = "1.4"\n[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["{GOOD_NET}"]\n'
        '[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 120\nnetwork_mode = "allowlist"\n'
        f'allowed_hosts = ["{EVIL_NET}"]\n')
    (folder / "instruction.md").write_text("Fetch.\n")
    (folder / "environment" / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\nWORKDIR /app\n")
    (folder / "solution" / "fetch.py").write_text(FETCH)
    (folder / "solution" / "solve.sh").write_text(f"python3 /solution/fetch.py /tmp/agent.txt {good} {evil}\n"
                                                  "cp /tmp/agent.txt ./agent.txt\n")
    (folder / "tests" / "fetch.py").write_text(FETCH)
    (folder / "tests" / "test.sh").write_text(
        f"python3 /tests/fetch.py /tmp/tests.txt {good} {evil}\n"
        f'if grep -qx "{good} GOOD-OK" agent.txt && grep -q "^{evil} ERR" agent.txt '
        f'&& grep -qx "udp {good} GOOD-OK" agent.txt && grep -q "^udp {evil} ERR" agent.txt '
        f'&& grep -qx "{evil} EVIL-REACHED" /tmp/tests.txt && grep -q "^{good} ERR" /tmp/tests.txt '
        f'&& grep -qx "udp {evil} EVIL-REACHED" /tmp/tests.txt && grep -q "^udp {good} ERR" /tmp/tests.txt; '
        "then echo 1; else echo 0; fi > /logs/verifier/reward.txt\ncat agent.txt /tmp/tests.txt\n")
    task = load_task(folder)
    assert task.allowed_hosts == (GOOD_NET,) and task.verifier.allowed_hosts == (EVIL_NET,)
    verdict = (await validate_tasks([task], repeats=1, backend="bwrap", network=True, verify=verify))["allow"]
    assert verdict.status == "valid", verdict.reason
    assert verdict.oracle_rewards == [1.0] and verdict.noop_rewards == [0.0]


async def test_a_denylist_passes_what_it_does_not_deny(servers: tuple[str, str]) -> None:
    """E2B's denyOut with allowOut over it: denied CIDRs are refused unless listed, the rest
    passes, and every name resolves."""
    sb = await create_sandbox(backend="bwrap", network=True, ttl_s=300, allow=("good.test",),
                              deny=("198.18.0.0/15",), hosts=HOSTS)
    try:
        out = await probe(sb, "good.test:8080", "evil.test:8080", f"{EVIL}:8080")
    finally:
        await sb.close()
    assert out["good.test:8080"] == [GOOD, "GOT", "GOOD-OK"]  # listed: past the deny
    assert out["evil.test:8080"][:2] == [EVIL, "ERR"]  # resolves (a denylist answers every name), denied
    assert out[f"{EVIL}:8080"][:2] == [EVIL, "ERR"]


def test_e2b_allow_and_deny_lists_through_a_real_service(servers: tuple[str, str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The real e2b SDK's ``network={"allow_out": [...], "deny_out": [ALL_TRAFFIC]}`` against
    ``sandfleet serve``: the same policy as Harbor's allowlist."""
    pytest.importorskip("fastapi")
    pytest.importorskip("e2b")
    from e2b import Sandbox
    from e2b.sandbox.network import ALL_TRAFFIC

    from sandfleet.server.testing import running_service

    probe_py = PROBE.replace("sys.argv[1:]", "%r" % [f"{GOOD}:8080", f"{EVIL}:8080"])
    with running_service(tmp_path, args=["--max-ttl", "900"]) as svc:
        for k, v in {"E2B_API_URL": svc.url, "E2B_SANDBOX_URL": svc.url, "E2B_API_KEY": svc.token}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("E2B_DOMAIN", raising=False)
        results = {}
        for name, network in (("allow", {"allow_out": [GOOD_NET], "deny_out": [ALL_TRAFFIC]}),
                              ("deny", {"deny_out": [EVIL]}), ("open", {})):
            sb = Sandbox.create(allow_internet_access=True, network=network, timeout=300)  # type: ignore[arg-type]
            try:
                sb.files.write("/tmp/probe.py", probe_py)
                results[name] = sb.commands.run("python3 /tmp/probe.py", timeout=120).stdout
            finally:
                sb.kill()
    assert f"{GOOD}:8080 {GOOD} GOT GOOD-OK" in results["allow"] and f"{EVIL}:8080 {EVIL} ERR" in results["allow"]
    assert f"{GOOD}:8080 {GOOD} GOT GOOD-OK" in results["deny"] and f"{EVIL}:8080 {EVIL} ERR" in results["deny"]
    assert f"{EVIL}:8080 {EVIL} GOT EVIL-REACHED" in results["open"], results


def test_e2b_network_lists_map_onto_limits() -> None:
    from sandfleet.server.dialects.e2b.network import network_limits

    assert network_limits({}) == {"network": True}  # E2B's default: the internet
    assert network_limits({}, default=False) == {"network": False}  # serve --no-e2b-internet
    assert network_limits({"allow_internet_access": True}) == {"network": True}
    assert network_limits({"allow_internet_access": False, "network": {"allowOut": ["a.test"]}}) == {
        "network": True, "allow": ("a.test",)}
    assert network_limits({"allow_internet_access": True, "network": {"allowOut": ["a.test"],
                                                                      "denyOut": ["0.0.0.0/0"]}}) == {
        "network": True, "allow": ("a.test",)}
    assert network_limits({"allow_internet_access": True, "network": {"denyOut": ["10.0.0.0/8"]}}) == {
        "network": True, "allow": (), "deny": ("10.0.0.0/8",)}
    with pytest.raises(ValueError, match="network.allowOut must be a list"):
        network_limits({"network": {"allowOut": "a.test"}})


async def test_a_stale_allowlist_of_a_dead_owner_does_not_bind_the_next_sandbox(servers: tuple[str, str]) -> None:
    """An owner killed while its sandbox was allowlisted leaves the uid's map entry behind (its
    close never ran): a later plain network=True sandbox in that uid slot is not held to it."""
    _good, evil = servers
    sb = await create_sandbox(backend="bwrap", network=True, ttl_s=300, allow=())
    helper = sb.net  # type: ignore[attr-defined]
    uid = helper.uid
    egress, helper.egress = helper.egress, None  # what a SIGKILLed owner leaves: no cleanup
    egress.resolver.close()
    await sb.close()
    assert f"{uid} : jump al_{uid}" in table()
    boxes = []
    try:
        for _ in range(4):  # the freed slot is taken again (the lowest free one)
            boxes.append(await create_sandbox(backend="bwrap", network=True, ttl_s=300))
            if boxes[-1].net.uid == uid:  # type: ignore[attr-defined]
                break
        again = boxes[-1]
        assert again.net.uid == uid, "the slot was not reused"  # type: ignore[attr-defined]
        assert f"{uid} : jump al_{uid}" not in table()
        out = await probe(again, evil)
        assert out[evil] == [EVIL, "GOT", "EVIL-REACHED"]
    finally:
        for b in boxes:
            await b.close()


async def test_a_gvisor_sandbox_with_network_leaves_a_live_allowlist_alone(servers: tuple[str, str]) -> None:
    """CI, 2026-12-05: the e2b allow_out sandbox reached EVIL. Every gvisor sandbox with
    network=True ran its helper as slot 0's owner without holding slot 0; the bwrap sandbox in
    slot 0 (taken whenever free) had that uid, and the gvisor helper's start cleared the uid's
    allowlist entry (a stale one, it assumed). Now a gvisor namespace holds a uid slot of its own."""
    if not shutil.which("runsc"):
        pytest.skip("runsc is not installed: apt-get install runsc")
    good, evil = servers
    assert_contained(good, evil)
    sb = await create_sandbox(backend="bwrap", network=True, ttl_s=300, allow=(GOOD_NET,))
    uid = sb.net.uid  # type: ignore[attr-defined]
    try:
        g = await create_sandbox(backend="gvisor", network=True, ttl_s=300)
        try:
            assert g.net.uid != uid  # type: ignore[attr-defined]
            assert f"{uid} : jump al_{uid}" in table()
            out = await probe(sb, good, evil)
        finally:
            await g.close()
        assert out[good] == [GOOD, "GOT", "GOOD-OK"] and out[evil][:2] == [EVIL, "ERR"], out
        assert f"{uid} : jump al_{uid}" in table()  # and still after the gvisor sandbox closed
    finally:
        await sb.close()


OTHER_WAYS = r"""
import socket, struct, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # UDP (a DNS query to a server of one's own, say)
    u.settimeout(3)
    try:
        u.sendto(b"hello", (host, int(port)))
        print(target, "udp", "GOT", u.recv(64).decode(errors="replace").strip(), flush=True)
    except OSError as e:
        print(target, "udp", "ERR", type(e).__name__, flush=True)
    for kind in (socket.SOCK_RAW, socket.SOCK_DGRAM):  # ICMP echo: a raw socket (root), or a ping socket
        try:
            i = socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP)
        except OSError:
            continue
        i.settimeout(3)
        body = struct.pack("!BBHHH", 8, 0, 0, 0x5f5f, 1) + b"sandfleet!"  # (an even length: 9 words)
        total = sum(struct.unpack("!9H", body))
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        body = body[:2] + struct.pack("!H", ~total & 0xFFFF) + body[4:]
        try:
            i.sendto(body, (host, 0))
            while True:  # a raw socket also sees our own request on some paths: wait for a reply (type 0)
                data = i.recv(256)
                reply = data[20:] if kind == socket.SOCK_RAW else data
                if reply[:1] == b"\x00":
                    print(target, "icmp", "GOT", "echo-reply", flush=True)
                    break
        except OSError as e:
            print(target, "icmp", "ERR", type(e).__name__, flush=True)
        break
    else:
        print(target, "icmp", "NOSOCKET", "-", flush=True)
"""


async def test_an_allowlist_holds_for_udp_and_icmp_too(servers: tuple[str, str]) -> None:
    """Attacks of kinds the allowlist's tests lacked (2026-12-05): an agent whose task lists one
    network sends UDP (a DNS query to a resolver of its own out there, a datagram carrying the
    answer key) or ICMP echo to an unlisted address. pasta carries both out as the helper uid, and
    nftables judges them by that uid as it does TCP: nothing comes back from the unlisted address,
    while the listed one answers both (the control: the probes work)."""
    good, evil = servers
    assert_contained(good, evil)
    sb = await create_sandbox(backend="bwrap", network=True, ttl_s=300, allow=(GOOD_NET,))
    try:
        r = await sb.exec(["python3", "-c", OTHER_WAYS, good, evil], timeout=120)
    finally:
        await sb.close()
    assert r.exit_code == 0, r.stderr
    seen = {(t, kind): rest for t, kind, *rest in (line.split() for line in r.stdout.splitlines())}
    assert seen[(good, "udp")] == ["GOT", "GOOD-OK"], r.stdout
    assert seen[(evil, "udp")][0] == "ERR", r.stdout
    if seen[(good, "icmp")][0] == "GOT":  # (pasta answers echo through a ping socket of the host's, where allowed)
        assert seen[(evil, "icmp")][0] == "ERR", r.stdout
    else:  # no ICMP socket in the sandbox (seccomp, ping_group_range): no way out by ICMP either
        assert seen[(good, "icmp")][0] == seen[(evil, "icmp")][0] == "NOSOCKET", r.stdout
