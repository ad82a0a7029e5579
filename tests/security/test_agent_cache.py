"""Finding 13/48: the guest-agent binary is built and copied safely from many threads and
processes at once (a unique temp name renamed under a lock; no ``functools.cache`` as a
once-guard). The audit saw 40 FileNotFoundError in 120 cold starts on 490e57a.

Each round empties the agent cache and the state directory's copy, then every thread of
every worker process resolves the agent at the same moment (``bwrap._agent_dir``, which
builds the binary through ``agent_binary`` and copies it for bwrap): no error, the binary
whole and runnable, no temporary file left behind.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = r"""
import json, os, subprocess, sys, threading
from pathlib import Path
from sandfleet.agent import build
from sandfleet.sandbox import bwrap

threads = int(sys.argv[1])

def check(d):
    b = Path(d) / "sandfleet-agent"
    want = build.agent_binary().stat().st_size
    data = b.read_bytes()
    if data[:4] != b"\x7fELF" or len(data) != want:
        raise AssertionError(f"{b}: incomplete binary ({len(data)} of {want} bytes)")
    if not os.access(b, os.X_OK):
        raise AssertionError(f"{b}: not executable")

for _ in sys.stdin:
    # 490e57a memoised both with functools.cache: clear it there, so each round is cold too
    for fn in (build.agent_binary, bwrap._agent_dir):
        getattr(fn, "cache_clear", lambda: None)()
    errors, dirs = [], set()
    barrier = threading.Barrier(threads)
    def one():
        try:
            barrier.wait()
            d = bwrap._agent_dir()
            dirs.add(str(d))
            check(d)
        except BaseException as e:
            errors.append(f"{type(e).__name__}: {e}")
    ts = [threading.Thread(target=one) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    runs = None
    if not errors:
        out = subprocess.run([str(Path(dirs.pop()) / "sandfleet-agent"), "--version"], capture_output=True, text=True)
        runs = out.stdout.strip()
    print(json.dumps({"errors": errors, "runs": runs}), flush=True)
"""


def _readline(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stdout is not None
    left = deadline - time.monotonic()
    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
    assert ready, "a worker did not finish its round in time (hung on the agent lock?)"
    return proc.stdout.readline()


def _leftovers(*roots: Path) -> list[str]:
    """Temporary files left in the agent directories (anything hidden but the lock)."""
    found = []
    for root in roots:
        for p in root.rglob(".*") if root.exists() else []:
            if p.name != ".lock":
                found.append(str(p))
    return found


COMPILER = r"""#!/bin/sh
# a compiler as long as a real build and as cheap as a copy: writes the agent built once to -o
out=
while [ $# -gt 0 ]; do
  if [ "$1" = -o ]; then out=$2; shift; fi
  shift
done
sleep 0.2
cp "$SANDFLEET_TEST_AGENT" "$out"
"""


def copying_compiler(tmp_path: Path) -> dict[str, str]:
    """CC for :func:`cold_starts`: what is raced is the cache (the lock, the unique temporary
    name, the rename, the copy for bwrap), not the compiler. A real build of the agent takes about
    1.5 s of CPU; fifty of them were 75 s of the slow pass (issue 43). This one holds the lock for
    0.2 s (a window thousands of times the lock's own steps) and writes the real binary, built
    once here."""
    from sandfleet.agent.build import agent_binary

    cc = tmp_path / "cc"
    cc.write_text(COMPILER)
    cc.chmod(0o755)
    return {"CC": str(cc), "SANDFLEET_TEST_AGENT": str(agent_binary())}


def cold_starts(tmp_path: Path, *, procs: int, threads: int, rounds: int, cc: dict[str, str] | None = None) -> None:
    cache, state = tmp_path / "cache", tmp_path / "state"
    env = {**os.environ, "SANDFLEET_CACHE": str(cache), "SANDFLEET_STATE": str(state), **(cc or {})}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for _ in range(procs)
    ]
    errors: list[str] = []
    try:
        for r in range(rounds):
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(state / "bin", ignore_errors=True)
            for w in workers:
                assert w.stdin is not None
                w.stdin.write("go\n")
                w.stdin.flush()
            deadline = time.monotonic() + 120
            for w in workers:
                line = _readline(w, deadline)
                if not line:
                    assert w.stderr is not None
                    pytest.fail(f"a worker died in round {r}: {w.stderr.read()[-2000:]}")
                report = json.loads(line)
                errors += [f"round {r}: {e}" for e in report["errors"]]
                if not report["errors"]:
                    assert report["runs"] and "protocol" in report["runs"], f"round {r}: the binary does not run"
            left = _leftovers(cache / "agent", state / "bin")
            assert not left, f"round {r}: temporary files left behind: {left}"
    finally:
        for w in workers:
            if w.stdin:
                w.stdin.close()
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
            for f in (w.stdout, w.stderr):
                if f:
                    f.close()
    total = procs * threads * rounds
    assert not errors, f"{len(errors)} of {total} cold starts failed, e.g. {errors[:3]}"


def test_cold_start_agent_race_quick(tmp_path: Path) -> None:
    """2 processes x 8 threads x 3 rounds, from an empty cache each round."""
    cold_starts(tmp_path, procs=2, threads=8, rounds=3)


@pytest.mark.slow
def test_cold_start_agent_race_8x4x50(tmp_path: Path) -> None:
    """The issue's figure: 8 threads x 4 processes x 50 cold starts, 0 errors (each round's build
    by :func:`copying_compiler`; the quick test above builds with the real one)."""
    cold_starts(tmp_path, procs=4, threads=8, rounds=50, cc=copying_compiler(tmp_path))
