"""The ``gvisor`` backend: sandfleet's guest agent as the init of a gVisor (runsc) sandbox.

gVisor is a kernel in user space: the sandbox's syscalls are served by runsc's Sentry, and
none reaches the host kernel directly. Start-up of one sandbox (docs/security.md, "Backends"):

1. ``sandfleet-agent launch`` (as root on the host) joins the sandbox's cgroups (runsc's
   sandbox, gofer and, on ptrace, the stub processes are all born inside: the limits hold
   for the whole of it), makes a private mount namespace, attaches the disk limit (the
   same ext4 on a loop device as bwrap's, mounted ahead by :mod:`sandfleet.sandbox.disk`;
   a size-limited tmpfs, charged to memory, where the host has no loop devices or
   ``GvisorConfig.disk`` is "tmpfs") for the writable layer and an overlay of it over the
   image's layers (a base image idmapped
   onto the stored uid range), prepares the
   writable directories, sets PR_SET_PDEATHSIG, and
2. execs ``runsc run`` on an OCI bundle whose root is that overlay, with no network
   (``--network=none``: a loopback only) or, with network=True, in a namespace pasta serves
   (``--network=sandbox``: gvisor_net.py), ``--ignore-cgroups`` (the launcher placed it); the
   bundle's user namespace maps the sandbox's uids onto the stored range for runsc's gofer,
3. the bundle's process is the guest agent (``--switch-users``: gVisor can't setns into a
   user namespace, so commands take their users directly inside the Sentry), which serves
   the host over runsc's stdin/stdout (``runsc run`` hands its stdio to the container's init);
   the commands' seccomp filter refuses signals to it (pid 1: seccomp.py, ``protect_init``).
   Every command gets the stat shim last in its LD_PRELOAD (agent/statcompat.c, ``--preload``):
   Debian's runsc answers EINVAL to statx/newfstatat with AT_NO_AUTOMOUNT, which coreutils'
   ls and stat pass on every path.

The mounts exist only in the launcher's namespace: they vanish with the sandbox. runsc's
state directory is inside the sandbox's marker directory; close() and the reaper remove
both, and the cgroup (``cgroup.kill``) ends anything runsc left.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from sandfleet.agent.build import cache_dir
from sandfleet.errors import HostUnsupportedError, SandboxError
from sandfleet.imagestore import Image, resolve_image
from sandfleet.reaping import reap_adopted
from sandfleet.sandbox import branching, cgroups, disk, network, seccomp
from sandfleet.sandbox._spawn import AgentProcess, LocalSandbox, _off_loop
from sandfleet.sandbox.base import Sandbox, Snapshot, create_many, new_id
from sandfleet.sandbox.bwrap import FRESH_MODES, _agent_dir, _host_hidden
from sandfleet.sandbox.gvisor_net import NetNamespace
from sandfleet.sandbox.spec import (
    AGENT_UID,
    DEFAULT_UID_BASE,
    GUEST_AGENT_PATHS,
    ROOT_UID,
    SANDBOX_UIDS,
    GvisorConfig,
    Limits,
    SandboxSpec,
)
from sandfleet.sandbox.state import new_sandbox_dir, new_snapshot_dir, remove_sandbox_dir
from sandfleet.settings import current as current_settings

INSTALL = "apt-get install runsc"
KVM_PROBE_S = 8.0
GUEST_CGROUP = "/sys/fs/cgroup/cpu"
"""A hierarchy of gVisor's cgroupfs (mounted by runsc --cgroupfs) the agent makes its
per-command groups in."""
# what the agent needs: switch users, own files as any user, kill its commands, load the
# seccomp filter and make the verifier's network namespace (CAP_SYS_ADMIN). No CAP_SYS_PTRACE
# (as in Docker's default): root's commands can't ptrace or read the (non-dumpable) agent.
CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
        "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
        "CAP_SYS_ADMIN", "CAP_AUDIT_WRITE", "CAP_MKNOD"]


@functools.cache
def runsc_version(binary: str = "runsc") -> str | None:
    path = shutil.which(binary)
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.strip().splitlines()
    return first[0].removeprefix("runsc version ").strip() if first else "unknown"


def _kvm_usable() -> bool:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


def probe_kvm(runsc: str) -> tuple[bool, str]:
    """Whether runsc's KVM platform runs ``true`` here within KVM_PROBE_S (nested KVM on a
    cloud VM often opens /dev/kvm and then hangs); cached per runsc version in the cache dir."""
    if not _kvm_usable():
        return False, "/dev/kvm is not usable"
    version = runsc_version(runsc) or "unknown"
    cache = cache_dir() / "gvisor-platform.json"
    try:
        known = json.loads(cache.read_text())
        if known.get("version") == version:
            return bool(known["kvm"]), str(known["why"])
    except (OSError, ValueError, KeyError):
        pass
    with tempfile.TemporaryDirectory(prefix="sandfleet-kvm-probe-") as state:
        argv = [runsc, "--root", state, "--network=none", "--platform=kvm", "do", "/bin/true"]
        proc = subprocess.Popen(argv, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=KVM_PROBE_S)
            ok, why = rc == 0, f"runsc --platform=kvm do /bin/true exited {rc}"
        except subprocess.TimeoutExpired:
            ok, why = False, f"runsc --platform=kvm did not run /bin/true within {KVM_PROBE_S:g} s"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            listed = subprocess.run([runsc, "--root", state, "list", "-q"], capture_output=True, text=True)
            for cid in listed.stdout.split():  # its sandbox and gofer: ended by runsc itself
                subprocess.run([runsc, "--root", state, "delete", "-force", cid], capture_output=True)
    if ok:
        why = "runsc --platform=kvm runs"
    tmp = cache.with_suffix(f".{os.getpid()}")
    tmp.write_text(json.dumps({"version": version, "kvm": ok, "why": why}))
    tmp.replace(cache)
    return ok, why


def choose_platform(config: GvisorConfig) -> tuple[str, str]:
    """(platform, why): what the config names, else KVM where runsc runs on it, else ptrace
    (Debian's runsc 0.0~20221219 has no systrap)."""
    if config.platform != "auto":
        return config.platform, "chosen in the backend config"
    ok, why = probe_kvm(config.runsc)
    return ("kvm", why) if ok else ("ptrace", f"no KVM platform ({why})")


STATCOMPAT = Path(__file__).parent.parent / "agent" / "statcompat.c"
STATCOMPAT_FLAGS = ["-shared", "-fPIC", "-nostdlib", "-ffreestanding", "-fno-builtin", "-fno-stack-protector", "-Os"]


def _statcompat(agent_dir: Path) -> str:
    """The stat shim (agent/statcompat.c: Debian's runsc answers EINVAL to statx with
    AT_NO_AUTOMOUNT, so coreutils' ls and stat failed on every path), built once per source
    into the agent's directory; its path inside the sandbox (/.sandfleet/...)."""
    from sandfleet.agent.build import install

    digest = hashlib.sha256(STATCOMPAT.read_bytes()).hexdigest()[:16]
    name = f"sandfleet-statcompat-{digest}.so"

    def compile_(out: Path) -> None:
        cc = current_settings().cc or shutil.which("cc") or shutil.which("gcc")
        cmd = [cc or "cc", *STATCOMPAT_FLAGS, "-o", str(out), str(STATCOMPAT)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise HostUnsupportedError(f"building gVisor's stat shim needs a C compiler: {e}") from None
        if proc.returncode != 0:
            raise HostUnsupportedError(f"building gVisor's stat shim failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")

    install(agent_dir / name, compile_, mode=0o644)
    return f"/.sandfleet/{name}"


RUNSC_PIDS = 128
"""Threads and processes of runsc's own (the Sentry's Go threads, the gofer, ptrace's stubs) the
sandbox's cgroup holds beside its guest's ``pids``: about 41 at the start and 90 after a hundred
commands here, so a sandbox of ``pids=128`` once died after 30 commands, of its own threads."""


def _host_limits(limits: Limits) -> Limits:
    """The limits of the sandbox's cgroup: its ``pids`` plus :data:`RUNSC_PIDS` (the cgroup holds
    all of runsc; a fork bomb still ends the sandbox, at that many more)."""
    return limits.model_copy(update={"pids": limits.pids + RUNSC_PIDS}) if limits.pids else limits


def _uid_base(image: Image) -> int:
    """Where the image's stored layers' uids start on disk (the build's ``uid_base``, recorded
    in the image; the default range for the host image and bases, which have none)."""
    recorded = image.meta.get("uid_base")
    return recorded if isinstance(recorded, int) else DEFAULT_UID_BASE


class GvisorSandbox(LocalSandbox):
    backend = "gvisor"

    def __init__(self, sid: str, spec: SandboxSpec, agent: AgentProcess, sdir: Path,
                 cg: cgroups.Cgroup | None, layers: list[Path], net: NetNamespace | None = None):
        super().__init__(sid, spec, agent, sdir, cg)
        self.layers = layers
        self.net = net
        self.stack: list[branching.Held] = []  # sealed layers (branching.py) it stacks, held until close
        self.host_image = False
        self.create: Any = None  # its backend's create (a branch makes its children with it)

    async def branch(self, n: int, *, processes: Literal["error", "drop"] = "error") -> list[Sandbox]:
        """As bwrap's (docs/branching.md): the Sentry first writes back what it caches (sync)."""
        async def sync(client: Any) -> None:
            res = await client.exec(["sync"], env=dict(self.env), user="root", cwd="/", timeout=60)
            if res.exit_code != 0:
                raise SandboxError(f"branch of {self.id} failed: sync in the sandbox: {res.output.strip()}")

        children: list[Sandbox] = await branching.branch_local(self, n, processes, create=self.create, prepare=sync)
        return children

    @property
    def upper(self) -> Path:
        """The writable layer as the host sees it (through the launcher's mount namespace)."""
        return Path(f"/proc/{self.agent.proc.pid}/root") / str(self.dir / "rw/upper").lstrip("/")

    async def snapshot(self) -> Snapshot:
        """Save the writable layer (after the Sentry wrote back what it caches: sync)."""
        self._check()
        res = await self.exec(["sync"], user="root", cwd="/", timeout=60)
        if res.exit_code != 0:
            raise SandboxError(f"snapshot of {self.id} failed: sync in the sandbox: {res.output.strip()}")
        snap = new_snapshot_dir()
        proc = await asyncio.create_subprocess_exec(
            "cp", "-a", "--reflink=auto", f"{self.upper}/.", str(snap / "layer"), stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            shutil.rmtree(snap, ignore_errors=True)
            raise SandboxError(f"snapshot of {self.id} failed: {err.decode(errors='replace')}")
        return Snapshot(backend="gvisor", spec=self.spec, layer=snap / "layer", layers=[snap / "layer", *self.layers],
                        cleanup=lambda: shutil.rmtree(snap, ignore_errors=True))

    def memory_events(self) -> dict[str, int]:
        return self.cgroup.memory_events() if self.cgroup else {}

    loop: disk.Loop | None = None  # the disk limit's loop device, released once runsc is gone

    async def close(self) -> None:
        """Close as any local sandbox, then reap runsc's sandbox, gofer and stub processes: they
        outlive ``runsc run`` for a moment and come back to this process (a subreaper)."""
        if self._closed:
            return
        pinned: list[int] = []
        for pid in self.cgroup.pids() if self.cgroup is not None else ():
            with contextlib.suppress(OSError):
                pinned.append(os.pidfd_open(pid))
        try:
            await super().close()
        finally:
            await _off_loop(lambda: reap_adopted(pinned))
            if self.net is not None:
                await _off_loop(self.net.close)
            if self.loop is not None:  # runsc's processes are gone: the mount and the device may go
                self.loop.release()
                self.loop = None
            branching.drop_all(self.stack)
            self.stack = []


class GvisorBackend:
    name = "gvisor"

    def __init__(self, config: GvisorConfig | None = None):
        self.config = config or GvisorConfig()
        if runsc_version(self.config.runsc) is None:
            raise HostUnsupportedError(f"gVisor ({self.config.runsc}) is not installed: {INSTALL}")
        if os.geteuid() != 0:
            raise HostUnsupportedError("the gvisor backend needs root on the host (runsc, its overlay root "
                                       "and cgroups); run as root, or use --backend process for development")
        found = shutil.which(self.config.runsc)
        assert found is not None
        self.runsc = str(Path(found).resolve())
        self.platform, self.platform_why = choose_platform(self.config)

    def bundle(self, spec: SandboxSpec, root: Path, agent_dir: Path, uid_base: int,
               netns: str | None = None, hostname: str = "sandbox", preload: str | None = None) -> dict[str, Any]:
        """The OCI runtime spec: the agent as init, as root, over ``root`` (the overlay). The
        user namespace's map is runsc's gofer's: it serves the files with host uid
        ``uid_base + i`` as uid ``i`` (how stored layers are owned), and what the sandbox
        writes lands there; the Sentry's own users stay its own."""
        # a cgroup per command in gVisor's own cgroupfs (runsc --cgroupfs): the timeout's tree
        # kill reaches orphans that called setsid(), as bwrap's delegated cgroup does
        args = [GUEST_AGENT_PATHS["gvisor"], "--switch-users", "--cgroup-dir", GUEST_CGROUP]
        if preload:  # the stat shim (_statcompat), last in every command's LD_PRELOAD
            args += ["--preload", preload]
        if spec.limits.ttl_s:
            args += ["--ttl", str(spec.limits.ttl_s)]
        return {
            "ociVersion": "1.0.0",
            "process": {"user": {"uid": 0, "gid": 0}, "args": args, "cwd": "/",
                        "env": [],  # gVisor lets any command read a non-dumpable process's environ: keep it empty
                        "capabilities": {k: CAPS for k in ("bounding", "effective", "permitted")},
                        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1 << 20, "soft": 1 << 20}]},
            "root": {"path": str(root), "readonly": False},
            "hostname": hostname,
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                       {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
                       # as in Docker: a tmpfs of its own, mode 1777, 64 MiB (POSIX semaphores,
                       # so multiprocessing, for every user)
                       {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                        "options": ["nosuid", "nodev", "noexec", "mode=1777", "size=64m"]},
                       {"destination": "/.sandfleet", "type": "bind", "source": str(agent_dir),
                        "options": ["rbind", "ro"]},
                       # the writable layer's own /tmp: without a /tmp mount, runsc puts a tmpfs
                       # in the Sentry's memory there, with no size limit (filling /tmp then got
                       # the sandbox OOM-killed, a `failed` rollout, instead of ENOSPC)
                       {"destination": "/tmp", "type": "bind", "source": str(root / "tmp"),
                        "options": ["rbind", "rw"]}],
            # with network=True the Sentry joins the namespace sandfleet made (NetNamespace)
            "linux": {"namespaces": [{"type": t, **({"path": netns} if t == "network" and netns else {})}
                                     for t in ("pid", "network", "ipc", "uts", "mount", "user")],
                      "uidMappings": [{"containerID": 0, "hostID": uid_base, "size": SANDBOX_UIDS}],
                      "gidMappings": [{"containerID": 0, "hostID": uid_base, "size": SANDBOX_UIDS}]},
        }

    def _argv(self, sid: str, sdir: Path, spec: SandboxSpec, lowers: list[Path], cg: cgroups.Cgroup | None,
              agent_dir: Path, uid_base: int, net: NetNamespace | None = None,
              loop: disk.Loop | None = None, sealed: int = 0, identity: Path | None = None) -> list[str]:
        """The launcher's argv: the same layers as bwrap's, owned as stored (host uid
        ``uid_base + i`` is the sandbox's uid ``i``, through the gofer's map in the bundle);
        a base image (owned by host root on disk) through an idmapped mount onto that range."""
        lim = spec.limits
        sdir = sdir.resolve()
        rw, root = sdir / "rw", sdir / "root"
        root_ids = [str(uid_base + ROOT_UID)] * 2
        a = [str(agent_dir / "sandfleet-agent"), "launch"]
        for f in cg.join_files if cg else []:
            a += ["--cgroup", str(f)]
        a += ["--mkdir", str(rw), "0", "0", "0755", "--mkdir", str(root), "0", "0", "0755"]
        if loop is not None:  # the disk limit, as bwrap's: an ext4 of its own, ENOSPC when full
            a += ["--disk-fd", str(loop.mnt_fd), str(rw)]
        else:  # (charged to memory: filling it can OOM-kill the sandbox)
            a += ["--tmpfs", str(rw), f"{lim.disk_mib}m"]
        a += ["--mkdir", str(rw / "upper"), *root_ids, "0755", "--mkdir", str(rw / "work"), "0", "0", "0755"]
        if lowers[-1] == Path("/"):  # the host's root: layers copied up, the hidden host made empty
            if identity is not None:  # a branch's child: its own /etc/machine-id (branching.identity_layer)
                a += ["--copy-small", str(identity), str(rw / "upper")]  # (no cp process: agent.c)
            for layer in reversed(lowers[sealed:-1]):  # (a branch's sealed layers are stacked: bwrap.py)
                a += ["--copy", str(layer), str(rw / "upper")]
            if not sealed:
                hidden_dirs, hidden_other = _host_hidden()
                for path in hidden_dirs:
                    a += ["--opaque", f"{rw}/upper{path}", *root_ids, FRESH_MODES.get(path, "0755")]
                for path in hidden_other:
                    a += ["--whiteout", f"{rw}/upper{path}"]
            lowers = [*lowers[:sealed], lowers[-1]]
        else:  # a base image is owned by host root on disk: its files belong to the sandbox's root
            a += ["--idmap-ns", str(uid_base), str(SANDBOX_UIDS), "--idmap", str(lowers[-1]), str(sdir / "base")]
            lowers = [*lowers[:-1], sdir / "base"]
        a += ["--overlay", ":".join(str(p) for p in lowers), str(rw / "upper"), str(rw / "work"), str(root)]
        if lowers[-1] != Path("/"):
            a += ["--mkdir", f"{root}/tmp", *root_ids, "1777", "--mkdir", f"{root}/var/tmp", *root_ids, "1777"]
        ids = [str(uid_base + AGENT_UID)] * 2
        for path in (spec.workdir, "/home/agent", *spec.writable_dirs):
            # root_dirs (the task folders) root's instead: the launcher chowns one the image has too
            a += ["--mkdir", f"{root}{path}", *(root_ids if path in spec.root_dirs else ids), "0755"]
        a += ["--mkdir", f"{root}/.sandfleet", *root_ids, "0755",
              "--pdeathsig", str(os.getpid())]
        if net is not None:
            # runsc 0.0~20221219 takes a namespace with /proc/sys/net/core/rmem_default for the
            # host's and refuses it (that file is in every network namespace on newer kernels):
            # hidden from it here, in the launcher's mount namespace. A proc mount with nothing
            # over it (bound before) stays there: without one, the kernel refuses the Sentry's own
            # proc mount in its user namespace (mount_too_revealing)
            a += ["--mkdir", str(sdir / "proc"), "0", "0", "0555", "--bind", "/proc", str(sdir / "proc"),
                  "--tmpfs", "/proc/sys/net", "4k"]
        a += ["--", self.runsc, "--root", str(sdir / "runsc"), f"--network={'sandbox' if net else 'none'}",
              f"--platform={self.platform}", "--ignore-cgroups", "--cgroupfs", "run", "--bundle", str(sdir / "bundle"),
              sid]
        return a

    async def create(self, spec: SandboxSpec, *, layers: list[Path] | None = None,
                     stack: Sequence[branching.Held] = (), hostname: str | None = None) -> GvisorSandbox:
        """As bwrap's create: ``stack`` and ``hostname`` for a branch's children."""
        image: Image = resolve_image(spec.image)
        uid_base = _uid_base(image)
        sealed = [h for h in stack if isinstance(h, branching.SealedLayer)]
        lowers = [*(h.path for h in sealed), *(layers or []), *image.lowers]
        sid = new_id("gvisor")
        cg = cgroups.sandbox_cgroup(sid, spec.limits)
        meta: dict[str, Any] = {"id": sid, "backend": "gvisor", "image": image.name, "ttl_s": spec.limits.ttl_s,
                                "cgroup": cg is not None, "labels": spec.labels}
        if spec.limits.network:  # (before the firewall reads the live sandboxes' forwarded ports)
            meta[network.META_FORWARD] = list(spec.limits.forward)
        sdir = new_sandbox_dir(sid, meta)  # the marker names its owner before there is anything to reap
        net: NetNamespace | None = None
        loop: disk.Loop | None = None
        identity: tuple[Path, Any] | None = None
        try:
            if cg is not None:
                cg.create(_host_limits(spec.limits))
            if self.config.disk == "ext4" and disk.available():
                loop = await disk.take_loop_async(spec.limits.disk_mib)
            if spec.limits.network:
                net = await asyncio.to_thread(NetNamespace, sdir, sid, spec.limits)
            agent_dir = _agent_dir()
            (sdir / "bundle").mkdir()
            (sdir / "bundle/config.json").write_text(
                json.dumps(self.bundle(spec, sdir.resolve() / "root", agent_dir, uid_base, net.path if net else None,
                                       hostname=sid if hostname == "" else (hostname or "sandbox"),
                                       preload=await asyncio.to_thread(_statcompat, agent_dir))))
            if hostname == "" and lowers[-1] == Path("/"):
                identity = branching.identity_layer()
            argv = self._argv(sid, sdir, spec, lowers, cg, agent_dir, uid_base, net, loop, sealed=len(sealed),
                              identity=identity[0] if identity else None)
            # the agent's stream on sockets: root in a gVisor sandbox may open the agent's
            # descriptors again through /proc/1/fd (its stdin and stdout pipes: the frames the host
            # reads), which a socket can't be (round XII, docs/security.md)
            agent = await AgentProcess.start(argv, sid=sid, sandbox_dir=sdir, meta=meta, ready_timeout=60.0,
                                             sockets=True,
                                             pass_fds=((loop.mnt_fd,) if loop is not None else ())
                                             + tuple(h.fd for h in sealed),
                                             seccomp=await seccomp.program_for(spec.seccomp_allow, protect_init=True))
            if loop is not None:
                loop.hold_mounts_of(agent.proc.pid)
        except BaseException:
            if loop is not None:
                loop.release()
            if net is not None:
                net.close()
            if cg is not None:
                cg.remove()
            remove_sandbox_dir(sdir)
            raise
        finally:
            if identity is not None:
                identity[1]()
        box = GvisorSandbox(sid, spec, agent, sdir, cg, list(layers or []), net)
        box.loop = loop
        box.stack = [h.take() for h in stack]
        box.host_image = image.lowers[-1] == Path("/")
        box.create = self.create
        return box

    async def fork(self, snapshot: Snapshot, n: int) -> list[GvisorSandbox]:
        return await create_many([lambda: self.create(snapshot.spec, layers=snapshot.layers)] * n)
