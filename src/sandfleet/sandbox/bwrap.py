"""The ``bwrap`` backend: Linux namespaces with bubblewrap, cgroup limits, overlay root.

Start-up of one sandbox (all in one exec chain, no shell; docs/security.md, "The uid model"):

1. ``sandfleet-agent launch`` (as root on the host) joins the sandbox's cgroups, makes a
   private mount namespace, attaches the disk limit (an ext4 filesystem on a loop device,
   mounted ahead by :mod:`sandfleet.sandbox.disk`; a memory-charged tmpfs where the host
   has no loop devices) holding the overlay's upper layer, mounts the image root read-only
   below it (idmapped for a built image), prepares the writable directories, makes the
   sandbox's user namespace P and enters it as its root, sets PR_SET_PDEATHSIG;
2. the launcher (``launch --sandbox ROOT``, the default ``BwrapConfig.namespaces``) forks the
   sandbox's pid 1 into new pid, net, ipc, uts, cgroup and mount namespaces, which makes
   ``/dev``, ``/proc`` and the binds over that overlay, pivots into it as ``/``, keeps only
   the capabilities the guest agent needs to make the commands' namespace S (bounding set
   included), sets no_new_privs, and
3. execs the guest agent as the pid namespace's init, which makes S, drops to a uid S does
   not map, and serves the host over the launcher's stdin/stdout. The launcher stays as its
   parent (two host tasks per sandbox) and the agent ends the sandbox when the launcher ends
   (``launch --lifeline``: a pidfd of the launcher it polls).

   With ``namespaces="bwrap"`` (and on kernels without pidfds) the launcher execs bubblewrap
   for step 2 instead (``--as-pid-1`` where pidfds exist), with the same mounts, namespaces
   and capabilities: what every sandbox did before 2026-12, one exec of a dynamically linked
   program and a parse of the mount table per bind more a start (docs/security.md).

The mounts exist only in the private namespace, so they vanish with the sandbox: nothing
can leak on the host but the cgroups and the marker directory, which close() and the
reaper remove.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from sandfleet.agent.build import agent_binary
from sandfleet.errors import HostUnsupportedError, SandboxError
from sandfleet.imagestore import Image, resolve_image
from sandfleet.reaping import reap_group
from sandfleet.sandbox import branching, cgroups, disk, mntns, network, seccomp, uids
from sandfleet.sandbox._spawn import PIDFD, AgentProcess, LocalSandbox
from sandfleet.sandbox.base import Sandbox, Snapshot, create_many, new_id
from sandfleet.sandbox.spec import (
    AGENT_UID,
    GUEST_AGENT_PATHS,
    GUEST_AGENT_UID,
    ROOT_UID,
    SANDBOX_UIDS,
    BwrapConfig,
    SandboxSpec,
)
from sandfleet.sandbox.state import new_sandbox_dir, new_snapshot_dir, remove_sandbox_dir, state_root
from sandfleet.stats import percentile

# On the "host" image a sandbox sees only the system directories of the host: every other
# top-level entry (home, /root, /work, /srv, /mnt, top-level files, ...) and the host's own
# state under /var is replaced by nothing, or by an empty private directory.
HOST_SYSTEM = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "var", "dev", "proc", "sys"}
HOST_HIDDEN_BELOW = ("/var/lib", "/var/cache", "/var/tmp", "/var/log", "/var/mail", "/var/spool",
                     "/var/backups", "/var/opt", "/var/local")
FRESH_MODES = {"/tmp": "1777", "/var/tmp": "1777"}
AGENT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETFCAP", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_DAC_OVERRIDE")
"""What the guest agent keeps (as root of P) to make S and drop to its own uid; it keeps none
of them after that."""
CGROUP_DIR = "/.sandfleet-cg"  # the sandbox's cgroup, delegated to the guest agent (a cgroup per command)


SETTLED_S = 1.0
"""How old the host root's and /var's modification times must be before a scan of them is
reused (file systems stamp them with a coarse clock: a change within the same tick as the
scan would leave the stamp as it was)."""
_hidden: tuple[tuple[int, int], tuple[tuple[str, ...], tuple[str, ...]]] | None = None


def _host_hidden() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(directories to replace by empty ones, other entries to remove) of the host's root;
    as of each sandbox start, so a file made since is hidden too. The last scan is reused
    while neither ``/`` nor ``/var`` has changed (an entry made, removed or renamed in either
    changes its modification time) and both had settled when it was made (0.2 ms a start)."""
    global _hidden
    try:
        st_root, st_var = Path("/").stat(), Path("/var").stat()
        stamp: tuple[int, int] | None = (st_root.st_mtime_ns, st_var.st_mtime_ns)
    except OSError:
        stamp = None
    if stamp is not None and _hidden is not None and _hidden[0] == stamp:
        return _hidden[1]
    found = _scan_host_hidden()
    if stamp is not None and time.time_ns() - max(stamp) > SETTLED_S * 1e9:
        _hidden = (stamp, found)
    return found


