"""User-mode networking for sandboxes and image-build steps (``Limits(network=True)``).

Every bwrap sandbox has a network namespace of its own. Without network it holds only
``lo``. With network, a pasta process (package ``passt``) serves a tap interface ``eth0``
in it and carries the sandbox's TCP/UDP flows over ordinary sockets on the host, so the
sandbox never touches a host interface, route or firewall:

- pasta runs as a dedicated host uid (:func:`helper_uid`, default the owner of the sandbox's
  uid slot, ``base + 65537`` (sandbox/uids.py): no sandbox process runs as it), with
  CAP_SYS_ADMIN/CAP_NET_ADMIN only long enough to join the user namespace that owns the
  sandbox's network namespace; after that it has capabilities in that namespace only, none
  on the host.
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

The helper dies with its sandbox: ``close()`` kills it. It runs in the foreground as the
child of ``sandfleet-agent tether``, which ends it when the owner process ends however it
ends (SIGKILL included; a daemonized pasta moved to a pid namespace of its own and outlived
such an owner), and dies with it (pasta's parent-death signal names the tether). Its pid is
also in the sandbox's ``meta.json`` for the reaper.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sandfleet.agent.build import agent_binary
from sandfleet.errors import HostUnsupportedError, SandboxError
from sandfleet.reaping import reap_pid
from sandfleet.sandbox import uids
from sandfleet.sandbox.allowlist import Egress, run_quiet
from sandfleet.sandbox.spec import UID_STRIDE, BwrapConfig, Limits
from sandfleet.settings import current as current_settings

if TYPE_CHECKING:
    from sandfleet.sandbox.uids import Slot
from sandfleet.sandbox.state import list_sandboxes, proc_start_time, read_meta, state_root, write_meta

NET_UID_OFFSET = UID_STRIDE - 1
"""The helper's host uid is the slot's ``base + NET_UID_OFFSET`` (its owner), unless
$SANDFLEET_NET_UID says otherwise."""
TABLE = "sandfleet"
ADDRESS, NETMASK, GATEWAY = "169.254.1.2", "24", "169.254.1.1"
IFNAME = "eth0"
NS_GET_USERNS = 0xB701  # ioctl on a namespace fd: the user namespace that owns it
META_FORWARD = "net_forward"
"""meta.json key: host-loopback TCP ports a sandbox forwards (kept open in nftables while it lives)."""


def helper_uid(config: BwrapConfig | None = None, slot_base: int | None = None) -> int:
    """The host uid that runs the network helper: $SANDFLEET_NET_UID, or the owner of the
    sandbox's uid slot, ``base + 65537`` (``uid_base + 65537`` for slot 0 and image builds)."""
    cfg = config or BwrapConfig()
    env = (current_settings().net_uid or "").strip()
    if env:
        if not env.isdigit() or not 0 < int(env) < 2**32 - 1:
            raise HostUnsupportedError(f"SANDFLEET_NET_UID must be a host uid number, not {env!r}")
        uid = int(env)
    else:
        return (cfg.uid_base if slot_base is None else slot_base) + NET_UID_OFFSET
    end = cfg.uid_base + cfg.slots * UID_STRIDE
    if cfg.uid_base <= uid < end:
        raise HostUnsupportedError(f"network helper uid {uid} is inside the sandboxes' uid range "
                                   f"{cfg.uid_base}..{end - 1}")
    return uid


def _tool(name: str) -> str | None:
    """A helper binary by absolute path: $SANDFLEET_PASTA / $SANDFLEET_NFT / $SANDFLEET_SETPRIV
    when set (None if that is not executable), else the first in the system directories."""
    env = {"pasta": current_settings().pasta, "nft": current_settings().nft,
           "setpriv": current_settings().setpriv}.get(name)
    if env is not None:
        return env if Path(env).is_absolute() and os.access(env, os.X_OK) else None
    for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if os.access(f"{d}/{name}", os.X_OK):
            return f"{d}/{name}"
    return None  # never through $PATH: this runs as root


