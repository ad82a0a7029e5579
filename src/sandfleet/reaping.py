"""Every process sandfleet starts is reaped by sandfleet, also as PID 1 of a pid namespace.

The mechanisms (docs/service.md, "In a container: sandfleet as PID 1"):

- The CLI is a *child subreaper*: a process a sandbox leaves behind when its parent dies
  comes back to sandfleet, not to the machine's init. The one such process a sandbox has
  is bwrap's own child, the guest agent (the init of the sandbox's pid namespace, bwrap
  ``--as-pid-1``): bwrap reaps it when it ends first, but where bwrap itself is killed the
  agent outlives it for a moment (it ends the sandbox on seeing bwrap gone).
  :func:`adopt_children` pins it at start (a pidfd: the identity holds even if the pid is
  reused) and :func:`reap_adopted` waits for it at close, by that pidfd only;
  :func:`reap_group` reaps what else of the session bwrap leads comes back (a start that
  failed). Never ``waitpid(-1)``, which would take the exit status of a child that asyncio
  or ``subprocess`` is waiting for. A library user's process is left as it is: as a
  subreaper it would also adopt the orphans of everything else it runs, which sandfleet
  can't tell from its own children; it may call :func:`become_subreaper` itself.
- As PID 1 (a container's command, ``unshare --pid --fork``), sandfleet forks at once:
  PID 1 stays a small init that forwards the termination signals to the real process and
  reaps every process that ends up as its child (anything orphaned in the namespace, as
  tini does), and exits with the real process's status. PID 1 gets no default signal
  action, so the worker (PID 2) keeps the ordinary SIGTERM/SIGINT handling of serve/run.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time
from pathlib import Path

from sandfleet.settings import current as current_settings

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGWINCH)


def _prctl(option: int, arg: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Orphaned descendants come back to this process (True if the kernel agreed)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def adopt_children(pid: int) -> list[int]:
    """pidfds of ``pid``'s children now (its own children may outlive it: bwrap's). Empty
    where the kernel does not list children or pidfds are missing."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []
    fds = []
    for k in kids:
        with contextlib.suppress(OSError, AttributeError):
            fds.append(os.pidfd_open(k))
    return fds


def reap_adopted(pidfds: list[int], timeout: float = 2.0) -> None:
    """Wait (up to ``timeout`` in all) for each pinned process to exit and reap it if it is
    our child by now (it is where this process is a subreaper or PID 1; else init reaps
    it). Closes the pidfds. Blocking: call it off the event loop, after the parent died."""
    end = time.monotonic() + timeout
    for fd in pidfds:
        try:
            _exited(fd, max(0.0, end - time.monotonic()))
        finally:
            _reap_pidfd(fd)


def _exited(pidfd: int, timeout: float = 0.0) -> bool:
    """Whether the pinned process has exited, waiting up to ``timeout`` for it (poll, not
    select(): a busy owner's pidfds are past FD_SETSIZE, 1024)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    with contextlib.suppress(InterruptedError):
        return bool(poller.poll(timeout * 1000))
    return False


def _reap_pidfd(pidfd: int) -> None:
    """Reap the pinned process if it has exited and is our child; close its pidfd."""
    try:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    finally:
        os.close(pidfd)


async def wait_adopted(pidfds: list[int], timeout: float = 2.0) -> None:
    """:func:`reap_adopted` on the running event loop, with no thread: a pinned process that
    has not exited yet is waited for by its pidfd becoming readable (epoll, so no
    FD_SETSIZE limit), then reaped if it is our child. Closes the pidfds. (In a worker thread,
    as :func:`reap_adopted`, every close paid a wake-up of a worker and then of the loop.)
    Cancelled, it finishes the rest blocking, as the worker thread did: every pidfd is closed
    and every pinned child reaped either way."""
    import asyncio

    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    left = list(pidfds)
    try:
        while left:
            fd = left[0]
            if not _exited(fd):  # still running
                done: asyncio.Future[None] = loop.create_future()

                def ready(f: asyncio.Future[None] = done) -> None:
                    if not f.done():
                        f.set_result(None)

                loop.add_reader(fd, ready)
                try:
                    async with asyncio.timeout(max(0.0, end - loop.time())):
                        await done
                except TimeoutError:
                    pass
                finally:
                    loop.remove_reader(fd)
            _reap_pidfd(left.pop(0))
    except BaseException:
        reap_adopted(left, max(0.0, end - loop.time()))
        raise


def reap_group_nowait(pgid: int) -> bool:
    """Reap the members of process group ``pgid`` that came back to us and have exited;
    True while one of them (a child of ours) still runs (then :func:`reap_group` waits)."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return False
        except InterruptedError:
            continue
        if pid == 0:
            return True


def proc_start_time(pid: int) -> int | None:
    """Kernel start time of a process (to tell a live owner from a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def reap_pid(pid: int, start: int | None, *, exited_is_enough: bool = False) -> bool:
    """True once the process ``pid`` that started at ``start`` is gone: reaped here if it
    is our child (a daemon a sandbox started, such as pasta, comes back to a subreaper), or
    no longer there (another process by now); with ``exited_is_enough``, also once it has
    exited while another parent has yet to reap it. False while it runs."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return True
    try:
        if start is None or proc_start_time(pid) != start:
            return True  # another process by now: not ours to touch
        try:
            return os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG) is not None
        except ChildProcessError:  # not our child: exited once its pidfd reads ready
            return exited_is_enough and bool(select.select([fd], [], [], 0)[0])
    finally:
        os.close(fd)


def reap_pids(pids: dict[int, int | None], timeout: float = 1.0) -> None:
    """Wait up to ``timeout`` for killed processes (pid -> start time) to exit, reaping
    those that are our children (a subreaper's zombies are never reaped by anyone else)."""
    end = time.monotonic() + timeout
    left = dict(pids)
    while left:
        left = {p: st for p, st in left.items() if not reap_pid(p, st, exited_is_enough=True)}
        if not left or time.monotonic() > end:
            return
        time.sleep(0.01)


def reap_group(pgid: int, timeout: float = 2.0) -> None:
    """Reap what is left of the process group ``pgid`` that comes back to us (bwrap's own
    child, when the bwrap we started as the leader of a session of its own has exited
    first). Only that group: a child of ours elsewhere is never touched. Call it once the
    leader itself is reaped. Waits up to ``timeout`` for members still running; returns
    at once where none is ours (not a subreaper)."""
    end = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:  # members still running
            if time.monotonic() > end:
                return
            time.sleep(0.01)


def run_as_init() -> None:
    """As PID 1: fork; this process becomes the namespace's init (reap all, forward
    signals, exit with the worker's status) and never returns; the worker returns and
    goes on as sandfleet. Elsewhere: returns at once. ``SANDFLEET_NO_INIT=1`` turns it off."""
    if os.getpid() != 1 or current_settings().no_init:
        return
    tty = sys.stdin.isatty()
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)  # a group of its own: a terminal's ^C reaches it once, through init
        if tty:
            with contextlib.suppress(OSError):
                old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                os.tcsetpgrp(0, os.getpgrp())
                signal.signal(signal.SIGTTOU, old)
        return
    _init_loop(child)


def _init_loop(child: int) -> None:
    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for s in FORWARDED:
        signal.signal(s, forward)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # (cannot happen before the worker is reaped)
            os._exit(0)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            # anything left in the namespace is killed by the kernel when PID 1 exits
            os._exit(code if code >= 0 else 128 - code)
