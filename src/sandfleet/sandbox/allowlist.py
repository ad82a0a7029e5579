"""Allowlist networking (``Limits(network=True, allow=(...))``, Harbor ``network_mode =
"allowlist"``): egress only to the listed host names and IPv4 CIDRs, on the same pasta and
nftables path as ``network=True`` (sandbox/network.py).

- **Egress.** Each sandbox's pasta runs as a host uid of its own (its uid slot's owner). The
  ``inet sandfleet`` table sends that uid's packets through a chain ``al_<uid>``
  (``meta skuid vmap @allowlisted``): accepted only to the addresses of the set ``al_<uid>``,
  the listed CIDRs plus the addresses the sandbox's resolver answered for listed names;
  everything else is rejected, an address dialled directly too. Host addresses (``fib daddr
  type local``) and link-local (169.254/16) stay rejected even when listed.
- **DNS.** The sandbox's ``/etc/resolv.conf`` names ``127.0.0.1``; pasta carries its port 53
  (UDP) to a resolver sandfleet runs for this sandbox on a host-loopback port (a thread of the
  sandbox's owner: it ends with it). It answers A queries for listed names only (``*.example.com``
  lists the subdomains), from ``Limits.hosts`` (static answers, as ``/etc/hosts``) or the
  host's resolver, and adds each answer to the set before replying; anything else is NXDOMAIN.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import subprocess
import threading
from collections.abc import Callable, Iterable

from sandfleet.errors import SandboxError

TTL = 60
NXDOMAIN, REFUSED = 3, 5


def parse_allow(entries: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names, IPv4 networks) of an allowlist; ValueError naming a bad entry."""
    names: list[str] = []
    nets: list[str] = []
    for raw in entries:
        entry = str(raw).strip().lower().rstrip(".")
        if entry == "*":  # every name (a public phase of a task whose other phase is allowlisted)
            names.append(entry)
            continue
        try:
            net = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            net = None
        if net is not None:
            if net.version != 4:
                raise ValueError(f"allowlist entry {raw!r}: IPv6 is not served (sandboxes are IPv4 only)")
            nets.append(str(net))
            continue
        label = entry.removeprefix("*.")
        if not label or ":" in entry or "/" in entry or not all(
                part and len(part) < 64 and part.replace("-", "").replace("_", "").isalnum()
                for part in label.split(".")):
            raise ValueError(f"allowlist entry {raw!r} is neither a host name (or *.domain) nor an IPv4 "
                             "address/CIDR (ports are not part of an entry)")
        names.append(entry)
    return tuple(dict.fromkeys(names)), tuple(dict.fromkeys(nets))


def parse_deny(entries: Iterable[str]) -> tuple[str, ...]:
    """The IPv4 networks of a denylist (E2B's denyOut: addresses only); ValueError naming a bad entry."""
    names, nets = parse_allow(entries)
    if names:
        raise ValueError(f"deny entry {names[0]!r}: a denylist takes IPv4 addresses and CIDRs, not names")
    return nets


EVERYWHERE = ("*", "0.0.0.0/0")
"""An allowlist that lists everything: a public phase of a task whose other phase is
allowlisted (the sandbox keeps its resolver and chain, so the phases can switch)."""


def name_allowed(name: str, names: Iterable[str]) -> bool:
    name = name.lower().rstrip(".")
    for n in names:
        if n == "*" or n.startswith("*.") and name.endswith(n[1:]) or n == name:
            return True
    return False


# ---------------------------------------------------------------- DNS


def _question(data: bytes) -> tuple[int, str, int, int]:
    """(id, name, qtype, end offset of the question) of a query; ValueError when malformed."""
    if len(data) < 12:
        raise ValueError("short")
    qid, _flags, qd = struct.unpack("!HHH", data[:6])
    if qd != 1:
        raise ValueError("one question")
    i, labels = 12, []
    while True:
        n = data[i]
        if n == 0:
            i += 1
            break
        if n & 0xC0:
            raise ValueError("compressed question")
        labels.append(data[i + 1:i + 1 + n].decode("ascii", errors="replace"))
        i += 1 + n
    qtype, _qclass = struct.unpack("!HH", data[i:i + 4])
    return qid, ".".join(labels), qtype, i + 4