def availability() -> dict[str, object]:
    """Whether user-mode networking works on this host, and why not (for doctor and create)."""
    missing = [f"{name} (apt-get install {pkg})" for name, pkg in
               (("pasta", "passt"), ("nft", "nftables"), ("setpriv", "util-linux")) if not _tool(name)]
    if missing:
        return {"available": False, "reason": "missing " + ", ".join(missing)}
    if os.geteuid() != 0:
        return {"available": False, "reason": "needs root (the helper joins the sandbox's namespaces)"}
    who = (f"host uid {helper_uid()}" if (current_settings().net_uid or "").strip()
           else f"each uid slot's owner (slot 0: host uid {helper_uid()})")
    return {"available": True, "reason": f"pasta as {who}, nftables table inet {TABLE}"}


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
        f"add map {t} allowlisted {{ type uid : verdict; }}",  # helper uid -> its allowlist (allowlist.py)
        f"add chain {t} helper",
        f"add chain {t} output {{ type filter hook output priority 0; policy accept; }}",
        f"flush chain {t} output",
        f"flush chain {t} helper",
        # only sockets owned by a helper uid are judged; everything else passes untouched
        f"add rule {t} output meta skuid @helpers jump helper",
        f"add rule {t} helper meta skuid vmap @allowlisted",
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


def _live_forwards(exclude: str | None = None) -> set[int]:
    out: set[int] = set()
    for m in list_sandboxes():
        if m.get("id") != exclude and m.get("alive") and not m.get("expired"):
            out.update(int(p) for p in m.get(META_FORWARD) or [])
    return out


def ensure_firewall(uid: int, forward: Iterable[int] = (), *, exclude: str | None = None) -> None:
    """Make (or repair) the ``inet sandfleet`` table for helper ``uid``, and set its open
    host-loopback ports to ``forward`` plus those of live sandboxes (their meta.json), less
    sandbox ``exclude``'s. One atomic nft transaction; rerunning it changes nothing."""
    with _locked():
        ports = sorted(_live_forwards(exclude) | set(forward))
        script = _ruleset(uid) + f"flush set inet {TABLE} forward\n"
        if ports:
            script += f"add element inet {TABLE} forward {{ {', '.join(map(str, ports))} }}\n"
        _nft(script)


def allowlist_resolv_conf() -> Path:
    """The ``/etc/resolv.conf`` of every allowlisted sandbox: ``127.0.0.1``, whose port 53 its
    pasta carries to that sandbox's own resolver (one file for all, in the state directory)."""
    path = state_root() / ".allowlist-resolv.conf"
    text = "nameserver 127.0.0.1\noptions attempts:2 timeout:2\n"
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(0o644)
        tmp.replace(path)
    return path


# ---------------------------------------------------------------- the helper


def _netns(pid: int) -> int:
    return Path(f"/proc/{pid}/ns/net").stat().st_ino


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for t in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (t / "children").read_text().split()]
    return out


def netns_holder(root_pid: int, timeout: float = 10.0) -> int:
    """The first descendant of ``root_pid`` (itself included) in a network namespace other
    than this process's: the launcher's (or bwrap's) child, the sandbox's pid 1, for a launcher pid."""
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
    egress: Egress | None = field(default=None, repr=False)
    """The sandbox's allowlist (resolver, nftables chain), ended with the helper."""
    tether: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    """pasta's parent (``sandfleet-agent tether``), our child: reaped by :meth:`close`."""

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
            if reap_pid(self.pid, self.start):  # its tether died first: where we are a subreaper, ours
                break
            time.sleep(0.005)
        if self.tether is not None:  # it ends with pasta (its child); killed if it lingers
            try:
                self.tether.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.tether.kill()
                self.tether.wait()
        if self.forward:  # close the ports no live sandbox forwards any more
            with contextlib.suppress(SandboxError, HostUnsupportedError, OSError, ValueError):
                ensure_firewall(self.uid, exclude=self.owner)
        if self.egress is not None:
            with _locked():
                self.egress.close()