def _scan_host_hidden() -> tuple[tuple[str, ...], tuple[str, ...]]:
    dirs: set[str] = {"/tmp", "/home", "/run"}
    other: set[str] = set()
    with os.scandir("/") as it:  # one getdents; the entries carry their types
        for e in it:
            if e.name in HOST_SYSTEM:
                continue
            if e.is_symlink() and str(Path(e.path).readlink()).lstrip("/").split("/")[0] in HOST_SYSTEM:
                continue  # bin -> usr/bin and the like
            (dirs if e.is_dir(follow_symlinks=False) else other).add(e.path)
    below = [p for p in HOST_HIDDEN_BELOW if Path(p).is_dir() and not Path(p).is_symlink()]
    return tuple(sorted(dirs)) + tuple(below), tuple(sorted(other))


def _agent_dir() -> Path:
    """A world-readable copy of the agent binary for bwrap (running unprivileged) to bind.

    Safe from any thread or process: the copy goes to a unique temporary name and is
    renamed into place under the directory's flock (``build.install``); the directories
    are made traversable before the binary appears, so whoever sees it can use it."""
    from sandfleet.agent.build import install

    src = agent_binary()
    d = state_root() / "bin" / src.parent.name

    def copy(tmp: Path) -> None:
        shutil.copyfile(src, tmp)
        for p in (d, d.parent):
            p.chmod(0o755)

    if not (d / src.name).is_file():
        install(d / src.name, copy)
    return d


