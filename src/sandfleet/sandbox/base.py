"""The sandbox contract, and the shared implementation over a guest agent.

A backend only does lifecycle (create, snapshot, fork, close); every operation a user
runs (exec, sessions, files, uploads) goes through the same guest agent protocol, so all
backends behave the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import posixpath
import shlex
import shutil
import tarfile
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, Unpack, runtime_checkable

from sandfleet.agent.client import AgentClient, CommandOptions, ExecResult, OutputCallback, RunOptions, StartCallback
from sandfleet.agent.runtime import Runtime
from sandfleet.errors import (
    ConfigError,
    HostUnsupportedError,
    SandboxClosedError,
    SandboxDiedError,
    SandboxPathError,
    SandboxUnresponsiveError,
)
from sandfleet.sandbox.spec import SandboxSpec, check_user, helper_path, is_root

log = logging.getLogger(__name__)
DEFAULT_MAX_OUTPUT = 1 << 20
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "PYTHONDONTWRITEBYTECODE": "1",
}


class ExecOptions(CommandOptions, total=False):
    """A sandbox's ``exec`` options (``Sandbox.exec(cmd, **opts)``): every level's
    :class:`~sandfleet.agent.client.CommandOptions`, and what only a sandbox's own guest agent
    carries."""

    stdin: bytes | str | bool | None  # bytes (or text) to feed, then EOF; True: kept open (on_start)
    pty: tuple[int, int] | None  # (cols, rows): on a new pseudo-terminal
    on_start: StartCallback | None  # gets the RunningCommand once it has started


EXEC_OPTIONS = ExecOptions.__optional_keys__


@runtime_checkable
class Sandbox(Protocol):
    """What every sandbox offers, whatever the backend."""

    id: str
    backend: str
    spec: SandboxSpec

    @property
    def alive(self) -> bool: ...

    async def exec(self, cmd: str | Sequence[str], **opts: Unpack[ExecOptions]) -> ExecResult: ...

    async def read_file(self, path: str, *, user: str | int | None = None, max_bytes: int | None = None,
                        nofollow: bool = False) -> bytes: ...
    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644,
                         user: str | int | None = None) -> None: ...
    async def upload(self, local: str | Path, remote_dir: str, *, user: str | int | None = None) -> None: ...
    async def kill_user(self, user: str | int) -> None: ...
    async def kill_everyone(self) -> bool: ...
    async def download(self, remote: str, local_dir: str | Path, *, max_bytes: int = 256 << 20) -> Path: ...
    def session(self, *, cwd: str | None = None, env: dict[str, str] | None = None,
                user: str | int | None = None) -> Session: ...
    async def snapshot(self) -> Snapshot: ...
    async def branch(self, n: int, *, processes: Literal["error", "drop"] = "error") -> list[Sandbox]:
        """``n`` live sandboxes that continue from this one's state at this instant; this one
        keeps running. Each child's ``branch_info`` says what was carried (docs/branching.md)."""
        ...
    async def close(self) -> None: ...


class Backend(Protocol):
    """Lifecycle of one kind of sandbox."""

    name: str

    async def create(self, spec: SandboxSpec) -> Sandbox: ...
    async def fork(self, snapshot: Snapshot, n: int) -> list[Sandbox]: ...