def attach(holder_pid: int, *, rundir: Path, uid: int | None = None, forward: Iterable[int] = (),
           owner: str | None = None, allow: Iterable[str] | None = None, hosts: dict[str, str] | None = None,
           deny: Iterable[str] | None = None, map_gw: bool = False) -> Helper:
    """Start pasta for the network namespace of ``holder_pid`` (a process inside it).

    ``rundir``: a private directory for pasta's pid file and log (made if missing).
    ``forward``: host-loopback TCP ports reachable as 127.0.0.1:<port> inside.
    ``owner``: the sandbox id whose meta.json lists ``forward`` (so closing another sandbox
    keeps them open). Returns when the interface is configured; raises SandboxError (with
    pasta's message) when it can't be, HostUnsupportedError when the host lacks the tools.
    ``allow``: egress only to these host names and IPv4 CIDRs, names resolved by a resolver of
    the sandbox's own (sandbox/allowlist.py); ``hosts``: that resolver's static answers;
    ``deny``: a denylist instead (what ``allow`` lists passes it). ``map_gw``: the gateway
    address leads to the host's loopback (the firewall still opens only forwarded ports): for
    a sandbox whose own loopback is not the namespace's (gVisor's netstack)."""
    check_available()
    ports = _check_ports(forward)
    if allow is not None and (current_settings().net_uid or "").strip():
        raise HostUnsupportedError("allowlist networking needs a network helper uid per sandbox; "
                                   "unset SANDFLEET_NET_UID")
    uid = helper_uid() if uid is None else uid
    if not (current_settings().net_uid or "").strip() and not uids.holds_owner(uid):
        # the firewall keys a helper's rules (and an allowlist) by its uid: one that this
        # process does not hold as a slot's owner may be a live sandbox's of another (below,
        # its allowlist entry would be cleared as stale)
        raise SandboxError(f"network helper uid {uid} is not the owner of a uid slot this process holds "
                           "(take one with sandbox.uids.take_slot)")
    ensure_firewall(uid, ports)
    egress = None
    if allow is None:  # an allowlisted sandbox of this uid whose owner was killed left its map entry
        with _locked():
            run_quiet(str(_tool("nft")), [f"delete element inet {TABLE} allowlisted {{ {uid} }}"])
    else:
        egress = Egress(uid, allow, hosts or {}, table=TABLE, nft=_nft, nft_path=str(_tool("nft")), deny=deny)
        try:
            with _locked():
                egress.install()
        except BaseException:
            egress.close()
            raise
    try:
        return _start(holder_pid, rundir, uid, ports, owner, egress, map_gw)
    except BaseException:
        if egress is not None:
            with _locked():
                egress.close()
        raise


