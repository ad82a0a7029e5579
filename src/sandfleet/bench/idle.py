"""Holding many idle sandboxes at once within the host's limits (``sandfleet bench micro --idle``).

An idle bwrap sandbox costs its owner about 8 file descriptors and the host about 4 tasks
(:mod:`sandfleet.sandbox.hostlimits` says which). One process under the open-file limit of 20,000 therefore holds
about 2,400; 10,000 take several processes, and about 40,000 tasks, past the default
``kernel.pid_max`` of 32,768.

So the hold spreads over processes: this one holds what its open-file limit allows, and
helper processes (``python -m sandfleet.bench.idle``, each a subreaper like the CLI) hold the
rest, each filling itself to its own limit, one after another. Before every batch of
:data:`BATCH` the holder checks what the batches so far cost against what is left: its
open descriptors (full: a new helper takes over), the host's tasks against
``kernel.pid_max`` and ``kernel.threads-max``, and ``MemAvailable`` against a reserve. A host
limit that the next batch would cross stops the hold with one line that names the limit and
what to do (``Hold.stopped``), never a traceback; so does a creation that fails
anyway (``EMFILE``, ``EAGAIN`` from fork, a full uid range).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandfleet.bench.procfs import meminfo, raise_nofile, sandbox_pss_kib
from sandfleet.errors import SandfleetError
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox, create_many
from sandfleet.sandbox.hostlimits import (
    FD_RESERVE,
    FDS_PER_IDLE,
    TASK_RESERVE,
    TASKS_PER_IDLE,
    host_tasks,
    nofile_soft,
    open_fds,
    raise_to,
    task_limit,
)
from sandfleet.sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)

BATCH = 32
"""Sandboxes created concurrently, and the step at which the limits are checked."""
MEM_RESERVE_FRACTION = 0.10
"""Share of MemTotal (at least :data:`MEM_RESERVE_MIB_MIN`) left available to the host. (5 %
was too little: at 1.4 GiB available of 24 GiB a hold of 9,950 had the host in reclaim, kswapd
busy, creation at a crawl, and the global OOM killer took the holder.)"""
MEM_RESERVE_MIB_MIN = 1024
Say = Callable[[str], None]


def mem_reserve_kib() -> int:
    total = meminfo().get("MemTotal", 0)
    return max(MEM_RESERVE_MIB_MIN * 1024, int(total * MEM_RESERVE_FRACTION))


@dataclass
class Fill:
    """What one process holds: its sandboxes, and why it stopped short of what it was asked."""

    boxes: list[Sandbox] = field(default_factory=list)
    full: bool = False
    """Stopped at this process's open-file limit: another process may go on."""
    stopped: str | None = None
    """Stopped at a host limit (or a creation failed): the one line that says which and what to do."""
    batches: list[tuple[int, float]] = field(default_factory=list)
    """Each batch created, in order: (sandboxes, seconds its creation took; the limit checks between
    batches not counted)."""