@functools.cache
def bwrap_version(binary: str = "bwrap") -> str | None:
    path = shutil.which(binary)
    if not path:
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def raw_bwrap_true_ms(n: int = 5) -> float | None:
    """Median milliseconds of a bare ``bwrap ... true`` (namespaces only, no image, limits
    or agent): the floor that a sandbox's start is reported against. None without bwrap."""
    found = shutil.which("bwrap")
    if not found:
        return None
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        with subprocess.Popen([found, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True) as p:
            p.wait()
        reap_group(p.pid)  # bwrap's own child ends after it: where it comes back to us, reaped here
        ts.append(time.perf_counter() - t)
    return percentile(ts, 50) * 1e3


class BwrapSandbox(LocalSandbox):
    backend = "bwrap"

    def __init__(self, sid: str, spec: SandboxSpec, agent: AgentProcess, sdir: Path,
                 cg: cgroups.Cgroup | None, layers: list[Path]):
        super().__init__(sid, spec, agent, sdir, cg)
        self.layers = layers  # snapshot layers this sandbox started from, above its image
        self.stack: list[branching.Held] = []  # sealed layers (branching.py) it stacks, held until close
        self.host_image = False  # over the host's root (layers copied up) rather than an image's
        self.create: Any = None  # its backend's create (a branch makes its children with it)

    @property
    def upper(self) -> Path:
        """The writable layer as the host sees it (through the launcher's mount namespace)."""
        return Path(f"/proc/{self.agent.proc.pid}/root") / str(self.dir / "rw/upper").lstrip("/")

    async def snapshot(self) -> Snapshot:
        """Save the writable layer; forks stack it read-only over the same image."""
        self._check()
        snap = new_snapshot_dir()  # marked with its owner: reaped if the owner dies
        proc = await asyncio.create_subprocess_exec(
            "cp", "-a", "--reflink=auto", f"{self.upper}/.", str(snap / "layer"),
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        if proc.returncode != 0:
            shutil.rmtree(snap, ignore_errors=True)
            raise SandboxError(f"snapshot of {self.id} failed: {err.decode(errors='replace')}")
        return Snapshot(backend="bwrap", spec=self.spec, layer=snap / "layer",
                        layers=[snap / "layer", *self.layers],
                        cleanup=lambda: shutil.rmtree(snap, ignore_errors=True))

    async def branch(self, n: int, *, processes: Literal["error", "drop"] = "error") -> list[Sandbox]:
        """``n`` sandboxes over this one's sealed writable layer, each with a new upper layer of
        its own; this one goes on over it too, on a new guest agent (docs/branching.md)."""
        children: list[Sandbox] = await branching.branch_local(self, n, processes, create=self.create)
        return children

    def memory_events(self) -> dict[str, int]:
        return self.cgroup.memory_events() if self.cgroup else {}

    net: network.Helper | None = None  # the user-mode network helper (network=True)
    loop: disk.Loop | None = None  # the disk limit's loop device, released once the agent is gone
    slot: uids.Slot | None = None  # the host uids of this sandbox, free again once all of it is gone

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            try:
                if self.net is not None:
                    self.net.close()
                if self.loop is not None:  # the mount is gone with the agent: let the device go
                    self.loop.release()
            finally:
                if self.slot is not None and self.agent.proc.returncode is not None:
                    self.slot.release()
                branching.drop_all(self.stack)
                self.stack = []


class BwrapBackend:
    name = "bwrap"

    def __init__(self, config: BwrapConfig | None = None):
        self.config = config or BwrapConfig()
        if bwrap_version(self.config.bwrap) is None:
            raise HostUnsupportedError(
                f"bubblewrap ({self.config.bwrap}) is not installed: apt-get install bubblewrap"
            )
        if os.geteuid() != 0:
            raise HostUnsupportedError(
                "the bwrap backend needs root on the host for its overlay root and cgroups "
                "(run as root, or use --backend process for development)"
            )
        found = shutil.which(self.config.bwrap)
        assert found is not None  # bwrap_version found it
        self.bwrap = str(Path(found).resolve())  # the root launcher never searches PATH
        # (without pidfds the launcher can't be the agent's lifeline: bwrap keeps its own init)
        self.native = self.config.namespaces == "launcher" and PIDFD

    def _seed(self) -> disk.Seed:
        """The writable layer every sandbox over the host's root starts with: an opaque
        directory per hidden host directory, a whiteout per other hidden entry."""
        hidden_dirs, hidden_other = _host_hidden()
        return disk.Seed(root_uid=self.config.host_uid(ROOT_UID),
                         opaque=tuple((p, int(FRESH_MODES.get(p, "0755"), 8)) for p in hidden_dirs),
                         whiteouts=hidden_other)

    def _argv(self, sid: str, sdir: Path, spec: SandboxSpec, image: Image, lowers: list[Path],
              cg: cgroups.Cgroup | None, loop: disk.Loop | None = None,
              seed: disk.Seed | None = None, slot: uids.Slot | None = None, sealed: int = 0,
              hostname: str = "sandbox", identity: Path | None = None,
              template: int | None = None) -> list[str]:
        """The launcher's argv (docs/security.md, "The uid model"): mounts made as host root,
        then bwrap runs as root of the sandbox's user namespace P (owned by the slot's
        unprivileged owner uid), and the guest agent makes the commands' namespace S and
        drops to a uid no command has. Stored layers and the raw writable layer are owned by
        the canonical range; in another slot they are seen through shifted idmapped mounts."""
        cfg, lim = self.config, spec.limits
        slot = slot or uids.Slot(index=0, base=cfg.uid_base, canonical=cfg.uid_base)
        raw_root_ids = [str(cfg.host_uid(ROOT_UID))] * 2  # on the raw (canonical) writable layer
        root_ids = [str(slot.host_uid(ROOT_UID))] * 2  # through the overlay: the slot's own
        agent_ids = [str(slot.host_uid(AGENT_UID))] * 2
        sdir = sdir.resolve()  # the launcher refuses symlinks on any path it prepares
        rw, root = sdir / "rw", sdir / "root"
        agent_dir = _agent_dir()
        a = [str(agent_dir / "sandfleet-agent"), "launch"]
        for f in cg.join_files if cg else []:
            a += ["--cgroup", str(f)]
        # rw/ and root/ (and base/) are mount points on a tmpfs private to the launcher's
        # mount namespace: the host's state directory holds only the marker and the log.
        # Without a disk that tmpfs is the writable layer too (disk_mib): every superblock a
        # sandbox holds costs each memory cgroup on the host a shrinker slot, so the kernel
        # memory of N idle sandboxes grows as N x (superblocks per sandbox x N) (docs/bench.md)
        if loop is not None:
            a += ["--scratch", str(sdir)]
        else:
            a += ["--tmpfs", str(sdir), f"{lim.disk_mib}m"]
        a += ["--mkdir", str(rw), "0", "0", "0755", "--mkdir", str(root), "0", "0", "0755"]
        if loop is not None:  # the disk limit, mounted ahead (disk.py); the launcher inherits it
            a += ["--disk-fd", str(loop.mnt_fd), str(rw)]
        a += [
              "--mkdir", str(rw / "upper"), *raw_root_ids, "0755",
              "--mkdir", str(rw / "work"), "0", "0", "0755",
              "--userns-owner", str(slot.owner)]
        for name, value in uids.NS_LIMITS.items():
            a += ["--userns-max", name, str(value)]
        a += ["--userns", str(slot.base), str(SANDBOX_UIDS + 1)]
        upper = rw
        if slot.shifted:
            # host uid 0 stays itself: overlayfs makes its work files as the mounter (host root)
            a += ["--shift-ns", str(slot.canonical), str(slot.base), str(SANDBOX_UIDS + 1),
                  "--shift-rw", str(rw), str(sdir / "rwmap")]
            upper = sdir / "rwmap"
        if lowers[-1] == Path("/"):
            # Overlayfs refuses layers that live below another layer ("/" here), so layers
            # over the host's root are copied into the private upper layer instead; host
            # directories the sandbox must not see become opaque (empty) upper directories.
            # The host's files stay owned by host root: unmapped, so nobody inside can
            # change them.
            # (sealed layers of a branch are on disks of their own, not below "/": stacked, and
            # their top one hides the host already)
            if identity is not None:  # a branch's child: its own /etc/machine-id (branching.identity_layer)
                a += ["--copy-small", str(identity), str(rw / "upper")]  # (no cp process: agent.c)
            for layer in reversed(lowers[sealed:-1]):
                a += ["--copy", str(layer), str(rw / "upper")]
            if not sealed:
                seed = seed or self._seed()  # (read once per start: create() passes the one it read)
                made = loop.seed if loop is not None and loop.seed is not None else None
                for path, mode in seed.opaque:  # what the disk was not made with (disk.Seed)
                    if made is None or (path, mode) not in made.opaque:
                        a += ["--opaque", f"{rw}/upper{path}", *raw_root_ids, f"{mode:04o}"]
                for path in seed.whiteouts:
                    if made is None or path not in made.whiteouts:
                        a += ["--whiteout", f"{rw}/upper{path}"]
            stacked = []
            for i, layer in enumerate(lowers[:sealed]):  # written in the canonical range, as stored layers
                if slot.shifted:
                    a += ["--shift", str(layer), str(sdir / f"l{i}")]
                    layer = sdir / f"l{i}"
                stacked.append(layer)
            lowers = [*stacked, lowers[-1]]
        else:
            # A base image is owned by host root on disk: mount it idmapped, so its files
            # belong to the sandbox's root as in a container. Layers we wrote are in the
            # canonical range: as they are in slot 0, shifted onto the slot's range in others.
            a += ["--idmap", str(lowers[-1]), str(sdir / "base")]
            shown = []
            for i, layer in enumerate(lowers[:-1]):
                if slot.shifted:
                    a += ["--shift", str(layer), str(sdir / f"l{i}")]
                    layer = sdir / f"l{i}"
                shown.append(layer)
            lowers = [*shown, sdir / "base"]
        a += ["--overlay", ":".join(str(p) for p in lowers), str(upper / "upper"), str(upper / "work"), str(root)]
        if lowers[-1] != Path("/"):
            a += ["--mkdir", f"{root}/tmp", *root_ids, "1777", "--mkdir", f"{root}/var/tmp", *root_ids, "1777"]
        for path in (spec.workdir, "/home/agent", *spec.writable_dirs):
            # root_dirs (the task folders) root's instead: the launcher chowns one the image has too
            a += ["--mkdir", f"{root}{path}", *(root_ids if path in spec.root_dirs else agent_ids), "0755"]
        a += ["--mkdir", f"{root}/.sandfleet", *root_ids, "0755"]
        if PIDFD:  # (a kernel before 5.3 has no pidfd_open: there bwrap keeps its own init, below)
            a.append("--lifeline")
        a += ["--pdeathsig", str(os.getpid())]
        delegated = cg.delegate(slot.host_uid(GUEST_AGENT_UID)) if cg else None
        agent_argv = [GUEST_AGENT_PATHS["bwrap"], "--isolate"]
        if delegated is not None:
            agent_argv += ["--cgroup-dir", CGROUP_DIR]
        if lim.ttl_s:
            agent_argv += ["--ttl", str(lim.ttl_s)]
        if self.native:
            # the launcher enters the namespaces itself (agent.c, "launch --sandbox"): what the
            # bwrap arguments below ask for, with the same /dev, /proc, binds and capabilities
            if template is not None:  # its mount namespace a copy of the template (mntns.py)
                a += ["--mntns", str(template)]
            a += ["--sandbox", str(root), "--sandbox-ro-bind", str(agent_dir), "/.sandfleet"]
            if lim.network and lim.allow is not None:
                a += ["--sandbox-ro-bind", str(network.allowlist_resolv_conf()), "/etc/resolv.conf"]
            if delegated is not None:
                a += ["--sandbox-bind", str(delegated), CGROUP_DIR]
            a += ["--hostname", hostname]
            for cap in AGENT_CAPS:
                a += ["--keep-cap", cap]
            return [*a, "--", *agent_argv]
        a.append("--")
        # /dev/shm world-writable, sticky (bwrap's --dev leaves a root-owned 0755 folder: POSIX
        # semaphores, so multiprocessing, failed for non-root users); a folder of /dev's tmpfs,
        # not a tmpfs of its own (one superblock fewer per sandbox): its pages count in the
        # memory limit, which bounds it, as they did with Docker's 64 MiB tmpfs
        a += [self.bwrap, "--bind", str(root), "/", "--dev", "/dev", "--chmod", "1777", "/dev/shm",
              "--proc", "/proc",
              "--ro-bind", str(agent_dir), "/.sandfleet"]
        if lim.network and lim.allow is not None:  # its own resolver (allowlist.py), reached through pasta
            a += ["--ro-bind", str(network.allowlist_resolv_conf()), "/etc/resolv.conf"]
        if delegated is not None:
            a += ["--bind", str(delegated), CGROUP_DIR]
        # --as-pid-1: the guest agent is the pid namespace's init (it reaps what is orphaned
        # there, and when it exits the kernel ends everything left): no bwrap init between,
        # one process fewer per sandbox, one fork and one exit fewer per cycle
        a += ["--unshare-pid", *(["--as-pid-1"] if PIDFD else []), "--unshare-ipc", "--unshare-uts",
              "--unshare-cgroup-try", "--hostname", hostname, "--die-with-parent", "--new-session",
              "--cap-drop", "ALL"]
        # what the agent needs to make S and drop to its own uid; it keeps none of them
        for cap in AGENT_CAPS:
            a += ["--cap-add", cap]
        a += ["--chdir", "/"]
        a.append("--unshare-net")  # always; network=True attaches user-mode networking (network.py)
        return [*a, "--", *agent_argv]

    async def create(self, spec: SandboxSpec, *, layers: list[Path] | None = None,
                     stack: Sequence[branching.Held] = (), hostname: str | None = None) -> BwrapSandbox:
        """A sandbox over ``layers`` (stored, top first) and the image; a branch's child also
        over ``stack`` (sealed layers, above them) with ``hostname`` ("" for its own id)."""
        image = resolve_image(spec.image)
        sealed = [h for h in stack if isinstance(h, branching.SealedLayer)]
        lowers = [*(h.path for h in sealed), *(layers or []), *image.lowers]
        sid = new_id("bwrap")
        cg = cgroups.sandbox_cgroup(sid, spec.limits)  # no silent loss of limits: refused without cgroups
        loop: disk.Loop | None = None
        slot: uids.Slot | None = None
        meta = {"id": sid, "backend": "bwrap", "image": image.name, "ttl_s": spec.limits.ttl_s,
                "cgroup": cg is not None, "labels": spec.labels}
        sdir = state_root() / sid
        identity: tuple[Path, Any] | None = None
        try:  # the marker names its owner before there is anything to reap (rw/ and root/: see _argv)
            sdir = new_sandbox_dir(sid, meta)
        except OSError as e:  # (a full state directory): no marker, no directory left behind
            raise SandboxError(f"sandbox {sid} could not be created: its marker in {sdir.parent}: "
                               f"{e.strerror or e}") from None
        try:
            if cg is not None:
                cg.create(spec.limits, cpu_now=False)  # the CPU quota at its first command (limit_cpu)
            seed = self._seed() if lowers[-1] == Path("/") and not sealed else None
            if self.config.disk == "ext4" and disk.available():
                loop = await disk.take_loop_async(spec.limits.disk_mib, seed)
            slot = uids.take_slot(self.config)
            meta["uid_slot"] = slot.index
            if hostname == "" and lowers[-1] == Path("/"):
                identity = branching.identity_layer()
            template = mntns.template_fd() if self.native else None
            argv = self._argv(sid, sdir, spec, image, lowers, cg, loop, seed, slot, sealed=len(sealed),
                              hostname=sid if hostname == "" else (hostname or "sandbox"),
                              identity=identity[0] if identity else None, template=template)
            if spec.limits.network:
                network.check_available()
            agent = await AgentProcess.start(argv, sid=sid, sandbox_dir=sdir, meta=meta, new_session=True,
                                             pass_fds=((loop.mnt_fd,) if loop is not None else ())
                                             + ((template,) if template is not None else ())
                                             + tuple(h.fd for h in sealed),
                                             seccomp=await seccomp.program_for(spec.seccomp_allow))
            if loop is not None:
                loop.hold_mounts_of(agent.proc.pid)
            try:
                net = (await network.attach_sandbox(sdir, sid, agent.proc.pid, spec.limits, self.config, slot)
                       if spec.limits.network else None)
            except BaseException:
                await agent.stop()
                raise
        except BaseException:
            if cg is not None:
                cg.remove()
            if loop is not None:
                loop.release()
            if slot is not None:
                slot.release()
            remove_sandbox_dir(sdir)
            raise
        finally:
            if identity is not None:
                identity[1]()
        box = BwrapSandbox(sid, spec, agent, sdir, cg, list(layers or []))
        if cg is not None and cg.cpu_pending:
            agent.client.before_first_command = cg.limit_cpu
        box.stack = [h.take() for h in stack]
        box.host_image = image.lowers[-1] == Path("/")
        box.create = self.create
        box.net = net
        box.loop = loop
        box.slot = slot
        return box

    async def fork(self, snapshot: Snapshot, n: int) -> list[BwrapSandbox]:
        return await create_many([lambda: self.create(snapshot.spec, layers=snapshot.layers)] * n)