def _start(holder_pid: int, rundir: Path, uid: int, ports: tuple[int, ...], owner: str | None,
           egress: Egress | None, map_gw: bool = False) -> Helper:
    rundir.mkdir(mode=0o700, parents=True, exist_ok=True)
    pidfile = rundir / "pasta.pid"
    pidfile.unlink(missing_ok=True)
    log = rundir / "pasta.log"
    # pasta (as the helper uid) writes its pid through an fd of ours: rundir may be private
    pfd = os.open(pidfile, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    os.fchown(pfd, uid, uid)
    net = os.open(f"/proc/{holder_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        user = fcntl.ioctl(net, NS_GET_USERNS)
    except OSError:
        os.close(net)
        os.close(pfd)
        raise
    try:
        caps = "-all,+sys_admin,+net_admin"
        # pasta in the foreground, as the child of a tether (sandfleet-agent tether) that ends
        # it when this process ends, however it ends: a daemonized pasta moves to a pid
        # namespace of its own and outlived an owner killed with SIGKILL. setpriv sets pasta's
        # parent-death signal again after the uid change (the tether dies: so does pasta).
        argv = [str(agent_binary()), "tether", str(os.getpid()), "--",
                str(_tool("setpriv")), "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
                "--inh-caps", caps, "--ambient-caps", caps, "--pdeathsig", "KILL", "--",
                str(_tool("pasta")), "--foreground", "--quiet", "-4", "--config-net", "-I", IFNAME,
                "-a", ADDRESS, "-n", NETMASK, "-g", GATEWAY, *([] if map_gw else ["--no-map-gw"]),
                "--no-dhcp", "--no-ndp", "--no-dhcpv6", "--no-ra",
                "-t", "none", "-u", "none", "-U", f"53:{egress.resolver.port}" if egress else "none",
                "-T", ",".join(map(str, ports)) if ports else "none",
                "-P", f"/proc/self/fd/{pfd}",
                "--userns", f"/proc/self/fd/{user}", "--netns", f"/proc/self/fd/{net}"]
        with open(log, "wb") as err:
            # a session of its own: a terminal's ^C to the owner's group is the owner's to handle
            tether = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                      pass_fds=(net, user, pfd), env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                                      cwd=rundir, start_new_session=True)
    finally:
        for fd in (user, net, pfd):
            os.close(fd)
    pid = _wait_configured(tether, pidfile, timeout=30.0)
    if not pid:
        text = log.read_text(errors="replace") if log.exists() else ""
        detail = " ".join(ln for ln in text.splitlines() if ln.strip() and "syslog" not in ln).strip()
        raise SandboxError(f"network helper (pasta) failed: {detail or f'exit status {tether.returncode}'}")
    return Helper(pid=pid, start=proc_start_time(pid), uid=uid, forward=ports, owner=owner, egress=egress,
                  tether=tether)


def _wait_configured(tether: subprocess.Popen[bytes], pidfile: Path, timeout: float) -> int:
    """pasta's pid once it has configured the namespace (in the foreground it writes its pid
    file last, in one write), or 0 when it exited first or took longer than ``timeout``
    (then it is killed; the tether has been reaped either way)."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        with contextlib.suppress(OSError):
            text = pidfile.read_text()
            if text.endswith("\n") and text.strip().isdigit():
                return int(text)
        if tether.poll() is not None:
            return 0
        if time.monotonic() > deadline:
            tether.kill()  # pasta has the tether as its parent-death signal's parent
            tether.wait()
            return 0
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


async def attach_sandbox(sdir: Path, sid: str, root_pid: int, limits: Limits, config: BwrapConfig,
                         slot: Slot | None = None) -> Helper:
    """Give the bwrap sandbox ``sid`` (started as ``root_pid``, in uid ``slot``) its network,
    and record the helper in its meta.json (pid for the reaper, forwarded ports for the firewall)."""
    check_available()
    meta = read_meta(sdir) or {"id": sid}
    write_meta(sdir, {**meta, META_FORWARD: list(limits.forward)})  # before the firewall reads it
    loop = asyncio.get_running_loop()

    def run() -> Helper:
        holder = netns_holder(root_pid)
        uid = helper_uid(config, slot.base if slot else None)
        return attach(holder, rundir=sdir / "net", uid=uid, forward=limits.forward, owner=sid, allow=limits.allow,
                      hosts=dict(limits.hosts), deny=limits.deny)

    fut = loop.run_in_executor(None, run)
    try:
        helper = await asyncio.shield(fut)
    except asyncio.CancelledError:  # the thread goes on: whatever it starts is killed
        fut.add_done_callback(lambda f: f.result().close() if not f.cancelled() and not f.exception() else None)
        raise
    meta = read_meta(sdir) or meta
    pids = [*meta.get("pids", []), helper.pid]
    starts = {**meta.get("pid_starts", {}), str(helper.pid): helper.start}
    write_meta(sdir, {**meta, "pids": pids, "pid_starts": starts, **helper.meta()})
    return helper


def switch_allowlist(sandbox: object, allow: Iterable[str]) -> None:
    """Give a live allowlisted sandbox another allowlist (a task's verifier phase).
    SandboxError where the sandbox has none to switch (another backend, or no allowlist)."""
    helper = getattr(sandbox, "net", None)
    egress = getattr(helper, "egress", None)
    if not isinstance(egress, Egress):
        raise SandboxError(f"{getattr(sandbox, 'backend', 'this')} sandbox {getattr(sandbox, 'id', '')} has no "
                           "allowlist to switch (allowlisted phases need a bwrap sandbox made with allow=)")
    with _locked():
        egress.replace(allow)


class StepNetwork:
    """Networking for one image-build step (a bwrap with ``--unshare-net`` run by a plain
    subprocess): bwrap reports its child once the namespaces exist and waits until the
    helper is attached before it runs the step::

        net = StepNetwork(rundir, uid=helper_uid(config, slot.base))  # the step's uid slot, held
        cmd = [..., bwrap, *net.bwrap_args, ..., "--", *argv]
        proc = subprocess.Popen(cmd, pass_fds=net.pass_fds, ...)
        net.start(proc.pid)  # after Popen, before waiting for the step
        ...
        net.close()          # in a finally: kills the helper, closes the fds

    Whatever runs bwrap (the launcher) must keep the two fds open across its exec.
    """

    def __init__(self, rundir: Path, *, uid: int):
        check_available()
        self.rundir, self.uid = rundir, uid
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
        poller = select.poll()  # not select(): fds past FD_SETSIZE (1024) in a busy owner
        poller.register(self._info_r, select.POLLIN)
        while b"}" not in info:  # bwrap writes {"child-pid": N} when the namespaces exist
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise SandboxError("build step: bwrap did not report its namespace in time")
            chunk = os.read(self._info_r, 4096)
            if not chunk:
                raise SandboxError("build step exited before its network could be set up")
            info += chunk
        child = int(json.loads(info[: info.index(b"}") + 1])["child-pid"])
        if _netns(child) == _netns(os.getpid()):
            raise SandboxError("build step has no network namespace of its own (bwrap without --unshare-net)")
        self.helper = attach(child, rundir=self.rundir, uid=self.uid)
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
