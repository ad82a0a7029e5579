"""Start a guest agent as a local process (under bwrap or bare) and connect to it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from sandfleet.agent.client import AgentClient, FrameReader
from sandfleet.errors import SandboxDiedError, SandboxEnd
from sandfleet.reaping import adopt_children, reap_group, reap_group_nowait, wait_adopted
from sandfleet.sandbox import spawner
from sandfleet.sandbox.base import AgentSandbox
from sandfleet.sandbox.cgroups import Cgroup
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.sandbox.state import proc_start_time, remove_sandbox_dir, write_meta


def _pidfd_works() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


PIDFD = _pidfd_works()
"""This kernel has pidfds (Linux 5.3+)."""
LOG_TAIL = 600
"""Bytes of a dead sandbox's agent.log put in its error."""


class Child:
    """A child process whose exit the running loop learns from a pidfd: what
    ``asyncio.subprocess.Process`` offers here (pid, returncode, wait, kill, send_signal),
    without its per-child waiter thread and transport tasks (~0.5 ms of each sandbox's
    start on this host). Reaped in the loop callback that sees the pidfd readable."""

    def __init__(self, popen: subprocess.Popen[bytes] | spawner.Spawned, loop: asyncio.AbstractEventLoop):
        self._popen = popen
        self.pid = popen.pid
        self._loop = loop
        self._exited: asyncio.Future[None] = loop.create_future()
        self._pidfd = os.pidfd_open(popen.pid)
        loop.add_reader(self._pidfd, self._on_exit)

    def _on_exit(self) -> None:
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._popen.wait()  # exited (the pidfd said so): reaps it without blocking
        if not self._exited.done():
            self._exited.set_result(None)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        await asyncio.shield(self._exited)
        rc = self._popen.returncode
        assert rc is not None
        return rc

    def send_signal(self, sig: int) -> None:
        if self._popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)  # not reaped before _on_exit: the pid is still ours

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


async def _spawn(argv: list[str], *, stderr: IO[bytes], cwd: str | None, env: dict[str, str],
                 new_session: bool, pass_fds: tuple[int, ...], sockets: bool = False,
                 ) -> tuple[Child | asyncio.subprocess.Process, asyncio.StreamReader, asyncio.StreamWriter]:
    """Start ``argv`` with pipes on stdin and stdout: the process, a reader of its stdout
    (1 MiB limit) and a writer to its stdin. ``sockets``: a socket pair each instead of pipes,
    which a process of the sandbox can't open again through ``/proc/<agent>/fd`` (a pipe it can
    where the kernel lets it see the agent's descriptors: gVisor's root)."""
    if sockets:
        return await _spawn_on_sockets(argv, stderr=stderr, cwd=cwd, env=env, new_session=new_session,
                                       pass_fds=pass_fds)
    if not PIDFD:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
            cwd=cwd, env=env, start_new_session=new_session, pass_fds=pass_fds, limit=1 << 20)
        assert proc.stdout is not None and proc.stdin is not None
        return proc, proc.stdout, proc.stdin
    in_r, in_w = os.pipe()  # (not inherited: what the child gets is passed to it as its 0 and 1)
    out_r, out_w = os.pipe()
    try:
        popen = await _start_off_loop(argv, stdin=in_r, stdout=out_w, stderr=stderr.fileno(), cwd=cwd, env=env,
                                      new_session=new_session, pass_fds=pass_fds)
    except BaseException:
        os.close(in_w)
        os.close(out_r)
        raise
    finally:
        os.close(in_r)
        os.close(out_w)
    return await _attach(popen, open(out_r, "rb", buffering=0), open(in_w, "wb", buffering=0))


async def _start_off_loop(argv: list[str], *, stdin: int, stdout: int, stderr: int, cwd: str | None,
                          env: dict[str, str], new_session: bool, pass_fds: tuple[int, ...],
                          ) -> subprocess.Popen[bytes] | spawner.Spawned:
    """:func:`_start` in a worker thread: the spawner answers once the new process has made its
    exec (a fork and exec with Popen), and the event loop that waited for it was held for that
    long, 2-7 ms a start where starts share the cores (a branch's n + 1): every other sandbox of
    this process waited with it. The caller's descriptors stay open until it returns. Cancelled,
    the start goes on in its thread, and what it started is killed and reaped there. A start with
    no other agent's start under way is made here: the thread's hop cost a lone create 0.5 ms (of 10)."""
    def start() -> subprocess.Popen[bytes] | spawner.Spawned:
        return _start(argv, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=env, new_session=new_session,
                      pass_fds=pass_fds)

    if _starting <= 1:
        return start()
    fut = _spawn_threads().submit(start)
    try:
        return await asyncio.shield(asyncio.wrap_future(fut))
    except asyncio.CancelledError:
        fut.add_done_callback(lambda f: _abandon(f, new_session))
        with contextlib.suppress(BaseException):  # the descriptors the caller closes next are still the start's
            fut.result()
        raise


