"""User-mode networking for sandboxes and image-build steps (``Limits(network=True)``).

Every bwrap sandbox has a network namespace of its own. Without network it holds only
``lo``. With network, a pasta process (package ``passt``) serves a tap interface ``eth0``
in it and carries the sandbox's TCP/UDP flows over ordinary sockets on the host, so the
sandbox never touches a host interface, route or firewall:

- pasta runs as a dedicated host uid (:func:`helper_uid`, default ``uid_base + 65537``: no
  sandbox process runs as it), with CAP_SYS_ADMIN/CAP_NET_ADMIN only long enough to join
  the user namespace that owns the sandbox's network namespace; after that it has
  capabilities in that namespace only, none on the host.
- The nftables table ``inet sandfleet`` (made on first use, idempotently, and left in
  place) rejects that uid's traffic to every address of this host (``fib daddr type
  local``: 127/8, ::1, and the host's own addresses) and to link-local 169.254/16 and
  fe80::/10 (cloud metadata), except host-loopback TCP ports that a live sandbox forwards.
- Host loopback is not mapped into the sandbox (``--no-map-gw``) and no port is forwarded
  in either direction unless asked: ``Limits(forward=(8000,))`` makes ``127.0.0.1:8000``
  inside the sandbox reach ``127.0.0.1:8000`` on the host (how a task reaches a model
  server), and nothing else.
- The sandbox's address is link-local (``169.254.1.2/24``, gateway ``169.254.1.1``, IPv4
  only): identical in every sandbox, and the gateway address leads nowhere.

The helper dies with its sandbox: ``close()`` kills it, and its pid is in the sandbox's
``meta.json`` so the reaper kills it when the owner died first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sandfleet.errors import HostUnsupportedError, SandboxError
from sandfleet.sandbox.spec import SANDBOX_UIDS, BwrapConfig
from sandfleet.sandbox.state import list_sandboxes, proc_start_time, state_root

NET_UID_OFFSET = SANDBOX_UIDS + 1
"""The helper's host uid is ``uid_base + NET_UID_OFFSET`` unless $SANDFLEET_NET_UID says otherwise."""
TABLE = "sandfleet"
ADDRESS, NETMASK, GATEWAY = "169.254.1.2", "24", "169.254.1.1"
IFNAME = "eth0"
NS_GET_USERNS = 0xB701  # ioctl on a namespace fd: the user namespace that owns it
META_FORWARD = "net_forward"
"""meta.json key: host-loopback TCP ports a sandbox forwards (kept open in nftables while it lives)."""


def helper_uid(config: BwrapConfig | None = None) -> int:
    """The host uid that runs the network helper: $SANDFLEET_NET_UID, or ``uid_base + 65537``."""
    cfg = config or BwrapConfig()
    env = os.environ.get("SANDFLEET_NET_UID", "").strip()
    if env:
        if not env.isdigit() or not 0 < int(env) < 2**32 - 1:
            raise HostUnsupportedError(f"SANDFLEET_NET_UID must be a host uid number, not {env!r}")
        uid = int(env)
    else:
        uid = cfg.uid_base + NET_UID_OFFSET
    if cfg.uid_base <= uid <= cfg.uid_base + SANDBOX_UIDS:
        raise HostUnsupportedError(f"network helper uid {uid} is inside the sandbox uid range "
                                   f"{cfg.uid_base}..{cfg.uid_base + SANDBOX_UIDS}")
    return uid


def _tool(name: str) -> str | None:
    for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if os.access(f"{d}/{name}", os.X_OK):
            return f"{d}/{name}"
    return shutil.which(name)


def availability() -> dict[str, object]:
    """Whether user-mode networking works on this host, and why not (for doctor and create)."""
    missing = [f"{name} (apt-get install {pkg})" for name, pkg in
               (("pasta", "passt"), ("nft", "nftables"), ("setpriv", "util-linux")) if not _tool(name)]
    if missing:
        return {"available": False, "reason": "missing " + ", ".join(missing)}
    if os.geteuid() != 0:
        return {"available": False, "reason": "needs root (the helper joins the sandbox's namespaces)"}
    return {"available": True, "reason": f"pasta as host uid {helper_uid()}, nftables table inet {TABLE}"}


def check_available() -> None:
    """Raise HostUnsupportedError naming what is missing for ``network=True``."""
    a = availability()
    if not a["available"]:
        raise HostUnsupportedError(f"network=True needs user-mode networking: {a['reason']}")


# ---------------------------------------------------------------- nftables


def _nft(script: str) -> None:
    nft = _tool("nft")
    if nft is None:
        raise HostUnsupportedError("nft is not installed: apt-get install nftables")
    p = subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True)
    if p.returncode != 0:
        raise SandboxError(f"nftables: {p.stderr.strip() or 'nft failed'}")


