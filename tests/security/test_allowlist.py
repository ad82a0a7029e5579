"""Allowlist networking (issue 31): ``Limits(network=True, allow=...)`` reaches the listed host
names and CIDRs only, through the same pasta and nftables path as ``network=True``; DNS answers
come from a resolver sandfleet runs for the sandbox, for listed names only; the host and
link-local stay blocked even when listed.

Offline: the "internet" is two network namespaces this test makes (behind veth pairs, in
198.18.0.0/15, the benchmarking range), and the names are given to the sandbox's resolver
(``Limits.hosts``). Every target is checked to be routed into a namespace of ours first."""

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
GOOD, EVIL = "198.18.5.10", "198.18.6.10"

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
    with peer_namespace("ag", "198.18.5.1/24", f"{GOOD}/24", "GOOD-OK") as good, \
            peer_namespace("ae", "198.18.6.1/24", f"{EVIL}/24", "EVIL-REACHED") as evil:
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
    sb = await create_sandbox(backend="bwrap", network=True, ttl_s=300, allow=("198.18.6.0/24",))
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