def _abandon(fut: concurrent.futures.Future[subprocess.Popen[bytes] | spawner.Spawned], group: bool) -> None:
    """A start whose caller was cancelled: its process (and its session) killed, and reaped."""
    if fut.exception() is not None:
        return
    proc = fut.result()
    with contextlib.suppress(ProcessLookupError):
        os.kill(-proc.pid if group else proc.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        proc.wait()


_spawners: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None
_starting = 0
"""Agents of this process starting (:meth:`AgentProcess.start`, until their HELLO)."""


def _spawn_threads() -> concurrent.futures.ThreadPoolExecutor:
    """This process's threads that start processes (a forked child gets its own)."""
    global _spawners
    if _spawners is None or _spawners[0] != os.getpid():
        _spawners = (os.getpid(), concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="sandfleet-spawn"))
    return _spawners[1]


def _start(argv: list[str], *, stdin: int, stdout: int, stderr: int, cwd: str | None, env: dict[str, str],
           new_session: bool, pass_fds: tuple[int, ...]) -> subprocess.Popen[bytes] | spawner.Spawned:
    """``argv`` started with these descriptors as its 0, 1 and 2: from this process's spawner
    (sandbox/spawner.py: a start whose cost does not grow with the descriptors this process
    holds), else with ``Popen``."""
    proc = spawner.spawn(argv, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=env,
                         new_session=new_session, pass_fds=pass_fds)
    if proc is not None:
        return proc
    return subprocess.Popen(  # noqa: ASYNC220 (a fork and exec, as asyncio's own subprocess does)
        argv, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=env,
        start_new_session=new_session, pass_fds=pass_fds, bufsize=0)


READ_CHUNK = 64 << 10
"""Bytes each read of the agent's stream asks for. asyncio's pipe transport asks 256 KiB: glibc
maps a buffer that size afresh for every read (over its 128 KiB threshold), shrinks it to what came
(mremap) and unmaps it: three system calls and a page fault per reply, about a fifth of the host's
CPU per exec round trip (issue 46). Under the threshold it is the heap's."""


async def _attach(popen: subprocess.Popen[bytes] | spawner.Spawned, out: object, into: object,
                  log: tuple[socket.socket, IO[bytes]] | None = None,
                  ) -> tuple[Child, asyncio.StreamReader, asyncio.StreamWriter]:
    """The started agent's stream: a :class:`FrameReader` on ``out`` (its stdout; frames handed
    over in the transport's callback), a writer to ``into`` (its stdin), and where ``log`` is
    given its stderr's socket copied into the log file; the process is killed if any fails."""
    loop = asyncio.get_running_loop()
    made: list[asyncio.BaseTransport] = []
    try:
        child = Child(popen, loop)
        reader = FrameReader(limit=1 << 20, loop=loop)
        made.append(read := (await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                                          out))[0])
        if isinstance(getattr(read, "max_size", None), int):
            read.max_size = READ_CHUNK  # type: ignore[attr-defined]
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop), into)
        made.append(transport)
        if log is not None:
            sock, file = log
            await loop.connect_read_pipe(lambda: _LogSink(os.dup(file.fileno())), sock)
    except BaseException:  # (a cancel too): the process killed, its pipes closed, none left to the collector
        popen.kill()
        popen.wait()
        for t in made:
            t.close()
        for f in (out, into):
            close = getattr(f, "close", None)
            if close is not None:
                close()
        raise
    return child, reader, asyncio.StreamWriter(transport, protocol, None, loop)


