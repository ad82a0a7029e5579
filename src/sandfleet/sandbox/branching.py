"""``branch(n)``: a live sandbox split n ways (docs/branching.md, "The primitive").

What every backend shares: the check for processes a branch would lose, what a child is told
it carries (:class:`BranchInfo`), the sessions a child continues, a fresh identity, and the
layers that several sandboxes stack on (:class:`Held`: freed when the last one closes).

On bwrap and gvisor the source's writable layer is *sealed*: the source's guest agent stops
(nothing of it is carried but its files, which stay), a second, detached mount of its disk is
held by file descriptor, and the children and the source's own continuation start over it, each
with a new empty upper layer (``lowerdir=/proc/self/fd/N/upper`` in the launcher: Linux 6.15+
takes a layer from a detached mount). Nothing is copied, so the cost does not grow with what
the source wrote; the chain of sealed layers is bounded by :data:`MAX_DEPTH`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sandfleet.errors import BranchError, ConfigError
from sandfleet.sandbox import disk
from sandfleet.sandbox.base import create_many
from sandfleet.sandbox.spec import helper_path
from sandfleet.sandbox.state import new_snapshot_dir

if TYPE_CHECKING:
    from sandfleet.sandbox.base import AgentSandbox, Session

log = logging.getLogger(__name__)

Processes = Literal["error", "drop"]
DRAIN_S = 2.0
"""How long a branch waits for the source's calls already under way before it lists processes."""
MAX_BRANCH = 100
"""The most children one call makes (E2B's ``fork(count<=100)``)."""
MAX_DEPTH = 64
"""The most sealed layers one sandbox stacks: each level adds a ``/proc/self/fd/N/upper``
(~25 bytes) to the overlay's ``lowerdir``, which the kernel reads from one page of mount
options (4096 bytes, shared with the image's layers and the upper's paths), and one loop
device held until the last sandbox over it closes; overlayfs itself stops at 500 lower layers.
A branch past it is a :class:`BranchError` (take a fresh sandbox from a snapshot instead)."""


@dataclass
class BranchInfo:
    """What a child of :meth:`branch` was made from and what it carries."""

    parent: str
    """The source sandbox's id."""
    carried: list[str]
    """"filesystem" and "sessions" on bwrap and gvisor; "memory" and "processes" too on microvm."""
    index: int = 0
    """This child's place among its siblings (0..n-1)."""
    dropped: list[tuple[int, str, str]] = field(default_factory=list)
    """The processes of the source not carried (``processes="drop"``): (pid, comm, cmdline)."""
    sessions: list[Session] = field(default_factory=list)
    """The source's open sessions, continued here in the same order (cwd, environment, shell
    variables, functions and aliases: each session's state is a file of the filesystem)."""


