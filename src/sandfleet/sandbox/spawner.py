"""Start a sandbox's processes from a small helper process (issue 46: creation as a host fills).

A process that holds thousands of sandboxes holds about 8 descriptors for each, and every
``fork`` it makes copies that table while its child closes all of them again (``close_fds``):
measured at 3,000 held, that was the largest of what grows per start (docs/bench.md, "Creation
as a host fills"). The spawner (``sandfleet-agent spawner``, agent/spawner.c) is started once
per owner process, holds nothing but its socket, and starts each process for it: the
descriptors the new process needs travel with the request (``SCM_RIGHTS``), each with the number
it must have there. The process is cloned with ``CLONE_PARENT``, so it is the owner's child as a
``subprocess.Popen`` would make it: the owner waits for it, and its pidfd, ``--pdeathsig`` and
``--die-with-parent`` name the owner.

What a ``Popen`` would give the child that this does not: the owner's umask and cgroup as they
are now, not as they were when the spawner started (the owner sets neither after it starts
sandboxes; ``bench/throttle.py`` moves the process and calls :func:`reset`). The owner's resource
limits it does take, as they are now. Where the spawner can't be had (no agent binary, a request
too big for one message, a clone the host refuses), :func:`spawn` answers None and the caller
uses ``Popen``.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

SETSID = 1
MAX_MSG = 1 << 20
"""The most a request may take (argv, environment and folder): agent/spawner.c's buffer."""
MAX_FDS = 64


class Spawned:
    """A process the spawner started, as much of ``subprocess.Popen`` as sandfleet uses of it
    (pid, returncode, poll, wait, kill): the caller's child, reaped by its ``wait``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere (Popen's answer, too)
                self.returncode = 0
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self) -> int:
        rc = self._reap(0)  # (a blocking waitpid: it returns once the child has ended)
        assert rc is not None
        return rc

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Spawner:
    """One running ``sandfleet-agent spawner`` and its socket (this process's, see :func:`_get`)."""

    def __init__(self) -> None:
        from sandfleet.agent.build import agent_binary

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([str(agent_binary()), "spawner"], stdin=theirs.fileno(),
                                         stdout=subprocess.DEVNULL, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                                         cwd="/")
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.owner = os.getpid()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()  # its EOF: it exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        if self.proc.returncode is None:
            self.proc.kill()
            self.proc.wait()


_lock = threading.Lock()
_spawner: _Spawner | None = None
_broken = False  # no spawner can be started here: Popen from now on


def _get() -> _Spawner | None:
    """This process's spawner, started on first use (a forked child starts its own: its copy of
    the parent's socket is closed, so the parent's spawner still ends with the parent)."""
    global _spawner, _broken
    if _spawner is not None and _spawner.owner != os.getpid():
        with contextlib.suppress(OSError):
            _spawner.sock.close()
        _spawner = None
    if _spawner is None and not _broken:
        try:
            _spawner = _Spawner()
        except Exception:
            _broken = True
    return _spawner


def disable() -> None:
    """Start this process's sandboxes with ``Popen`` from now on: for a process that holds one
    (``sandbox create``'s holder), whose descriptor table stays small, where a spawner would only
    be one more process per sandbox."""
    global _broken
    _broken = True
    reset()


def reset() -> None:
    """Stop this process's spawner; the next :func:`spawn` starts another. For a caller that
    moved itself to another cgroup (its sandboxes' processes start in the spawner's)."""
    global _spawner
    with _lock:
        sp, _spawner = _spawner, None
        if sp is not None and sp.owner == os.getpid():
            sp.close()


atexit.register(reset)  # (its socket's EOF would end it anyway: this waits for it)


def spawn(argv: Sequence[str], *, stdin: int, stdout: int, stderr: int, cwd: str | None,
          env: Mapping[str, str], new_session: bool, pass_fds: Sequence[int] = ()) -> Spawned | None:
    """Start ``argv`` (an absolute path) as this process's child with ``stdin``, ``stdout`` and
    ``stderr`` as its 0, 1 and 2 and ``pass_fds`` under their own numbers; None where the spawner
    can't do it (the caller falls back to ``Popen``). An exec that fails raises its OSError, as
    ``Popen`` does."""
    if not argv or not argv[0].startswith("/") or len(pass_fds) + 3 > MAX_FDS:
        return None
    fds = [stdin, stdout, stderr, *pass_fds]
    targets = [0, 1, 2, *pass_fds]
    if cwd is None:
        try:
            cwd = str(Path.cwd())  # Popen's child starts in ours
        except OSError:
            return None  # (ours was removed: Popen's child starts in it all the same)
    strings = [os.fsencode(s) for s in (cwd, *argv, *(f"{k}={v}" for k, v in env.items()))]
    if any(b"\0" in s for s in strings):
        return None
    head = struct.pack(f"=4I{len(fds)}I", SETSID if new_session else 0, len(fds), len(argv), len(env), *targets)
    msg = head + b"".join(s + b"\0" for s in strings)
    if len(msg) >= MAX_MSG:
        return None
    global _spawner
    with _lock:
        for _ in range(2):  # a spawner that died (killed): one more, where the request never reached it
            sp = _get()
            if sp is None:
                return None
            try:
                socket.send_fds(sp.sock, [msg], fds)
            except OSError:
                _spawner = None
                sp.close()
                continue
            reply = b""
            with contextlib.suppress(OSError):
                reply = sp.sock.recv(8)
            if len(reply) != 8:  # it ended with our request: what it may have started is not known
                _spawner = None
                sp.close()
                raise ConnectionError(f"the process spawner ended before it started {argv[0]}")
            pid, err = struct.unpack("=ii", reply)
            break
        else:
            return None
    if pid <= 0:
        if err in (errno.EINVAL, errno.EPERM, errno.ENOSYS):  # a clone this host refuses us (a filter)
            disable()
            return None
        raise OSError(err, os.strerror(err))
    if err:
        Spawned(pid).wait()  # it exited 127 after the failed exec: ours to reap
        raise OSError(err, os.strerror(err), argv[0])
    return Spawned(pid)