async def _spawn_on_sockets(argv: list[str], *, stderr: IO[bytes], cwd: str | None, env: dict[str, str],
                            new_session: bool, pass_fds: tuple[int, ...],
                            ) -> tuple[Child, asyncio.StreamReader, asyncio.StreamWriter]:
    """:func:`_spawn` with a socket pair for stdin and another for stdout (two: a write
    transport on a socket takes it being readable for its peer's close)."""
    host_in, guest_in = socket.socketpair()
    host_out, guest_out = socket.socketpair()
    host_err, guest_err = socket.socketpair()  # the log too: a file of the host's, otherwise
    socks = (host_in, guest_in, host_out, guest_out, host_err, guest_err)
    try:
        popen = _start(argv, stdin=guest_in.fileno(), stdout=guest_out.fileno(), stderr=guest_err.fileno(),
                       cwd=cwd, env=env, new_session=new_session, pass_fds=pass_fds)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    for sock in (guest_in, guest_out, guest_err):
        sock.close()
    try:
        return await _attach(popen, host_out, host_in, (host_err, stderr))
    except BaseException:
        for sock in (host_in, host_out, host_err):
            sock.close()
        raise


LOG_CAP = 4 << 20
"""The most of a sandbox's log (the agent's stderr) kept on the host, where it reaches the log
through a socket: past it the rest is read and dropped, so a process that writes there can't
fill the host's disk."""


