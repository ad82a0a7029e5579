"""``--ray local:N``: an N-node Ray cluster on this machine, on loopback only.

Each simulated node is a real Ray node (its own raylet and workers) started with
``ray.cluster_utils.Cluster``, bound to 127.0.0.1 (Ray rewrites 127.0.0.1 to the primary
interface's address unless told otherwise: :func:`sandfleet.cluster._ray.loopback_only`).
Each gets its own sandfleet directories, passed to its processes' environment, since
shared ones would race: a state directory (sandbox markers, the reaper's), a cache
(images, shipped task folders, the guest agent) and a cgroup parent. A node's cache starts
with a symbolic link to each image and guest agent this host has built (complete ones only,
which are never changed), so the nodes need not debootstrap the Debian bases again;
whatever else a node needs it builds into its own cache.

:meth:`LocalCluster.stop` removes the nodes (Ray's processes end), then reaps what each
node's sandboxes left (``sandfleet sandbox rm --orphans`` in that node's environment: a
node removed mid-rollout leaves markers and cgroups), removes the nodes' cgroup parents and
the directory holding it all. Nothing is left running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfleet.cluster._ray import import_ray, loopback_only
from sandfleet.errors import ConfigError
from sandfleet.settings import child_env
from sandfleet.settings import current as current_settings

log = logging.getLogger(__name__)

MAX_NODES = 16


def parse_local(address: str) -> int | None:
    """N for ``local:N``; None for any other address."""
    if not address.startswith("local:"):
        return None
    text = address.removeprefix("local:")
    if not text.isdigit() or not 1 <= int(text) <= MAX_NODES:
        raise ConfigError(f"--ray local:N takes a node count from 1 to {MAX_NODES}, not {text!r}")
    return int(text)


@dataclass
class SimNode:
    """One simulated node: its Ray node and its own sandfleet directories."""

    index: int
    node: Any
    """``ray._private.node.Node``."""
    env: dict[str, str]

    @property
    def node_id(self) -> str:
        return str(self.node.node_id)

    @property
    def label(self) -> str:
        return f"n{self.index}"


CLUSTER_VAR = "SANDFLEET_LOCAL_CLUSTER"
"""In the environment of every process of a local cluster: the cluster's token."""