def _ruleset(uid: int) -> str:
    t = f"inet {TABLE}"
    return "\n".join([
        f"add table {t}",
        f"add set {t} helpers {{ typeof meta skuid; }}",
        f"add set {t} forward {{ typeof tcp dport; }}",
        f"add chain {t} helper",
        f"add chain {t} output {{ type filter hook output priority 0; policy accept; }}",
        f"flush chain {t} output",
        f"flush chain {t} helper",
        # only sockets owned by a helper uid are judged; everything else passes untouched
        f"add rule {t} output meta skuid @helpers jump helper",
        f"add rule {t} helper ip daddr 127.0.0.1 tcp dport @forward accept",
        f"add rule {t} helper fib daddr type local counter reject",
        f"add rule {t} helper ip daddr 169.254.0.0/16 counter reject",
        f"add rule {t} helper ip6 daddr {{ fe80::/10, ::1 }} counter reject",
        f"add element {t} helpers {{ {uid} }}",
        "",
    ])


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with open(state_root() / ".network.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_firewall(uid: int, forward: Iterable[int] = ()) -> None:
    """Make (or repair) the ``inet sandfleet`` table for helper ``uid`` and open ``forward``.
    One atomic nft transaction; rerunning it changes nothing."""
    ports = sorted(set(forward))
    script = _ruleset(uid)
    if ports:
        script += f"add element inet {TABLE} forward {{ {', '.join(map(str, ports))} }}\n"
    with _locked():
        _nft(script)


def _live_forwards(exclude: str | None = None) -> set[int]:
    out: set[int] = set()
    for m in list_sandboxes():
        if m.get("id") != exclude and m.get("alive") and not m.get("expired"):
            out.update(int(p) for p in m.get(META_FORWARD) or [])
    return out


def prune_forwards(exclude: str | None = None) -> None:
    """Close the host-loopback ports that no live sandbox (other than ``exclude``) forwards."""
    nft = _tool("nft")
    if nft is None:
        return
    with _locked():
        p = subprocess.run([nft, "-j", "list", "set", "inet", TABLE, "forward"], capture_output=True, text=True)
        if p.returncode != 0:
            return
        have: set[int] = set()
        for item in json.loads(p.stdout).get("nftables", []):
            have.update(int(e) for e in item.get("set", {}).get("elem", []) if isinstance(e, int))
        stale = have - _live_forwards(exclude)
        if stale:
            _nft(f"delete element inet {TABLE} forward {{ {', '.join(map(str, sorted(stale)))} }}\n")


# ---------------------------------------------------------------- the helper


def _netns(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for t in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [int(c) for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    return out


def netns_holder(root_pid: int, timeout: float = 10.0) -> int:
    """The first descendant of ``root_pid`` (itself included) in a network namespace other
    than this process's: bwrap's child (the sandbox's pid 1) for a launcher or bwrap pid."""
    mine = _netns(os.getpid())
    deadline = time.monotonic() + timeout
    while True:
        todo = [root_pid]
        while todo:
            pid = todo.pop(0)
            with contextlib.suppress(OSError):
                if _netns(pid) != mine:
                    return pid
            todo += _children(pid)
        if time.monotonic() > deadline or proc_start_time(root_pid) is None:
            raise SandboxError(f"no network namespace below pid {root_pid} (did the sandbox die?)")
        time.sleep(0.01)


def _check_ports(forward: Iterable[int]) -> tuple[int, ...]:
    ports = tuple(sorted(set(forward)))
    for p in ports:
        if not isinstance(p, int) or not 0 < p < 65536:
            raise SandboxError(f"invalid forwarded port {p!r}: a TCP port 1..65535")
    return ports


@dataclass
class Helper:
    """A running pasta for one network namespace."""

    pid: int
    start: int | None
    uid: int
    forward: tuple[int, ...] = ()
    owner: str | None = None
    closed: bool = field(default=False, repr=False)

    def meta(self) -> dict[str, object]:
        """What the sandbox's meta.json should add: the pid for the reaper, the open ports."""
        return {"net_pid": self.pid, META_FORWARD: list(self.forward)}

    def alive(self) -> bool:
        return self.start is not None and proc_start_time(self.pid) == self.start

    def close(self) -> None:
        """Kill the helper (its namespace's last user) and close ports nobody forwards now."""
        if self.closed:
            return
        self.closed = True
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        if self.forward:
            with contextlib.suppress(SandboxError, OSError, ValueError):
                prune_forwards(exclude=self.owner)


def attach(holder_pid: int, *, rundir: Path, uid: int | None = None, forward: Iterable[int] = (),
           owner: str | None = None) -> Helper:
    """Start pasta for the network namespace of ``holder_pid`` (a process inside it).

    ``rundir``: a private directory for pasta's pid file and log (made if missing).
    ``forward``: host-loopback TCP ports reachable as 127.0.0.1:<port> inside.
    ``owner``: the sandbox id whose meta.json lists ``forward`` (so closing another sandbox
    keeps them open). Returns when the interface is configured; raises SandboxError (with
    pasta's message) when it can't be, HostUnsupportedError when the host lacks the tools."""
    check_available()
    ports = _check_ports(forward)
    uid = helper_uid() if uid is None else uid
    ensure_firewall(uid, ports)
    rundir.mkdir(parents=True, exist_ok=True)
    os.chown(rundir, uid, uid)
    rundir.chmod(0o700)
    pidfile = rundir / "pasta.pid"
    pidfile.unlink(missing_ok=True)
    log = rundir / "pasta.log"
    net = os.open(f"/proc/{holder_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        user = fcntl.ioctl(net, NS_GET_USERNS)
    except OSError:
        os.close(net)
        raise
    try:
        caps = "-all,+sys_admin,+net_admin"
        argv = [str(_tool("setpriv")), "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
                "--inh-caps", caps, "--ambient-caps", caps, "--",
                str(_tool("pasta")), "--quiet", "-4", "--config-net", "-I", IFNAME,
                "-a", ADDRESS, "-n", NETMASK, "-g", GATEWAY, "--no-map-gw",
                "--no-dhcp", "--no-ndp", "--no-dhcpv6", "--no-ra",
                "-t", "none", "-u", "none", "-U", "none",
                "-T", ",".join(map(str, ports)) if ports else "none",
                "-P", str(pidfile),
                "--userns", f"/proc/self/fd/{user}", "--netns", f"/proc/self/fd/{net}"]
        with open(log, "wb") as err:
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, pass_fds=(net, user),
                               env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, cwd=rundir, timeout=30)
    finally:
        os.close(user)
        os.close(net)
    text = log.read_text(errors="replace") if log.exists() else ""
    detail = " ".join(ln for ln in text.splitlines() if ln.strip() and "syslog" not in ln).strip()
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        pid = 0
    if p.returncode != 0 or not pid:
        raise SandboxError(f"network helper (pasta) failed: {detail or f'exit status {p.returncode}'}")
    return Helper(pid=pid, start=proc_start_time(pid), uid=uid, forward=ports, owner=owner)


class StepNetwork:
    """Networking for one image-build step (a bwrap with ``--unshare-net`` run by a plain
    subprocess): bwrap reports its child once the namespaces exist and waits until the
    helper is attached before it runs the step::

        net = StepNetwork(rundir)
        cmd = [..., bwrap, *net.bwrap_args, ..., "--", *argv]
        proc = subprocess.Popen(cmd, pass_fds=net.pass_fds, ...)
        net.start(proc.pid)  # after Popen, before waiting for the step
        ...
        net.close()          # in a finally: kills the helper, closes the fds

    Whatever runs bwrap (the launcher) must keep the two fds open across its exec.
    """

    def __init__(self, rundir: Path, *, uid: int | None = None, forward: Iterable[int] = ()):
        check_available()
        self.rundir, self.uid, self.forward = rundir, uid, tuple(forward)
        self._info_r, self._info_w = os.pipe()
        self._block_r, self._block_w = os.pipe()
        for fd in (self._info_r, self._block_w):
            os.set_inheritable(fd, False)
        self.helper: Helper | None = None

    @property
    def bwrap_args(self) -> list[str]:
        return ["--info-fd", str(self._info_w), "--block-fd", str(self._block_r)]

    @property
    def pass_fds(self) -> tuple[int, int]:
        return (self._info_w, self._block_r)

    def start(self, pid: int, timeout: float = 60.0) -> Helper:
        """Attach the helper to the step started as ``pid`` (the launcher or bwrap), then let it run."""
        for fd in (self._info_w, self._block_r):  # our copies: the child holds its own now
            with contextlib.suppress(OSError):
                os.close(fd)
        self._info_w = self._block_r = -1
        info = b""
        deadline = time.monotonic() + timeout
        while b"}" not in info:  # bwrap writes {"child-pid": N} when the namespaces exist
            import select

            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._info_r], [], [], left)[0]:
                raise SandboxError("build step: bwrap did not report its namespace in time")
            chunk = os.read(self._info_r, 4096)
            if not chunk:
                raise SandboxError("build step exited before its network could be set up")
            info += chunk
        child = int(json.loads(info[: info.index(b"}") + 1])["child-pid"])
        if _netns(child) == _netns(os.getpid()):
            raise SandboxError("build step has no network namespace of its own (bwrap without --unshare-net)")
        self.helper = attach(child, rundir=self.rundir, uid=self.uid, forward=self.forward)
        os.write(self._block_w, b"x")
        return self.helper

    def close(self) -> None:
        if self.helper is not None:
            self.helper.close()
        for fd in (self._info_r, self._info_w, self._block_r, self._block_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._info_r = self._info_w = self._block_r = self._block_w = -1