class _LogSink(asyncio.Protocol):
    """What arrives on the agent's stderr, appended to its log file (``fd``, closed at the end)
    up to :data:`LOG_CAP` bytes."""

    def __init__(self, fd: int) -> None:
        self.fd, self.left = fd, LOG_CAP

    def data_received(self, data: bytes) -> None:
        if self.left > 0:
            chunk = data[:self.left]
            self.left -= len(chunk)
            with contextlib.suppress(OSError):
                os.write(self.fd, chunk)  # (a regular file: whole, at once)
            if self.left <= 0:
                with contextlib.suppress(OSError):
                    os.write(self.fd, b"\n[sandfleet: the log is cut here, at its cap]\n")

    def connection_lost(self, exc: Exception | None) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class AgentProcess:
    """A local process that runs (or wraps) the guest agent, with its stream and marker."""

    def __init__(self, proc: Child | asyncio.subprocess.Process, client: AgentClient, log: Path):
        self.proc = proc
        self.client = client
        self.log = log
        self.adopted: list[int] = []  # pidfds of its children that may outlive it (bwrap's)
        self.group = 0  # its process group, when it leads a session of its own

    @classmethod
    async def start(
        cls, argv: list[str], *, sid: str, sandbox_dir: Path, meta: Mapping[str, object],
        cwd: str | None = None, env: dict[str, str] | None = None, new_session: bool = False,
        ready_timeout: float = 30.0, pass_fds: tuple[int, ...] = (), seccomp: bytes | None = None,
        sockets: bool = False,
    ) -> AgentProcess:
        global _starting
        _starting += 1
        try:
            return await cls._start(argv, sid=sid, sandbox_dir=sandbox_dir, meta=meta, cwd=cwd, env=env,
                                    new_session=new_session, ready_timeout=ready_timeout, pass_fds=pass_fds,
                                    seccomp=seccomp, sockets=sockets)
        finally:
            _starting -= 1

    @classmethod
    async def _start(
        cls, argv: list[str], *, sid: str, sandbox_dir: Path, meta: Mapping[str, object],
        cwd: str | None, env: dict[str, str] | None, new_session: bool, ready_timeout: float,
        pass_fds: tuple[int, ...], seccomp: bytes | None, sockets: bool,
    ) -> AgentProcess:
        log = sandbox_dir / "agent.log"
        with open(log, "wb") as errf:
            proc, stdout, stdin = await _spawn(
                argv, stderr=errf, cwd=cwd,
                # never the caller's PATH: the root launcher runs only absolute paths anyway
                env=env if env is not None else {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                new_session=new_session, pass_fds=pass_fds, sockets=sockets)
        write_meta(sandbox_dir, {**meta, "pids": [proc.pid], "pid_starts": {str(proc.pid): proc_start_time(proc.pid)}})
        ttl = meta.get("ttl_s")  # bounds the host's wait on an exec without a timeout
        client = AgentClient(stdout, stdin, name=sid, ttl=ttl if isinstance(ttl, int | float) else None)
        self = cls(proc, client, log)
        self.group = proc.pid if new_session else 0
        try:
            async with asyncio.timeout(ready_timeout):
                await client.hello(seccomp=seccomp)
            self.adopted = adopt_children(proc.pid)  # (bwrap's child exists once the agent answered)
        except BaseException as e:
            await self.stop()
            detail = log.read_text(errors="replace").strip()[-2000:] if log.exists() else ""
            if isinstance(e, asyncio.CancelledError):
                raise
            raise SandboxDiedError(
                f"sandbox {sid} failed to start: {detail or type(e).__name__ + ': ' + str(e)}"
            ) from None
        return self

    async def stop(self, grace: float = 2.0) -> None:
        """Close the agent's stream (it kills its commands and exits), then make sure."""
        await self.client.close()
        if self.proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self.proc.wait()
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()
        if self.adopted:  # bwrap's child, if it outlived bwrap (killed): reaped here, never left to init
            fds, self.adopted = self.adopted, []
            await wait_adopted(fds)
        if self.group:  # and whatever else of its session came back to us (a start that failed)
            pgid, self.group = self.group, 0
            if reap_group_nowait(pgid):  # (usually none left: no thread for nothing)
                await _off_loop(lambda: reap_group(pgid))


class LocalSandbox(AgentSandbox):
    """A sandbox whose agent is a local process: it owns that process, its cgroups and its
    marker directory, and close() removes all three."""

    def __init__(self, sid: str, spec: SandboxSpec, agent: AgentProcess, sdir: Path, cg: Cgroup | None):
        super().__init__(sid, spec, agent.client)
        self.agent = agent
        self.dir = sdir
        self.cgroup = cg
        agent.client.describe_death = self._death_detail

    async def _death_detail(self) -> SandboxEnd:
        """How the sandbox's process ended (waited for a moment: the stream ends first), its
        memory cgroup's OOM kills and its log's tail: the cause of a death, carried by its
        error (:class:`~sandfleet.errors.SandboxEnd`; rollout/verdict.py reads it)."""
        proc = self.agent.proc
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.5):
                await proc.wait()
        rc = proc.returncode
        status: int | None = None
        sig: str | None = None
        if rc is not None and rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = f"signal {-rc}"
        elif rc is not None:
            status = rc
        kills, own, forks = 0, None, 0
        if self.cgroup is not None:
            events = self.cgroup.memory_events()
            kills = events.get("oom_kill", 0)
            if kills:  # v2's "oom" 0: its own limit never hit (an OOM killer outside its cgroup)
                own = not ("oom" in events and not events["oom"])
            forks = self.cgroup.pids_limit_hits()
        tail = ""
        with contextlib.suppress(OSError):
            tail = self.agent.log.read_bytes()[-LOG_TAIL:].decode(errors="replace").strip()
        return SandboxEnd(exit_status=status, signal=sig, running=rc is None, oom_kills=kills, own_limit_reached=own,
                          state_dir_gone=not self.dir.exists(), pids_limit_hits=forks, log_tail=tail)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.agent.stop()
        finally:
            if self.agent.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.agent.proc.pid, signal.SIGKILL)
            await _off_loop(self._remove)

    def _remove(self) -> None:
        """Remove the cgroups and the marker directory (blocking: rmdir, kill loops)."""
        if self.cgroup is not None:
            self.cgroup.remove()
        remove_sandbox_dir(self.dir)


_cleanup: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None


def _cleanup_threads() -> concurrent.futures.ThreadPoolExecutor:
    """This process's cleanup threads (a forked child gets its own: the parent's threads
    are not there, and an executor copied with them would never run anything)."""
    global _cleanup
    if _cleanup is None or _cleanup[0] != os.getpid():
        _cleanup = (os.getpid(), concurrent.futures.ThreadPoolExecutor(max_workers=4,
                                                                          thread_name_prefix="sandfleet-cleanup"))
    return _cleanup[1]


async def _off_loop(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a worker thread so the event loop (a service answering other requests)
    is not held while the filesystem and cgroups take their time. It runs to the end
    whatever happens: cancelled (asyncio.run cancels every task at exit, shielded ones too),
    this waits for it synchronously, as a plain call would; with no thread to be had (the
    interpreter is shutting down), it runs here."""
    try:
        fut = _cleanup_threads().submit(fn)
    except RuntimeError:
        fn()
        return
    try:
        await asyncio.shield(asyncio.wrap_future(fut))  # (shielded: a cancel must not drop it from the queue)
    except asyncio.CancelledError:
        fut.result()
        raise