def _answer(query: bytes, end: int, qid: int, rcode: int, addrs: list[str]) -> bytes:
    flags = 0x8180 | rcode  # a response, recursion desired and available
    header = struct.pack("!HHHHHH", qid, flags, 1, len(addrs), 0, 0)
    out = header + query[12:end]
    for a in addrs:
        out += struct.pack("!HHHIH", 0xC00C, 1, 1, TTL, 4) + socket.inet_aton(a)
    return out


class Resolver:
    """The sandbox's DNS server on ``127.0.0.1:<port>`` of the host (UDP): answers for listed
    names only, and admits each answer's addresses (``admit``) before replying."""

    def __init__(self, names: tuple[str, ...], hosts: dict[str, str], admit: Callable[[list[str]], None],
                 *, answer_all: bool = False):
        self.names, self.hosts, self.admit = names, {k.lower().rstrip("."): v for k, v in hosts.items()}, admit
        self.answer_all = answer_all
        """A denylist (``deny``): every name is answered, only listed names' answers admitted."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.queries: list[tuple[str, str]] = []
        """(name, what was answered) of each query, for the tests and the log."""
        self._thread = threading.Thread(target=self._serve, name=f"sandfleet-dns-{self.port}", daemon=True)
        self._thread.start()

    def lookup(self, name: str) -> list[str]:
        if name in self.hosts:
            return [self.hosts[name]]
        try:
            infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            return []
        return list(dict.fromkeys(str(i[4][0]) for i in infos))

    def respond(self, data: bytes) -> bytes | None:
        try:
            qid, name, qtype, end = _question(data)
        except (ValueError, IndexError, struct.error):
            return None
        name = name.lower().rstrip(".")
        listed = name_allowed(name, self.names)
        if not listed and not self.answer_all:
            self.queries.append((name, "NXDOMAIN (not listed)"))
            return _answer(data, end, qid, NXDOMAIN, [])
        addrs = self.lookup(name) if qtype in (1, 255) else []
        if qtype in (1, 255) and not addrs:
            self.queries.append((name, "NXDOMAIN"))
            return _answer(data, end, qid, NXDOMAIN, [])
        if addrs and listed:
            self.admit(addrs)
        self.queries.append((name, " ".join(addrs) or "no A record asked"))
        return _answer(data, end, qid, 0, addrs)

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            try:
                reply = self.respond(data)
            except SandboxError:  # the firewall could not admit the answer: refuse it
                with contextlib.suppress(ValueError, IndexError, struct.error):
                    qid, _, _, end = _question(data)
                    reply = _answer(data, end, qid, REFUSED, [])
            if reply is not None:
                with contextlib.suppress(OSError):
                    self.sock.sendto(reply, peer)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(timeout=5)


# ---------------------------------------------------------------- nftables


def ruleset(table: str, uid: int, nets: Iterable[str], dns_port: int, deny: Iterable[str] | None = None) -> str:
    """The nft script that puts helper ``uid`` behind its allowlist (idempotent); with
    ``deny`` (CIDRs), a denylist instead: what is listed passes, what is denied is rejected,
    the rest passes (E2B's allowOut over denyOut)."""
    t, c = f"inet {table}", f"al_{uid}"
    elements = ", ".join(nets)
    denied = ", ".join(deny or ())
    tail = ([f"add set {t} dn_{uid} {{ type ipv4_addr; flags interval; }}", f"flush set {t} dn_{uid}",
             *([f"add element {t} dn_{uid} {{ {denied} }}"] if denied else []),
             f"add rule {t} {c} ip daddr @dn_{uid} meta l4proto tcp counter reject with tcp reset",
             f"add rule {t} {c} ip daddr @dn_{uid} counter reject", f"add rule {t} {c} return"]
            if deny is not None else
            [f"add rule {t} {c} meta l4proto tcp counter reject with tcp reset", f"add rule {t} {c} counter reject"])
    return "\n".join([
        f"add chain {t} {c}",
        f"flush chain {t} {c}",
        f"add set {t} {c} {{ type ipv4_addr; flags interval; }}",
        f"flush set {t} {c}",
        *([f"add element {t} {c} {{ {elements} }}"] if elements else []),
        f"add rule {t} {c} ip daddr 127.0.0.1 udp dport {dns_port} accept",  # its resolver
        f"add rule {t} {c} ip daddr 127.0.0.1 tcp dport @forward return",  # Limits.forward: the helper chain
        f"add rule {t} {c} fib daddr type local counter reject",  # the host, even when listed
        f"add rule {t} {c} ip daddr 169.254.0.0/16 counter reject",  # link-local, even when listed
        f"add rule {t} {c} ip daddr @{c} return",
        *tail,
        f"add element {t} allowlisted {{ {uid} : jump {c} }}",
        "",
    ])


def admit_script(table: str, uid: int, addrs: Iterable[str]) -> str:
    return f"add element inet {table} al_{uid} {{ {', '.join(addrs)} }}\n"


def removal(table: str, uid: int) -> list[str]:
    """nft commands that take ``uid`` out of allowlisting (each may fail when absent)."""
    t, c = f"inet {table}", f"al_{uid}"
    return [f"delete element {t} allowlisted {{ {uid} }}", f"flush chain {t} {c}", f"delete chain {t} {c}",
            f"delete set {t} {c}", f"delete set {t} dn_{uid}"]


def run_quiet(nft: str, commands: list[str]) -> None:
    for cmd in commands:
        subprocess.run([nft, "-f", "-"], input=cmd + "\n", capture_output=True, text=True)


class Egress:
    """One sandbox's allowlist: its resolver and its nftables chain and set, for helper ``uid``.
    ``nft(script)`` runs an nft script (raising SandboxError); ``nft_path`` for the removal."""

    def __init__(self, uid: int, allow: Iterable[str], hosts: dict[str, str], *, table: str,
                 nft: Callable[[str], None], nft_path: str, deny: Iterable[str] | None = None):
        self.uid, self.table, self._nft, self._nft_path = uid, table, nft, nft_path
        self.names, self.nets = parse_allow(allow)
        self.deny = parse_deny(deny) if deny is not None else None
        self._covered = [ipaddress.ip_network(n) for n in self.nets]
        self._admitted: set[str] = set()
        self._lock = threading.Lock()
        self.resolver = Resolver(self.names, hosts, self.admit, answer_all=self.deny is not None)
        self.closed = False

    def replace(self, allow: Iterable[str]) -> None:
        """Another policy for the same sandbox (a task's verifier phase): the listed names and
        CIDRs from now on, what the resolver answered before forgotten; established flows to
        addresses no longer listed are cut too (every packet is judged)."""
        names, nets = parse_allow(allow)
        with self._lock:
            script = f"flush set inet {self.table} al_{self.uid}\n"
            if nets:
                script += f"add element inet {self.table} al_{self.uid} {{ {', '.join(nets)} }}\n"
            self._nft(script)
            self.names, self.nets = names, nets
            self._covered = [ipaddress.ip_network(n) for n in nets]
            self._admitted = set()
            self.resolver.names = names

    def install(self) -> None:
        """Put the helper uid behind the allowlist (the caller holds the firewall lock and has
        made the table)."""
        self._nft(ruleset(self.table, self.uid, self.nets, self.resolver.port, self.deny))

    def admit(self, addrs: list[str]) -> None:
        """Let the sandbox reach ``addrs`` (a listed name's answer)."""
        with self._lock:
            new = [a for a in addrs if a not in self._admitted
                   and not any(ipaddress.ip_address(a) in n for n in self._covered)]
            if new:
                self._nft(admit_script(self.table, self.uid, new))
                self._admitted.update(new)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.resolver.close()
        run_quiet(self._nft_path, removal(self.table, self.uid))