class Snapshot:
    """A saved sandbox state that new sandboxes can start from.

    ``layer`` is a directory holding the writable layer's files at snapshot time (the
    filesystem state); backends that can also save memory keep it in ``memory``.
    """

    def __init__(self, *, backend: str, spec: SandboxSpec, layer: Path | None,
                 layers: list[Path] | None = None, memory: Path | None = None, cleanup: Any = None):
        self.id = f"snap-{uuid.uuid4().hex[:10]}"
        self.backend = backend
        self.spec = spec
        self.layer = layer
        self.layers = layers if layers is not None else ([layer] if layer else [])
        """Every layer above the image, top first (a snapshot of a fork stacks on its parent's)."""
        self.memory = memory
        self._cleanup = cleanup

    def delete(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
            self._cleanup = None


def new_id(backend: str) -> str:
    return f"sf-{backend}-{uuid.uuid4().hex[:12]}"


def sandbox_path(path: str, workdir: str) -> str:
    """Normalize a path inside the sandbox: relative to ``workdir``, no NULs, no escaping /."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise SandboxPathError(f"invalid sandbox path {path!r}")
    full = posixpath.normpath(posixpath.join(workdir, path))
    if full.startswith("//"):
        full = full[1:]
    parts = posixpath.join(workdir, path).split("/")
    depth = 0
    for part in parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                raise SandboxPathError(f"path {path!r} escapes the sandbox root")
        elif part not in ("", "."):
            depth += 1
    return full


_check_user_memo = functools.lru_cache(maxsize=1024)(check_user)
_sandbox_path_memo = functools.lru_cache(maxsize=1024)(sandbox_path)
"""sandbox_path of strings, remembered: every exec normalizes its cwd (the workdir, mostly: a few
microseconds of each round trip, issue 46). An error is raised each time, never remembered."""


def any_owner_git(env: dict[str, str]) -> dict[str, str]:
    """``env``'s git config with ``safe.directory=*`` added (GIT_CONFIG_COUNT and its pair), for the
    sandboxes whose commands are root over files the image gave the task's user: git's ownership check
    ("dubious ownership") refused every repository of the workdir there, and the oracle of every git task
    scored 0 (a microVM, issue 42; a root agent on bwrap and gVisor). Root owns the sandbox: no user's
    repository is another's to guard there (the tests' git gets its own config: rollout/testguard.py)."""
    n = int(env["GIT_CONFIG_COUNT"]) if env.get("GIT_CONFIG_COUNT", "").isdigit() else 0
    return {"GIT_CONFIG_COUNT": str(n + 1), f"GIT_CONFIG_KEY_{n}": "safe.directory", f"GIT_CONFIG_VALUE_{n}": "*"}


class AgentSandbox:
    """Shared implementation of the contract over a :class:`~sandfleet.agent.runtime.Runtime`
    (the guest agent's AgentClient, or a service's RemoteRuntime). Backends subclass it."""

    backend = "agent"
    commands_are_root = False
    """Whether every command runs as root, whatever user it names (a microVM's)."""

    def __init__(self, sid: str, spec: SandboxSpec, client: Runtime):
        self.id = sid
        self.spec = spec
        self.client = client
        self.created = time.time()
        self._closed = False
        self.env = {**BASE_ENV, "HOME": "/home/agent", **spec.env}
        if self.commands_are_root or is_root(spec.user):  # (a root agent: Docker's behaviour, --agent-user root)
            self.env.update(any_owner_git(self.env))
        self.sessions: list[Session] = []  # the open ones: a branch continues them in its children
        self.branch_info: Any = None  # a child of branch(): what it was made from (sandbox.branching.BranchInfo)

    # -- state
    @property
    def alive(self) -> bool:
        return not self._closed and self.client.alive

    def _check(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.id} is closed")
        if not self.client.alive:
            err = self.client.error
            if isinstance(err, SandboxUnresponsiveError):  # keep the reason: agent_unresponsive
                raise SandboxUnresponsiveError(f"sandbox {self.id} is dead: {err}")
            if isinstance(err, SandboxDiedError):  # keep how it ended (rollout/verdict.py reads it)
                raise SandboxDiedError(str(err), end=err.end, head=err.head)
            raise SandboxDiedError(str(err) if err is not None else f"sandbox {self.id} died")

    def _path(self, path: str) -> str:
        """Translate a sandbox path for the guest (the process backend maps it to the host)."""
        workdir = self.spec.workdir
        return _sandbox_path_memo(path, workdir) if isinstance(path, str) else sandbox_path(path, workdir)

    # -- operations
    async def exec(self, cmd: str | Sequence[str], **opts: Unpack[ExecOptions]) -> ExecResult:
        """Run ``cmd`` (argv list, or a string run by ``bash -c``) and wait for it, as ``user``
        (a name or uid inside the sandbox; default: the sandbox's user, ``spec.user``).

        ``stdin`` is bytes to feed (then EOF), or True to keep stdin open: ``on_start`` gets
        the command's :class:`~sandfleet.agent.client.RunningCommand`, which sends input,
        closes it and signals the command. ``pty=(cols, rows)`` runs it on a new
        pseudo-terminal (stdin, stdout and stderr; all output comes as "stdout"), resizable
        through the same handle.
        ``network=False`` runs it in a network namespace of its own, with only a loopback (the
        verifier's no-network policy); bwrap and microvm only (the process backend refuses).
        ``pid_namespace=True`` runs it as the first process of a pid namespace of its own: when
        it exits, the kernel kills every process it left (bwrap and microvm; elsewhere ignored)."""
        self._check()
        settling = getattr(self.client, "settled", None)  # a branch moving this sandbox (branching.Gate)
        if settling is not None:
            await settling()
            self._check()
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise SandboxPathError("empty command")
        if unknown := opts.keys() - EXEC_OPTIONS:  # what a typed caller can't pass, an untyped one can
            raise ConfigError(f"exec: no option {', '.join(sorted(unknown))} "
                              f"(it takes {', '.join(sorted(EXEC_OPTIONS))})")
        stdin, pty, on_start = opts.pop("stdin", None), opts.pop("pty", None), opts.pop("on_start", None)
        common: CommandOptions = opts  # the rest travels as it is: a new option is not written out here
        data = stdin.encode() if isinstance(stdin, str) else (None if isinstance(stdin, bool) else stdin)
        run: RunOptions = {**common, "env": {**self.env, **(opts.get("env") or {})}, "stdin": data,
                           "cwd": self._path(opts.get("cwd") or self.spec.workdir),
                           "user": self._user(opts.get("user"))}
        keep = stdin is True
        if keep or pty is not None or on_start is not None:
            if not isinstance(self.client, AgentClient):
                raise ConfigError("stdin=True, pty and on_start need the sandbox's own guest agent "
                                  f"({type(self.client).__name__} can't carry them)")
            return await self.client.exec(argv, keep_stdin=keep, pty=pty, on_start=on_start, **run)
        return await self.client.exec(argv, **run)

    def _user(self, user: str | int | None) -> str:
        try:
            return _check_user_memo(self.spec.user if user is None else user)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    async def read_file(self, path: str, *, user: str | int | None = None, max_bytes: int | None = None,
                        nofollow: bool = False) -> bytes:
        """A file's bytes, read as ``user``. Only regular files are read (a FIFO or device
        is refused, never waited on); ``nofollow`` also refuses a symlink as the last
        component; more than ``max_bytes`` is an error."""
        self._check()
        kw: dict[str, Any] = {} if max_bytes is None else {"max_bytes": max_bytes}
        return await self.client.read_file(self._path(path), user=self._user(user), nofollow=nofollow, **kw)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644,
                         user: str | int | None = None) -> None:
        """Write a regular file as ``user`` (who owns it if it is new)."""
        self._check()
        raw = data.encode() if isinstance(data, str) else data
        await self.client.write_file(self._path(path), raw, mode=mode, user=self._user(user))

    async def kill_user(self, user: str | int) -> None:
        """Kill every process of ``user`` in the sandbox; returns once they are gone. (On the
        process backend, which has no users, every process the sandbox started.)"""
        self._check()
        await self.client.kill_user(self._user(user))

    async def kill_everyone(self) -> bool:
        """Kill every process in the sandbox, whatever its user, but the guest agent's own; returns
        once they are gone, True. False where that is not one request here (a held sandbox, a
        service older than it): the caller then kills user by user (what a root command left under
        any uid)."""
        self._check()
        return await self.client.kill_everyone()

    async def upload(self, local: str | Path, remote_dir: str, *, user: str | int | None = None) -> None:
        """Copy a local file or directory into ``remote_dir`` (created if missing), as ``user``."""
        local = Path(local)
        if not local.exists():
            raise FileNotFoundError(f"nothing to upload at {local}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            if local.is_dir():
                for child in sorted(local.iterdir()):
                    tar.add(child, arcname=child.name)
            else:
                tar.add(local, arcname=local.name)
        dest = self._path(remote_dir)
        data = buf.getvalue()
        res = None
        # the guest agent's untar (agent/untar.c): the same in one process of its own; exit 75 (or an
        # agent without it) leaves the archive to tar
        agent = helper_path(self.backend)
        if agent is not None:
            res = await self.exec([agent, "untar", dest], stdin=data, cwd="/", user=user)
            if res.exit_code != 0:
                log.debug("the guest agent's untar left %s to tar (exit %s): %s", dest, res.exit_code,
                          res.stderr.strip()[-300:])
                res = None
        if res is None:
            res = await self.exec(
                # mkdir only where the folder is missing, and tar in the shell's place: one process, not three
                ["sh", "-c", '{ [ -d "$1" ] || mkdir -p "$1"; } && exec tar -x --no-same-owner -C "$1"', "sh", dest],
                stdin=data,
                cwd="/",
                user=user,
            )
        if res.exit_code != 0:
            raise SandboxPathError(f"upload to {dest} failed: {res.stderr.strip()}")

    async def download(self, remote: str, local_dir: str | Path, *, max_bytes: int = 256 << 20) -> Path:
        """Copy a sandbox file or directory into ``local_dir``; returns the local path.

        The archive is at most ``max_bytes`` (a larger one is refused with SandboxPathError,
        never extracted in part); it is unpacked with tarfile's "data" filter into a scratch
        directory first, so links or paths that point outside ``local_dir`` are refused and
        a failed download leaves nothing behind.
        """
        src = self._path(remote)
        parent, name = posixpath.split(src.rstrip("/") or "/")
        res = await self.exec(
            ["tar", "-c", "-C", parent or "/", name], max_output=max_bytes + 1, cwd="/"
        )
        if res.exit_code != 0:
            raise SandboxPathError(f"download of {src} failed: {res.stderr.strip()}")
        data = res.stdout_bytes
        if res.truncated or len(data) > max_bytes:
            raise SandboxPathError(f"download of {src} refused: its archive is larger than {max_bytes} bytes "
                                   "(pass a larger max_bytes, or download less)")
        out = Path(local_dir)
        out.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".sandfleet-download-", dir=out))
        try:
            try:
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    tar.extractall(scratch, filter="data")
            except tarfile.FilterError as e:
                raise SandboxPathError(f"download of {src} refused: {e}") from None
            except (tarfile.TarError, EOFError) as e:
                raise SandboxPathError(f"download of {src} failed: a damaged archive ({e})") from None
            got = scratch / name
            if not got.exists() and not got.is_symlink():
                raise SandboxPathError(f"download of {src} failed: the archive does not hold {name!r}")
            target = out / name
            if target.is_dir() and not target.is_symlink() and got.is_dir():
                shutil.copytree(got, target, symlinks=True, dirs_exist_ok=True)
            else:
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                got.replace(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return out / name

    def session(self, *, cwd: str | None = None, env: dict[str, str] | None = None,
                user: str | int | None = None) -> Session:
        """A shell session as ``user``: cwd, exported and shell variables survive between commands."""
        s = Session(self, cwd=cwd or self.spec.workdir, env=env or {}, user=user)
        self.sessions.append(s)
        return s

    async def snapshot(self) -> Snapshot:
        raise NotImplementedError(f"{self.backend} sandboxes can't snapshot")

    async def branch(self, n: int, *, processes: Literal["error", "drop"] = "error") -> list[Sandbox]:
        raise HostUnsupportedError(f"{self.backend} sandboxes can't branch (bwrap, gvisor and microvm can)")

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> AgentSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("alive" if self.client.alive else "dead")
        return f"<{type(self).__name__} {self.id} image={self.spec.image} {state}>"


_SESSION_SCRIPT = r"""
__sf_state="$1"; shift
if [ -f "$__sf_state" ]; then . "$__sf_state" 2>/dev/null; fi
__sf_save() {
  __sf_rc=$?
  __sf_skip='BASH|BASHOPTS|BASHPID|BASH_[A-Z_]*|EUID|PPID|SHELLOPTS|UID|GROUPS|FUNCNAME|PIPESTATUS|RANDOM'
  __sf_skip+='|SECONDS|LINENO|HISTCMD|SRANDOM|EPOCHREALTIME|EPOCHSECONDS|DIRSTACK|_|__sf_[a-z_]*|OPTIND|OPTERR|IFS'
  { declare -p 2>/dev/null | grep -vE "^declare -[a-zA-Z]*r|^declare -[^ ]* ($__sf_skip)="
    for __sf_f in $(compgen -A function); do
      case $__sf_f in __sf_*) ;; *) declare -f "$__sf_f";; esac
    done
    echo "cd $(printf %q "$PWD") 2>/dev/null"; } > "$__sf_state.tmp" 2>/dev/null \
    && mv -f "$__sf_state.tmp" "$__sf_state"
  exit $__sf_rc
}
trap __sf_save EXIT
eval "$1"
"""


class Session:
    """A persistent shell. Each command runs in a fresh ``bash`` that loads the state the
    previous one saved (variables, functions, cwd), so a command killed by its timeout
    loses only its own changes and the session stays usable (``usable`` says so)."""

    def __init__(self, sandbox: AgentSandbox, *, cwd: str, env: dict[str, str], user: str | int | None = None):
        self.sandbox = sandbox
        self.user = user
        self.state_file = f"/tmp/.sandfleet-session-{uuid.uuid4().hex[:8]}"
        self.cwd = cwd
        self.env = env
        self._started = False

    @property
    def usable(self) -> bool:
        return self.sandbox.alive

    async def run(self, command: str, *, timeout: float | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
                  on_output: OutputCallback | None = None, on_start: StartCallback | None = None,
                  pty: tuple[int, int] | None = None) -> ExecResult:
        """Run ``command`` in the session; ``on_start`` gets its RunningCommand (to interrupt
        it, or type into it with ``pty=(cols, rows)``: a terminal)."""
        if not self._started:
            init = f"cd {shlex.quote(self.sandbox._path(self.cwd))}\n" + "".join(
                f"export {k}={shlex.quote(v)}\n" for k, v in self.env.items()
            )
            await self.sandbox.write_file(self.state_file, init, mode=0o600, user=self.user)
            self._started = True
        return await self.sandbox.exec(
            ["bash", "-c", _SESSION_SCRIPT, "sandfleet-session", self.sandbox._path(self.state_file), command],
            timeout=timeout, max_output=max_output, on_output=on_output, user=self.user, on_start=on_start,
            pty=pty,
        )

    async def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.sandbox.sessions.remove(self)
        if self.sandbox.alive:
            with contextlib.suppress(Exception):
                path = self.sandbox._path(self.state_file)
                await self.sandbox.exec(["rm", "-f", path, path + ".tmp"], cwd="/", user=self.user)


async def wait_process(proc: asyncio.subprocess.Process, timeout: float) -> int | None:
    with contextlib.suppress(TimeoutError, ProcessLookupError):
        async with asyncio.timeout(timeout):
            return await proc.wait()
    return None


async def create_many(factories: Sequence[Any]) -> list[Any]:
    """Run sandbox factories concurrently; if one fails, close every one that was made (a
    failed close is logged with the sandbox id) and raise the first error (itself, not the
    TaskGroup's ExceptionGroup: callers map sandfleet's errors by type, and a host out of
    some resource fails many creations at once)."""
    tasks: list[asyncio.Task[Any]] = []
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(f()) for f in factories]
    except BaseException as e:
        made = [t.result() for t in tasks if t.done() and not t.cancelled() and t.exception() is None]
        closes = await asyncio.gather(*(sb.close() for sb in made), return_exceptions=True)
        for sb, err in zip(made, closes, strict=True):
            if isinstance(err, BaseException):
                logging.getLogger(__name__).error(
                    "closing sandbox %s of a failed batch failed: %s: %s", sb.id, type(err).__name__, err)
        if isinstance(e, BaseExceptionGroup):
            first: BaseException = e
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            if len(e.exceptions) > 1:
                logging.getLogger(__name__).warning("%d of %d sandbox creations failed; the first: %s: %s",
                                                    len(e.exceptions), len(factories), type(first).__name__, first)
            raise first from None
        raise
    return [t.result() for t in tasks]