class LocalCluster:
    """N Ray nodes on 127.0.0.1, each with its own state, cache and cgroup parent."""

    def __init__(self, n: int, *, cpus_per_node: int = 1, seed: bool = True, root: Path | None = None):
        if not 1 <= n <= MAX_NODES:
            raise ConfigError(f"a local cluster has 1 to {MAX_NODES} nodes, not {n}")
        self.n = n
        self.cpus = cpus_per_node
        self.seed = seed
        self.token = uuid.uuid4().hex[:6]
        # short: Ray's unix sockets live under it (108 bytes at most)
        self._root = root
        self._made: Path | None = None
        self._ray_tmp: Path | None = None
        self._address: str | None = None
        self.nodes: list[SimNode] = []
        self.cluster: Any = None
        self.removed: list[SimNode] = []

    @property
    def root(self) -> Path:
        """The directory holding the nodes' directories and Ray's session (made by start)."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix=f"sfray-{self.token}-", dir="/tmp"))
        return self._root

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def node_env(self, i: int) -> dict[str, str]:
        d = self.root / f"n{i}"
        return {**current_settings().to_env(),  # the command's settings (--no-limits) reach the node's processes
                "SANDFLEET_STATE": str(d / "state"), "SANDFLEET_CACHE": str(d / "cache"),
                "SANDFLEET_CGROUP_PARENT": f"sandfleet-ray-{self.token}-n{i}"}

    def start(self) -> str:
        """Start the nodes (blocking, seconds); returns the head's address."""
        loopback_only()
        import_ray()
        from ray.cluster_utils import Cluster

        t0 = time.monotonic()
        envs = [self.node_env(i) for i in range(self.n)]
        common = {"num_cpus": self.cpus, "node_ip_address": "127.0.0.1", "include_dashboard": False,
                  "object_store_memory": 80 << 20}
        try:
            # Cluster() writes the head's address to <Ray's default temp dir>/ray_current_cluster
            # (removed at shutdown) and fails where that directory does not exist yet
            settings = current_settings()
            ray_tmp = Path(settings.ray_tmpdir or settings.tmpdir or "/tmp") / "ray"
            self._ray_tmp = ray_tmp
            if not ray_tmp.exists():
                ray_tmp.mkdir()
                self._made = ray_tmp
            self.root.chmod(0o711)  # the sandboxes' mapped uids traverse to their state directories
            for env in envs:
                state = Path(env["SANDFLEET_STATE"])
                state.parent.mkdir(mode=0o711, exist_ok=True)
                state.mkdir(mode=0o711)
                if self.seed:
                    seed_cache(Path(env["SANDFLEET_CACHE"]))
            # every process Ray starts for the nodes inherits this from us, whatever it retitles itself to and
            # whichever of its variables it drops (a ray::DashboardAgent carrying neither the cluster's directory
            # nor its cgroup parent outlived a `--ray local:2` run: CI of stop 75); processes() looks for it
            before = os.environ.pop(CLUSTER_VAR, None)  # (another cluster's, started from here: put back after)
            os.environ[CLUSTER_VAR] = self.token
            try:
                self.cluster = Cluster(initialize_head=True, shutdown_at_exit=False, head_node_args={
                    **common, "env_vars": envs[0], "resources": {"sandfleet_n0": 1},
                    "temp_dir": str(self.root / "ray")})
                self._address = str(self.cluster.address)
                self.nodes.append(SimNode(0, self.cluster.head_node, envs[0]))
                for i in range(1, self.n):
                    node = self.cluster.add_node(**common, env_vars=envs[i], resources={f"sandfleet_n{i}": 1})
                    self.nodes.append(SimNode(i, node, envs[i]))
            finally:
                os.environ.pop(CLUSTER_VAR, None)
                if before is not None:
                    os.environ[CLUSTER_VAR] = before
            self.cluster.wait_for_nodes()
        except BaseException:
            self.stop()
            raise
        log.info("local Ray cluster of %d nodes at %s in %.1f s", self.n, self.address, time.monotonic() - t0)
        return self.address

    def by_id(self, node_id: str) -> SimNode:
        for x in self.nodes:
            if x.node_id == node_id:
                return x
        raise ConfigError(f"no live node {node_id} in this local cluster")

    def remove(self, node_id: str) -> None:
        """Kill a node's processes, as a host that dies (not the head: the driver is on it)."""
        node = self.by_id(node_id)
        if node.index == 0:
            raise ConfigError("the head node can't be removed: the driver is connected to it")
        # its agents first, while the raylet is their parent: once it is gone they are orphans whose
        # environment may no longer name the cluster (see processes())
        end_trees({p.process.pid for infos in node.node.all_processes.values() for p in infos})
        self.cluster.remove_node(node.node, allow_graceful=False)
        self.nodes.remove(node)
        self.removed.append(node)

    def stop(self) -> list[str]:
        """Stop every node, reap what their sandboxes left, remove the directories; returns
        what was reaped."""
        t0 = time.monotonic()
        # every process of the cluster ends while each still has its parent (Ray's nodes would kill the
        # raylets first, leaving their agents as orphans that nothing below may recognize)
        end_trees(set(self.processes()))
        if self.cluster is not None:
            try:
                for node in list(self.cluster.worker_nodes):
                    self.cluster.remove_node(node, allow_graceful=False)
                if self.cluster.head_node is not None:
                    self.cluster.remove_node(self.cluster.head_node, allow_graceful=False)
                self.cluster.shutdown()  # no node left: resets Ray's cached addresses
            finally:
                self.cluster = None
        self._end_stragglers()  # also after a start that failed half-way (a head without a Cluster)
        t1 = time.monotonic()
        reaped = reap_nodes([self.node_env(i) for i in range(self.n)] if self._root is not None else [])
        log.info("local cluster: nodes stopped in %.1f s, leftovers reaped in %.1f s", t1 - t0,
                 time.monotonic() - t1)
        self.nodes, self.removed = [], []
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        current = self._ray_tmp / "ray_current_cluster" if self._ray_tmp is not None else None
        with contextlib.suppress(OSError):  # Ray's pointer to this cluster, if its shutdown did not run
            if current is not None and self._address and current.read_text().strip() == self._address:
                current.unlink()
        if self._made is not None:  # the Ray temp directory start() made, if Ray left it empty
            with contextlib.suppress(OSError):
                self._made.rmdir()
        return reaped


    def processes(self) -> list[int]:
        """Pids of the processes of this cluster still running: those whose command line or
        environment names it, and their descendants.

        The environment alone does not tell: Ray's agents retitle themselves (``ray::DashboardAgent``)
        by writing their title over the start of the memory ``/proc/<pid>/environ`` reads, so which
        of their variables are still there varies from process to process (seen: a node's agents
        with none of the cluster's, and a CI run of stop 77 where one outlived the cluster). Their
        parent, the raylet, is always one that names it while it runs."""
        if self._root is None:
            return []
        mark = str(self._root).encode()
        # some of Ray's agents (ray::DashboardAgent, ray::RuntimeEnvAgent) carry neither the
        # directory nor SANDFLEET_STATE, only the node's cgroup parent, which names this cluster
        # (seen: four of them left for a minute after a test whose check missed them)
        parent = f"SANDFLEET_CGROUP_PARENT=sandfleet-ray-{self.token}-".encode()
        ours = f"{CLUSTER_VAR}={self.token}\0".encode()
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:  # Ray's agents retitle themselves (ray::...): their environment names it too
                env = (d / "environ").read_bytes()
                if mark in (d / "cmdline").read_bytes() or mark in env or parent in env or ours in env:
                    out.append(int(d.name))
            except OSError:
                continue
        return sorted(descendants(set(out)) - {os.getpid()})

    def _end_stragglers(self, wait_s: float = 3.0) -> None:
        """End what is left of the cluster once its nodes are gone (Ray's agents notice a dead
        raylet only after a while): SIGTERM, then SIGKILL for what is still there ``wait_s``
        later. Only processes naming this cluster's own directory are touched."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            deadline = time.monotonic() + (0.5 if sig == signal.SIGTERM else wait_s)
            while (left := self.processes()) and time.monotonic() < deadline:
                time.sleep(0.05)
            for pid in left:
                try:
                    name = Path(f"/proc/{pid}/cmdline").read_bytes()[:80].replace(b"\0", b" ")
                except OSError:
                    continue
                log.info("sending %s to a process of the local cluster left after its node: %d %s", sig.name, pid,
                         name.decode(errors="replace"))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        # and again until none is left: a process forked between a scan and its kill (Ray's
        # agents start helpers) escaped one round, and at load 8-12 one was seen after the CLI
        # had exited
        end = time.monotonic() + 10.0
        while (left := self.processes()) and time.monotonic() < end:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)


def parents() -> dict[int, int]:
    """Each running process's parent, from ``/proc``."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                out[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return out


def descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def end_trees(roots: set[int]) -> None:
    """Kill ``roots`` and everything below them, with no way out: each is stopped (SIGSTOP)
    until a walk finds nothing new (a stopped process forks no more, and what it forked is
    still its child), then all are killed at once. Killing top-down would orphan the children
    before they were found."""
    roots.discard(os.getpid())
    stopped: set[int] = set()
    while left := descendants(roots | stopped) - stopped - {os.getpid()}:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= left
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def reap_nodes(envs: list[dict[str, str]]) -> list[str]:
    """``sandfleet sandbox rm --orphans`` in the environment of each node that left something
    (markers, snapshots or cgroups; all at once), then the nodes' cgroup parents removed."""
    from sandfleet.sandbox import cgroups

    roots = set(cgroups.detect().mounts.values())
    procs = []
    for env in envs:
        state = Path(env["SANDFLEET_STATE"])
        parent = env["SANDFLEET_CGROUP_PARENT"]
        left = [*state.glob("sf-*"), *state.glob("snapshots/*"),
                *(p for r in roots for p in (r / parent).glob("sf-*"))]
        if left:
            procs.append((env, subprocess.Popen([sys.executable, "-m", "sandfleet", "sandbox", "rm", "--orphans"],
                                                env=child_env(env), stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True)))
    reaped: list[str] = []
    for env, proc in procs:
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            log.error("reaping node %s failed: %s", env["SANDFLEET_STATE"], err.strip()[-500:])
        reaped += [w for w in out.split() if w.startswith("sf-")]
    for env in envs:
        for root in roots:
            d = root / env["SANDFLEET_CGROUP_PARENT"]
            if d.is_dir():
                try:
                    d.rmdir()
                except OSError as e:
                    log.error("could not remove the node's cgroup parent %s: %s", d, e)
    return reaped


def seed_cache(dst: Path, src: Path | None = None) -> None:
    """Let a node's own cache find this host's built images and guest agent: a symbolic link
    in ``dst`` per complete image and per agent build of ``src`` (read only: an image is
    complete once its ``image.json`` exists, and never changed after). What the node builds
    goes into ``dst`` itself."""
    from sandfleet.agent.build import cache_dir

    src = src or cache_dir()
    for name, complete in (("agent", lambda p: p.is_dir()), ("images", lambda p: (p / "image.json").is_file())):
        (dst / name).mkdir(parents=True, exist_ok=True)
        if not (src / name).is_dir():
            continue
        for entry in (src / name).iterdir():
            if not entry.name.startswith(".") and entry.is_dir() and complete(entry):
                (dst / name / entry.name).symlink_to(entry)
