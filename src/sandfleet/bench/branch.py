"""``sandfleet bench micro --branch``: what a branch costs, measured side by side in one run.

Figures (keys of the JSON; medians by :func:`sandfleet.stats.percentile`):
- ``create_exec_close_p50_ms``: a fresh sandbox, ``true`` in it, closed (the yardstick);
- ``branch_p50_ms``: ``{"1MiB": {"1": ms, "8": ms, "32": ms}, "512MiB": {...}}``: ``branch(n)``
  of a sandbox that wrote that much (one file, by ``dd``), from the call to the last child
  ready; each sample a fresh source (its layer flushed first: the write's own writeback is not
  the branch's), the children closed after; ``n`` rounds, each one sample of every figure, so
  that a change of the host's load during the run falls on all of them alike;
- ``exec_rtt_p50_ms`` / ``exec_rtt_during_branch_p50_ms`` (and ``_max_ms``): the source's
  ``true`` round trip alone, and while ``branch(8)`` runs (alternately, round by round), one
  call after another; ``source_pause_p50_ms``: the first of those, 5 ms into the branch (the wait
  for the source's move, which the median counts once however long it is);
- microvm (``--backend microvm``): ``microvm_branch4_ms`` (a running VM to 4 children, with
  memory) against ``microvm_restore_ms`` (one sandbox restored from its template), and where a
  branch's time goes: ``microvm_snapshot_ms`` (the snapshot alone) and ``microvm_restore4_ms``
  (4 sandboxes restored at once from their template: the children's part), few samples
  (QEMU under TCG here: seconds each).
The targets (docs/branching.md): branch to 8 within 3x create→exec→close; 512 MiB within 1.3x
of 1 MiB; the exec round trip within 2x during a branch; microvm branch-4 within 2x one restore.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from sandfleet.bench.micro import create_exec_close_ms
from sandfleet.provenance import provenance
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox
from sandfleet.sandbox.spec import Limits, SandboxSpec
from sandfleet.stats import percentile

Progress = Callable[[str], None]
SIZES_MIB = (1, 512)
WIDTHS = (1, 8, 32)


async def _written(spec: SandboxSpec, mib: int) -> Sandbox:
    sb = await create_sandbox(spec)
    res = await sb.exec(["dd", "if=/dev/zero", "of=/home/agent/written", "bs=1M", f"count={mib}", "status=none"],
                        timeout=300)
    if res.exit_code == 0:
        res = await sb.exec(["sync", "-f", "/home/agent/written"], timeout=300)
    if res.exit_code != 0:
        await sb.close()
        raise RuntimeError(f"writing {mib} MiB failed: {res.output.strip()}")
    return sb


async def branch_ms(spec: SandboxSpec, mib: int, width: int, samples: int) -> list[float]:
    """Milliseconds of ``branch(width)`` of a fresh sandbox that wrote ``mib`` MiB, per sample."""
    ts = []
    for _ in range(samples):
        src = await _written(spec, mib)
        try:
            t = time.perf_counter()
            kids = await src.branch(width)
            ts.append((time.perf_counter() - t) * 1e3)
            await asyncio.gather(*(k.close() for k in kids))
        finally:
            await src.close()
    return ts


async def rtt_during_branch(spec: SandboxSpec, rounds: int, width: int = 8
                            ) -> tuple[list[float], list[float], int, list[float]]:
    """The source's ``true`` round trips alone and during ``branch(width)``, alternately: each
    round 10 alone, then as many as fit in one branch one after another. The first, 5 ms into
    the branch, waits for the source's move: its pause (the median of the others counts that wait
    once however long it is). Returns (alone, during, branches, pauses)."""
    src = await create_sandbox(spec)
    alone: list[float] = []
    during: list[float] = []
    pauses: list[float] = []

    async def once() -> float:
        t = time.perf_counter()
        await src.exec(["true"])
        return (time.perf_counter() - t) * 1e3

    try:
        for _ in range(rounds):
            alone += [await once() for _ in range(10)]
            task = asyncio.ensure_future(src.branch(width))
            await asyncio.sleep(0.005)  # into the branch
            first = len(during)
            while not task.done():
                during.append(await once())
            if len(during) > first:
                pauses.append(during[first])
            kids = await task
            await asyncio.gather(*(k.close() for k in kids))
        return alone, during, rounds, pauses
    finally:
        await src.close()


async def run_branch(backend: str = "auto", *, n: int = 5, progress: Progress | None = None) -> dict[str, Any]:
    say = progress or (lambda _m: None)
    if backend == "microvm":
        return await run_microvm(n=min(n, 3), progress=say)
    spec = SandboxSpec(backend=backend, limits=Limits(disk_mib=1024))
    out: dict[str, Any] = {"backend": backend, "n": n,
                           "provenance": provenance({"bench": "micro --branch", "backend": backend, "n": n})}
    warm = await create_sandbox(spec)
    out["backend"] = warm.backend
    await warm.close()
    # rounds, each one sample of everything (create->exec->close, then each width over each size):
    # a host whose load changes during the run changes every figure alike
    cec: list[float] = []
    samples: dict[tuple[int, int], list[float]] = {(mib, w): [] for mib in SIZES_MIB for w in WIDTHS}
    for r in range(n):
        say(f"round {r + 1}/{n}: create+exec+close x2, branch(1, 8, 32) of a 1 MiB and a 512 MiB layer")
        cec += await create_exec_close_ms(spec, 2)
        for width in WIDTHS:
            for mib in SIZES_MIB:
                samples[(mib, width)] += await branch_ms(spec, mib, width, 1)
    out["create_exec_close_p50_ms"] = round(percentile(cec, 50), 2)
    table: dict[str, dict[str, float]] = {}
    for (mib, width), ts in samples.items():
        table.setdefault(f"{mib}MiB", {})[str(width)] = round(percentile(ts, 50), 2)
    out["branch_p50_ms"] = table
    say("the source's exec round trip, alone and during branches")
    alone, during, branches, pauses = await rtt_during_branch(spec, max(n * 2, 10))
    out["exec_rtt_p50_ms"] = round(percentile(alone, 50), 3)
    out["exec_rtt_during_branch_p50_ms"] = round(percentile(during, 50), 3)
    out["exec_rtt_during_branch_max_ms"] = round(max(during), 2)
    out["branches_during_rtt"] = branches
    out["source_pause_p50_ms"] = round(percentile(pauses, 50), 2)
    b8 = table["1MiB"]["8"]
    out["ratio_branch8_to_create_exec_close"] = round(b8 / out["create_exec_close_p50_ms"], 2)
    out["ratio_512MiB_to_1MiB_branch8"] = round(table["512MiB"]["8"] / b8, 2)
    out["ratio_exec_rtt_during_branch"] = round(out["exec_rtt_during_branch_p50_ms"] / out["exec_rtt_p50_ms"], 2)
    out["targets"] = {"branch8_within_3x_create": out["ratio_branch8_to_create_exec_close"] <= 3,
                      "512MiB_within_1.3x_1MiB": out["ratio_512MiB_to_1MiB_branch8"] <= 1.3,
                      "exec_rtt_within_2x_during_branch": out["ratio_exec_rtt_during_branch"] <= 2}
    return out


async def run_microvm(*, n: int = 2, progress: Progress | None = None) -> dict[str, Any]:
    """microvm: a running VM branched to 4 (memory carried) against one restore, ``n`` samples each."""
    say = progress or (lambda _m: None)
    spec = SandboxSpec(backend="microvm", image="debian-bookworm-amd64")
    out: dict[str, Any] = {"backend": "microvm", "n": n,
                           "provenance": provenance({"bench": "micro --branch", "backend": "microvm", "n": n})}
    warm = await create_sandbox(spec)  # builds the template
    await warm.close()
    restores, branches, fours, snapshots = [], [], [], []
    for i in range(n):
        say(f"microvm restore, branch to 4 ({i + 1}/{n})")
        t = time.perf_counter()
        src = await create_sandbox(spec)
        restores.append((time.perf_counter() - t) * 1e3)
        try:
            await src.exec("sleep 600 >/dev/null 2>&1 &")  # a process the children carry
            t = time.perf_counter()
            kids = await src.branch(4)
            branches.append((time.perf_counter() - t) * 1e3)
            await asyncio.gather(*(k.close() for k in kids))
            # where a branch's time goes: the snapshot alone (the running VM saved and made a template),
            t = time.perf_counter()
            snap = await src.snapshot()
            snapshots.append((time.perf_counter() - t) * 1e3)
            snap.delete()
        finally:
            await src.close()
        # and 4 fresh sandboxes restored at once from their template: what any branch to 4 pays
        # for its children, whatever the snapshot costs (on a host of fewer cores than 4, more
        # than one restore)
        t = time.perf_counter()
        four = await asyncio.gather(*(create_sandbox(spec) for _ in range(4)))
        fours.append((time.perf_counter() - t) * 1e3)
        await asyncio.gather(*(b.close() for b in four))
    out["microvm_restore_ms"] = round(percentile(restores, 50), 1)
    out["microvm_branch4_ms"] = round(percentile(branches, 50), 1)
    out["microvm_snapshot_ms"] = round(percentile(snapshots, 50), 1)
    out["microvm_restore4_ms"] = round(percentile(fours, 50), 1)
    out["ratio_microvm_branch4_to_restore"] = round(out["microvm_branch4_ms"] / out["microvm_restore_ms"], 2)
    out["ratio_microvm_restore4_to_restore"] = round(out["microvm_restore4_ms"] / out["microvm_restore_ms"], 2)
    out["targets"] = {"microvm_branch4_within_2x_restore": out["ratio_microvm_branch4_to_restore"] <= 2}
    return out
