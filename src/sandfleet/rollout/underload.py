"""``sandfleet tasks validate --under-load``: does a task's oracle still score 1 on a busy host?

A task whose tests hold a wall-clock budget (a performance test timed with ``perf_counter``,
a tight timeout) passes on a quiet machine and scores 0 on a loaded one: a false zero in
training, where the host is never quiet. After the ordinary validation, each task's oracle
runs again beside CPU load -- busy processes, by default two per CPU of the host, started
here and always killed here (each also stops by itself within a fraction of a second once its
parent is gone) -- and a task whose oracle passed on the quiet host and fails under load is
``load_sensitive``. The test that flipped is named when the output shows it (pytest's
``FAILED path::test`` lines; otherwise the rollout's reason, e.g. a verifier timeout).

The images are built before the load starts (the ordinary validation builds them), so only
the rollouts run beside it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import PurePosixPath

from sandfleet.rollout.result import RolloutResult

# A busy loop in plain Python that stops once its parent is gone (checked every ~50 ms of
# spinning), so a validate killed with SIGKILL leaves no load behind for long.
_SPIN = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(200000):
        pass
"""

_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+)", re.MULTILINE)


def default_load_procs() -> int:
    """Two busy processes per CPU of this host: every rollout then gets well under a CPU."""
    return 2 * (os.cpu_count() or 1)


@contextmanager
def cpu_load(procs: int) -> Iterator[list[int]]:
    """``procs`` busy processes for the length of the block (their pids); killed at its end,
    whatever ends it."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(procs):
            # a session of its own each: under the kernel's autogroup scheduling, processes of
            # one session share one CPU weight, and N spinners would weigh as one
            started.append(subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            start_new_session=True))
        yield [p.pid for p in started]
    finally:
        for p in started:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in started:
            p.wait()


def failed_tests(output: str) -> list[str]:
    """The tests pytest's short summary names as failed (``FAILED /tests/t.py::test_x - ...``),
    as ``t.py::test_x``, in order, each once."""
    seen: dict[str, None] = {}
    for match in _FAILED.finditer(output):
        path, _, name = match.group(1).partition("::")
        seen[f"{PurePosixPath(path).name}::{name}"] = None
    return list(seen)


def flipped(quiet: Sequence[RolloutResult], loaded: Sequence[RolloutResult]) -> tuple[bool, list[str]]:
    """Whether the oracle's reward flipped under load (it passed on the quiet host and failed
    beside the load), and what failed: the tests pytest names, else the rollouts' reasons."""
    if not any(r.passed for r in quiet):
        return False, []  # never passed: invalid, not load-sensitive
    bad = [r for r in loaded if not r.passed]
    if not bad:
        return False, []
    what: dict[str, None] = {}
    for r in bad:
        names = failed_tests(r.verifier_output or "")
        if names:
            what.update(dict.fromkeys(names))
        else:
            why = r.reason or (f"scored {r.reward}" if r.status == "completed" else r.status)
            what[why] = None
    return True, list(what)