def check_count(n: int, processes: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_BRANCH:
        raise ConfigError(f"branch count must be an integer between 1 and {MAX_BRANCH}, not {n!r}")
    if processes not in ("error", "drop"):
        raise ConfigError(f'processes must be "error" or "drop", not {processes!r}')


# Every process of the sandbox but its init (the guest agent), this listing's own shell and what
# it forks, sandfleet's helpers (/.sandfleet/...) and sessions' shells between their commands.
_LIST = r"""
self=$$
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [ "$p" = 1 ] && continue; [ "$p" = "$self" ] && continue
  read -r st < "$d/stat" 2>/dev/null || continue
  rest=${st##*) }; set -- $rest
  [ "$2" = "$self" ] && continue; [ "$2" = 0 ] && continue
  read -r comm < "$d/comm" 2>/dev/null || continue
  args=(); mapfile -d '' args < "$d/cmdline" 2>/dev/null
  [ ${#args[@]} = 0 ] && continue
  case ${args[0]} in /.sandfleet/*) continue;; esac
  [ "${args[2]:-}" = sandfleet-session ] && continue
  printf '%s\t%s\t%s\n' "$p" "$comm" "${args[*]}"
done
"""


async def foreign_processes(sb: AgentSandbox, client: Any = None) -> list[tuple[int, str, str]]:
    """(pid, comm, cmdline) of each process in ``sb`` that is not sandfleet's own (asked through
    ``client``, its guest agent's, when its own runtime is held by a :class:`Gate`)."""
    # the guest agent's `procs` prints _LIST's lines without a bash (4 ms of a branch's 40); the script where
    # the agent has none (the process backend, SANDFLEET_NATIVE_HELPERS=0)
    async def run(argv: list[str]) -> Any:
        if client is None:
            return await sb.exec(argv, user="root", cwd="/", timeout=30)
        return await client.exec(argv, env=dict(sb.env), user="root", cwd="/", timeout=30)

    native = helper_path(sb.backend)
    res = await run([native, "procs"] if native else ["bash", "-c", _LIST])
    if res.exit_code != 0 and native:  # an agent without it (an older guest): the script
        res = await run(["bash", "-c", _LIST])
    if res.exit_code != 0:
        raise BranchError(f"listing the processes of {sb.id} failed: {res.output.strip()[:300]}")
    out = []
    for line in res.stdout.splitlines():
        pid, _, rest = line.partition("\t")
        comm, _, cmd = rest.partition("\t")
        if pid.isdigit():
            out.append((int(pid), comm, cmd))
    return out


def lost_error(sid: str, backend: str, procs: Sequence[tuple[int, str, str]]) -> BranchError:
    named = "; ".join(f"pid {p} {c} ({cmd[:80]})" for p, c, cmd in procs[:10])
    more = f" and {len(procs) - 10} more" if len(procs) > 10 else ""
    return BranchError(
        f"branch of {sid} would lose {len(procs)} running process(es): {named}{more}: the {backend} backend "
        "carries the filesystem and sessions, not processes (stop them first, pass processes=\"drop\", or "
        "branch on microvm, which carries memory)", list(procs))


class Held:
    """Something several sandboxes stack on (a sealed layer, a snapshot): ``cleanup`` runs
    once the last holder lets go."""

    def __init__(self, cleanup: Callable[[], None], what: str):
        self.refs = 0
        self.what = what
        self._cleanup: Callable[[], None] | None = cleanup

    def take(self) -> Held:
        self.refs += 1
        return self

    def drop(self) -> None:
        self.refs -= 1
        if self.refs <= 0 and self._cleanup is not None:
            cleanup, self._cleanup = self._cleanup, None
            try:
                cleanup()
            except OSError as e:
                log.error("freeing %s failed: %s", self.what, e)


class SealedLayer(Held):
    """A sandbox's writable layer, sealed: a detached mount of its disk held by ``fd``, whose
    ``upper/`` children stack read-only (``path``, valid in any process the fd is passed to)."""

    def __init__(self, fd: int, what: str):
        super().__init__(lambda: os.close(fd), what)
        self.fd = fd

    @property
    def path(self) -> Path:
        return Path(f"/proc/self/fd/{self.fd}/upper")


def drop_all(held: Sequence[Held]) -> None:
    for h in held:
        h.drop()


def identity_layer() -> tuple[Path, Callable[[], None]]:
    """A layer holding a new /etc/machine-id, owned as the host's /etc (host root), for the
    launcher to copy into a child's upper layer over the host's root, where no one inside may
    write /etc (the directory and file modes are the host's own). Returns (layer, remove)."""
    snap = new_snapshot_dir()  # marked with its owner: reaped if the owner dies
    etc = snap / "layer" / "etc"
    etc.mkdir(parents=True)
    host = Path("/etc")
    with contextlib.suppress(OSError):
        etc.chmod(host.stat().st_mode & 0o7777)
    (etc / "machine-id").write_text(uuid.uuid4().hex + "\n")
    (etc / "machine-id").chmod(0o444)
    return snap / "layer", lambda: shutil.rmtree(snap, ignore_errors=True)


async def fresh_identity(child: AgentSandbox) -> None:
    """A new /etc/machine-id (where the image has one, or an /etc to hold it); over the host's
    root the launcher wrote it already (:func:`identity_layer`)."""
    if getattr(child, "host_image", False):
        return
    mid = uuid.uuid4().hex
    res = await child.exec(["sh", "-c", '[ -d /etc ] && [ -w /etc ] || [ -w /etc/machine-id ] || exit 0; '
                            'printf "%s\\n" "$1" > /etc/machine-id', "sh", mid], user="root", cwd="/", timeout=30)
    if res.exit_code != 0:
        log.warning("child %s: /etc/machine-id not renewed: %s", child.id, res.output.strip()[:200])


def carry_sessions(source: AgentSandbox, child: AgentSandbox) -> list[Session]:
    """The source's open sessions, continued in ``child`` (same state file, user, cwd, env)."""
    from_source: list[Session] = list(getattr(source, "sessions", []))
    made = []
    for s in from_source:
        c = child.session(cwd=s.cwd, env=dict(s.env), user=s.user)
        c.state_file = s.state_file
        c._started = s._started
        made.append(c)
    return made


async def finish_children(source: AgentSandbox, children: Sequence[AgentSandbox], carried: list[str],
                          dropped: list[tuple[int, str, str]], *, identity: bool = True) -> None:
    """Give each child its identity, its BranchInfo and the source's sessions."""
    if identity:
        await asyncio.gather(*(fresh_identity(c) for c in children))
    for i, c in enumerate(children):
        c.branch_info = BranchInfo(parent=source.id, carried=list(carried), index=i, dropped=list(dropped),
                                   sessions=carry_sessions(source, c))


class Gate:
    """Stands in for a sandbox's runtime while the sandbox moves to a new guest agent: every
    call waits for the new one (``open``), then goes to it; a failed move fails them all."""

    def __init__(self, old: Any):
        self._old = old
        self._new: Any = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()

    def open(self, new: Any) -> None:
        self._new = new
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._ready.set()

    @property
    def alive(self) -> bool:
        return self._error is None and (self._new.alive if self._new is not None else True)

    @property
    def error(self) -> BaseException | None:
        return self._error if self._error is not None else (self._new.error if self._new is not None else None)

    async def settled(self) -> None:
        """Wait until the move is over (then the sandbox's runtime is the new one itself)."""
        await self._ready.wait()

    async def _target(self) -> Any:
        await self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._new

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            target = await self._target()
            fn: Callable[..., Awaitable[Any]] = getattr(target, name)
            return await fn(*args, **kwargs)
        return call


async def close_quietly(boxes: Sequence[Any]) -> None:
    for sb in boxes:
        try:
            await sb.close()
        except Exception as e:  # noqa: BLE001 - cleanup of a failed branch: logged with the id, never hidden
            log.error("closing %s after a failed branch failed: %s: %s", getattr(sb, "id", "?"), type(e).__name__, e)


def _clone(sb: Any) -> Any:
    """A second object over the same parts as ``sb`` (to close them without closing ``sb``)."""
    shell = object.__new__(type(sb))
    shell.__dict__.update(sb.__dict__)
    return shell


async def _drain(client: Any, timeout: float = DRAIN_S) -> None:
    """Wait (at most ``timeout``) for the calls already sent to ``client`` to be answered."""
    waiters = getattr(client, "_waiters", None)
    deadline = time.monotonic() + timeout
    while waiters and time.monotonic() < deadline:
        await asyncio.sleep(0.002)


async def branch_local(source: Any, n: int, processes: str, *, create: Callable[..., Awaitable[Any]],
                       prepare: Callable[[Any], Awaitable[None]] | None = None) -> list[Any]:
    """bwrap's and gvisor's branch. ``create(spec, layers=, stack=, hostname=)`` makes one
    sandbox over ``stack`` (sealed layers, top first) and ``layers`` (stored ones);
    ``prepare(client)`` runs through the source's guest agent once its new calls wait."""
    check_count(n, processes)
    source._check()
    if len(source.stack) + 1 > MAX_DEPTH:
        raise BranchError(f"branch of {source.id}: {len(source.stack)} layers are stacked already, the most is "
                          f"{MAX_DEPTH} (the overlay's mount options fit one page): start from a snapshot instead")
    carried = ["filesystem", "sessions"]
    old_client = source.client
    gate = Gate(old_client)
    source.client = gate  # from here the source's new calls wait: what they would write comes after the branch
    try:
        await _drain(old_client)  # calls already under way (a command still running then counts as a process)
        procs = await foreign_processes(source, old_client)
        if procs and processes == "error":
            raise lost_error(source.id, source.backend, procs)
        if prepare is not None:
            await prepare(old_client)
    except BaseException:
        source.client = old_client
        gate.open(old_client)
        raise
    host_image = source.host_image
    if source.loop is None or procs:
        source.client = old_client
        gate.open(old_client)
        # a tmpfs layer (no second mount of it from here), or processes left running in the
        # source: copy the layer (cost grows with it), the source untouched
        snap = await source.snapshot()
        held = Held(snap.delete, f"snapshot {snap.id} of {source.id}").take()
        try:
            children = await create_many([lambda: create(source.spec, layers=snap.layers, stack=[held, *source.stack],
                                                         hostname="")] * n)
        finally:
            held.drop()
        await finish_children(source, children, carried, procs)
        return children
    old = _clone(source)
    old.client = old_client
    try:
        sealed = SealedLayer(disk.fsmount_ext4(source.loop.path), f"sealed layer of {source.id}")
    except BaseException:
        source.client = old_client
        gate.open(old_client)
        raise
    stack: list[Held] = [sealed, *source.stack]
    for h in stack:
        h.take()  # held by this call until the new sandboxes hold them
    try:
        await old.close()  # the old guest agent and everything of it; its files stay, sealed
        layers = [] if host_image else list(source.layers)

        async def go_on() -> None:
            """The source's continuation, first: its commands wait only for this one start."""
            try:
                twin = await create(source.spec, layers=layers, stack=stack, hostname="sandbox")
            except BaseException:
                try:  # once more: the source must go on
                    twin = await create(source.spec, layers=layers, stack=stack, hostname="sandbox")
                except BaseException as e:
                    gate.fail(e)
                    raise
            _transplant(source, twin)
            gate.open(source.client)

        source_task = asyncio.ensure_future(go_on())
        try:
            children = await create_many([lambda: create(source.spec, layers=layers, stack=stack, hostname="")] * n)
        except BaseException:
            await asyncio.gather(source_task, return_exceptions=True)  # (its failure is in the gate)
            raise
        try:
            await source_task
        except BaseException:
            await close_quietly(children)
            raise
    finally:
        drop_all(stack)
    # the next branch's disks, bound ahead from now (not during this one: its starts need the cores)
    disk.want_ready(source.spec.limits.disk_mib, None, n + 1)
    await finish_children(source, children, carried, [])
    return children


def _transplant(source: Any, twin: Any) -> None:
    """``source`` goes on as ``twin`` (its new guest agent, disk, cgroup...), keeping its id."""
    keep = {"id", "spec", "sessions", "created", "_closed", "env", "branch_info"}
    for k, v in twin.__dict__.items():
        if k not in keep:
            setattr(source, k, v)
    source.agent.client.describe_death = source._death_detail