async def fill(spec: SandboxSpec, want: int, say: Say | None = None) -> Fill:
    """Create up to ``want`` idle sandboxes in this process, batch by batch, stopping before a
    batch would cross this process's open-file limit (``full``) or a host limit (``stopped``)."""
    raise_nofile()
    out = Fill()
    fd0, task0, mem0 = open_fds(), host_tasks(), meminfo()["MemAvailable"]
    soft = nofile_soft()
    cap, cap_name = task_limit()
    reserve = mem_reserve_kib()
    last: tuple[int, int] | None = None  # (MemAvailable before the last batch, its size)
    while len(out.boxes) < want:
        k = min(BATCH, want - len(out.boxes))
        n = len(out.boxes)
        fds, tasks, avail = open_fds(), host_tasks(), meminfo()["MemAvailable"]
        # per sandbox, from what this process's batches cost so far (a first guess before any);
        # memory also from the last batch alone, whichever is more: a sandbox's kernel memory
        # grows with the number held (a memory cgroup's shrinker slots, one per superblock on
        # the host), so the mean so far is short of what the next one costs
        per_fd = (fds - fd0) / n if n else float(FDS_PER_IDLE)
        per_task = max(0.0, (tasks - task0) / n) if n else float(TASKS_PER_IDLE)
        per_kib = max(0.0, (mem0 - avail) / n) if n else 1536.0
        if last is not None:
            per_kib = max(per_kib, (last[0] - avail) / last[1])
        if fds + k * per_fd > soft - FD_RESERVE:
            out.full = True
            if n == 0:
                out.stopped = (f"the open-file limit ({soft}) leaves no room for {k} sandboxes at about "
                               f"{per_fd:.0f} descriptors each: raise it (ulimit -n, LimitNOFILE=)")
            break
        if tasks + k * per_task > cap - TASK_RESERVE:
            out.stopped = (f"{cap_name} is {cap} and the host has {tasks} tasks; each idle sandbox takes about "
                           f"{per_task:.1f}: raise it (sysctl -w {cap_name}={raise_to(cap)}) or hold fewer")
            break
        if avail - k * per_kib < reserve:
            out.stopped = (f"MemAvailable is {avail // 1024} MiB and each idle sandbox takes about "
                           f"{per_kib / 1024:.2f} MiB, with {reserve // 1024} MiB kept for the host: hold fewer, "
                           f"or give the host more memory" + _disk_hint())
            break
        last = (avail, k)
        try:
            t = time.perf_counter()
            made = await create_many([lambda: create_sandbox(spec)] * k)
            out.batches.append((len(made), time.perf_counter() - t))
            out.boxes += made
        except OSError as e:
            if e.errno == errno.EMFILE and out.boxes:  # the estimate was short: full all the same
                out.full = True
            else:
                out.stopped = _failed(e, len(out.boxes))
            break
        except SandfleetError as e:
            out.stopped = _failed(e, len(out.boxes))
            break
        if say and (len(out.boxes) // BATCH) % 32 == 0:
            say(f"{len(out.boxes)} idle sandboxes in process {os.getpid()}")
    return out


def _disk_hint() -> str:
    """Where idle sandboxes have an ext4 disk each: what a tmpfs writable layer saves."""
    from sandfleet.sandbox import disk

    if not disk.available():
        return ""
    return ("; each has an ext4 disk (a loop device and a filesystem): SANDFLEET_DISK=tmpfs holds more "
            "(10,000 in 24 GiB here, docs/bench.md)")


def _failed(e: BaseException, held: int) -> str:
    """One line for a creation that failed (the first failure of its batch)."""
    text = " ".join(str(e).split())[:400]
    hint = ""
    if isinstance(e, OSError) and e.errno == errno.EMFILE:
        hint = ": the open-file limit (ulimit -n)"
    elif isinstance(e, OSError) and e.errno == errno.EAGAIN:
        hint = ": the host's task limit (sysctl kernel.pid_max, kernel.threads-max) or a pids cgroup around this"
    return f"a sandbox creation failed after {held} in this process{hint}: {type(e).__name__}: {text}"


async def close_all(boxes: list[Sandbox]) -> int:
    """Close every sandbox (64 at a time); one failed close never stops the others. Each
    failure is logged with the sandbox id; returns how many failed."""
    failed = 0
    for i in range(0, len(boxes), 64):
        batch = boxes[i:i + 64]
        results = await asyncio.shield(asyncio.gather(*(b.close() for b in batch), return_exceptions=True))
        for b, r in zip(batch, results, strict=True):
            if isinstance(r, BaseException):
                failed += 1
                log.error("closing sandbox %s failed: %s: %s", b.id, type(r).__name__, r)
    return failed


@dataclass
class Helper:
    """A helper process holding part of the sandboxes (``python -m sandfleet.bench.idle``)."""

    proc: asyncio.subprocess.Process
    created: int
    pss_kib_total: float
    full: bool
    stopped: str | None
    batches: list[tuple[int, float]] = field(default_factory=list)

    @classmethod
    async def start(cls, spec: SandboxSpec, want: int) -> Helper:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sandfleet.bench.idle",
            json.dumps({"want": want, "spec": spec.model_dump(mode="json")}),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        line = await proc.stdout.readline()
        try:
            r = json.loads(line)
        except ValueError:
            await _finish(proc)
            return cls(proc, 0, 0.0, False, f"a helper process holding idle sandboxes failed "
                       f"(exit status {proc.returncode}); its error is above")
        return cls(proc, int(r["created"]), float(r["pss_kib_total"]), bool(r["full"]), r.get("stopped"),
                   [(int(k), float(s)) for k, s in r.get("batches", [])])

    async def close(self) -> int:
        """Close its sandboxes (its stdin's end tells it); how many failed to close."""
        failed = 0
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        line = await self.proc.stdout.readline()
        with contextlib.suppress(ValueError, KeyError, TypeError):
            failed = int(json.loads(line)["failed"])
        await _finish(self.proc)
        return failed if self.proc.returncode == 0 else max(failed, 1)


async def _finish(proc: asyncio.subprocess.Process, timeout: float = 900.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


@dataclass
class Hold:
    """Idle sandboxes held at once over this process and its helpers."""

    own: list[Sandbox]
    helpers: list[Helper]
    stopped: str | None
    batches: list[tuple[int, float]] = field(default_factory=list)
    """This process's batches, then each helper's (the order they were made in)."""

    @property
    def created(self) -> int:
        return len(self.own) + sum(h.created for h in self.helpers)

    def pss_kib(self) -> float:
        """Mean PSS of one idle sandbox's processes, over all of them."""
        total = sandbox_pss_kib(self.own) * len(self.own) + sum(h.pss_kib_total for h in self.helpers)
        return total / self.created if self.created else 0.0

    async def close(self) -> int:
        """Close everything held (helpers at the same time as this process's own); how many failed."""
        results = await asyncio.gather(close_all(self.own), *(h.close() for h in self.helpers))
        self.own, self.helpers = [], []
        return sum(results)


async def hold(spec: SandboxSpec, want: int, say: Say | None = None) -> Hold:
    """Hold ``want`` idle sandboxes: as many as this process can, helpers for the rest."""
    mine = await fill(spec, want, say)
    h = Hold(mine.boxes, [], mine.stopped, list(mine.batches))
    try:
        full = mine.full and not mine.stopped
        while full and h.created < want:
            if say:
                say(f"this process is at its open-file limit with {h.created}: a helper process holds more")
            helper = await Helper.start(spec, want - h.created)
            h.helpers.append(helper)
            h.batches += helper.batches
            h.stopped, full = helper.stopped, helper.full and not helper.stopped
            if helper.created == 0 and not h.stopped:
                h.stopped = "a helper process could hold no sandbox at all (its open-file limit?)"
    except BaseException:
        await h.close()
        raise
    return h


WINDOW = 1000
"""The creations whose rate ``create_rates`` reports at each end of a hold."""


def create_rates(batches: list[tuple[int, float]], window: int = WINDOW) -> tuple[float, float, int] | None:
    """Sandboxes created per second over the first and the last ``window`` of a hold (whole
    batches: at least ``window`` each), and the window used: ``window``, or half of what was
    created where that is less (then the two ends don't overlap). None: nothing created."""
    total = sum(k for k, _ in batches)
    if not total:
        return None
    w = min(window, max(total // 2, 1))

    def rate(seq: list[tuple[int, float]]) -> float:
        n, s = 0, 0.0
        for k, sec in seq:
            if n >= w:
                break
            n, s = n + k, s + sec
        return n / s if s > 0 else 0.0

    return rate(batches), rate(batches[::-1]), w


def _say_json(obj: dict[str, Any]) -> bool:
    """One line to the holder, on this helper's stdout; False when the holder is gone (its
    end of the pipe closed: the helper then closes what it holds, and says nothing)."""
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # (the interpreter's own flush at exit would raise again: point stdout nowhere)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
        return False
    return True


async def _helper_main(want: int, spec: SandboxSpec) -> int:
    """A helper: hold up to ``want``, say how many on stdout (one JSON line), hold them until
    stdin ends (the holder closed it, or died), close them, say how many failed."""
    mine = await fill(spec, want)
    failed = 0
    try:
        if _say_json({"created": len(mine.boxes), "pss_kib_total": sandbox_pss_kib(mine.boxes) * len(mine.boxes),
                      "full": mine.full, "stopped": mine.stopped, "batches": mine.batches}):
            await asyncio.to_thread(sys.stdin.buffer.read)
    finally:
        failed = await close_all(mine.boxes)
    _say_json({"failed": failed})
    return 0 if not failed else 1


def main(argv: list[str]) -> int:
    from sandfleet.reaping import become_subreaper

    become_subreaper()  # bwrap's child comes back here, as it does to the CLI
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args: dict[str, Any] = json.loads(argv[0])
    return asyncio.run(_helper_main(int(args["want"]), SandboxSpec.model_validate(args["spec"])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
