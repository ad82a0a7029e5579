"""The soak: real rollouts of real tasks at full load for a long while, and what drifts.

``sandfleet bench soak --duration 5400 --window 600`` (the study's 90 minutes) or
``--duration 120 --window 30`` (CI). ``concurrency`` workers each loop: one whole rollout
(a fresh sandbox of the task's image, the agent, the verifier, close) through the same code
as ``sandfleet run``, each result kept. Reported:

- evals/min in each window of ``window`` seconds, counted from the moment every worker has
  finished its first rollout (the steady state: the image build, the first starts and the
  workers' common start are not in the first window; counted from the first rollout's end,
  the first window also held the other workers' first rollouts, begun before it: 20 against
  17 in one run), and the drift of the last window against the first; and the same per
  CPU-second of the soak's own processes (this one and every descendant it reaped), which
  the load of other work on the host moves far less than wall time (on a shared 2-core host
  at load 10-30, wall-time windows moved by half between neighbours);
- whether that drift can be read as sandfleet's (``drift_comparable``, with why not): the
  first and last windows need :data:`MIN_ROLLOUTS` rollouts each, and the
  host's contention alike in both: its runnable tasks (``procs_running``, averaged) within
  :data:`MAX_RUNNABLE_CHANGE` and the soak's own CPU-seconds within :data:`MAX_SHARE_CHANGE`,
  since a contended CPU does less per cycle: the same rollouts cost 0.62 CPU-s each beside
  load 7 and 0.85 beside load 15 (not polling: an idle sandbox costs the same CPU whether it
  lives 0, 10 or 20 s);
- lost results: rollouts started that gave no result;
- verdicts, and the ``infra_fault`` rollouts whose cause is inside sandfleet (every infra
  cause but the model server's: the oracle agent uses none) with their errors;
- the host side's memory: this process's RSS after the first window and at the end, as
  MiB per hour;
- what the host holds at each window's end (memory cgroups, dying ones included; negative
  dentries; slab) and the share of its CPU the hypervisor stole in each window: what a
  drift that is not sandfleet's own would show in;
- leaks at the end: markers, cgroups and processes of the soak's sandboxes, and zombies
  among this process's children.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sandfleet.bench.load import Progress

V = TypeVar("V")

MIN_ROLLOUTS = 20
"""Rollouts in the first and in the last window for their drift to be read: one rollout
more or less in a window of 20 is 5 %."""

MAX_RUNNABLE_CHANGE = 0.25
"""How much the host's mean runnable tasks may differ between the first and the last window
for their rates to be compared (more contention costs more CPU per rollout)."""

MAX_SHARE_CHANGE = 0.2
"""How much the CPU the soak's processes got may differ between the first and the last
window: per rollout they used 0.59-0.67 CPU-s with 0.4-0.5 CPU to themselves and 0.73-0.85
with 0.1-0.2 (three runs here), whatever the runnable tasks read."""

OUTSIDE_CAUSES = ("model_unreachable", "model_timeout", "model_overloaded", "model_refused_auth",
                  "model_malformed", "cancelled")
"""infra_fault causes outside sandfleet (the model server's, a stop): the rest are ours."""


@dataclass(frozen=True)
class Kept:
    """What the soak keeps of one rollout."""

    end: float  # time.monotonic() when it ended
    worker: int
    verdict: str | None
    fault: dict[str, Any] | None
    error: str
    passed: bool


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def zombie_children() -> list[str]:
    """Zombies among this process's children (exited, not reaped)."""
    me, out = os.getpid(), []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            st = (p / "stat").read_text()
        except OSError:
            continue
        rest = st[st.rindex(")") + 2:].split()
        if rest[0] == "Z" and int(rest[1]) == me:
            out.append(f"{p.name} {st[st.index('(') + 1:st.rindex(')')]}")
    return out


def cpu_seconds() -> float:
    """CPU time of this process and of every descendant it reaped (a sandbox's guest agent
    and commands come back through bwrap's child, which the CLI reaps as a subreaper)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def runnable() -> float:
    """The host's runnable tasks now (``procs_running`` of /proc/stat)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("procs_running "):
            return float(line.split()[1])
    return 0.0


def host_counters() -> dict[str, float]:
    """What the host holds and spends that a long soak could grow or lose: CPU jiffies
    stolen by the hypervisor and in all (``/proc/stat``), memory cgroups alive or dying
    (``/proc/cgroups``), negative dentries (``/proc/sys/fs/dentry-state``), slab (MiB)."""
    out: dict[str, float] = {}
    try:
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        ticks = [int(x) for x in cpu[:8]]
        out["steal"], out["ticks"] = float(ticks[7]) if len(ticks) > 7 else 0.0, float(sum(ticks))
        for line in Path("/proc/cgroups").read_text().splitlines():
            f = line.split()
            if f and f[0] == "memory":
                out["memory_cgroups"] = float(f[2])
        out["negative_dentries"] = float(Path("/proc/sys/fs/dentry-state").read_text().split()[4])
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("Slab:"):
                out["slab_mib"] = int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


PROBE_EVERY_S = 15.0
"""How often the host's own speed is probed during a soak (:func:`probe_speed`)."""
PROBE_ITERATIONS = 80_000
"""Iterations per chunk; a probe times 7 chunks and keeps the median chunk's rate (a chunk a
context switch fell into is an outlier, not the CPU's speed)."""
PROBE_CODE = ("import time\nrates = []\nfor _ in range(7):\n    t = time.thread_time()\n    x = 0\n"
              f"    for i in range({PROBE_ITERATIONS}):\n        x += i * i\n"
              f"    rates.append({PROBE_ITERATIONS} / (time.thread_time() - t))\n"
              "print(sorted(rates)[3])\n")


async def probe_speed() -> float | None:
    """The host's speed now: loop iterations of a fixed, unsandboxed Python loop per second of
    the CPU time it got (about 40 ms of it), in a process of its own beside the soak. Per CPU-
    second, so the soak's share of the CPU does not move it; what does is how much work the
    CPU does in a second it gives, which a VM's neighbours and its frequency change (three
    90-minute soaks here: quiet windows 19 % apart in evals per CPU-second, under 0.5 % stolen)."""
    try:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-I", "-S", "-c", PROBE_CODE,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.DEVNULL)
        out, _ = await proc.communicate()
        return float(out) if proc.returncode == 0 else None
    except (OSError, ValueError):
        return None


def median_in(samples: list[tuple[float, float]], a: float, b: float) -> float | None:
    inside = sorted(v for t, v in samples if a <= t < b)
    return inside[len(inside) // 2] if inside else None


def mean_in(samples: list[tuple[float, float]], a: float, b: float) -> float | None:
    got = [v for t, v in samples if a <= t < b]
    return sum(got) / len(got) if got else None


def comparable(counts: list[int], run: list[float | None], used: list[float]) -> dict[str, Any]:
    """Whether the last window's rate can be compared with the first's: enough
    rollouts in each, and the host's other load alike (:data:`MAX_RUNNABLE_CHANGE`,
    :data:`MAX_SHARE_CHANGE`; ``used``: the soak's CPU-seconds in each window)."""
    why = []
    if len(counts) < 2 or min(counts[0], counts[-1]) < MIN_ROLLOUTS:
        why.append(f"windows of {counts[0] if counts else 0} and {counts[-1] if counts else 0} rollouts "
                   f"(under {MIN_ROLLOUTS}: one more or less is over 5 %)")
    a, b = (run[0], run[-1]) if run else (None, None)
    if not a or b is None or abs(b / a - 1) > MAX_RUNNABLE_CHANGE:
        why.append(f"the host's runnable tasks went from {a} to {b} (beyond {MAX_RUNNABLE_CHANGE:.0%})")
    if not used or not used[0] or abs(used[-1] / used[0] - 1) > MAX_SHARE_CHANGE:
        why.append(f"the soak's CPU-seconds went from {used[0] if used else None} to {used[-1] if used else None} "
                   f"(beyond {MAX_SHARE_CHANGE:.0%})")
    return {"ok": not why, "why": "; ".join(why)}


def at(samples: list[tuple[float, V]], t: float) -> V:
    """The sampled value at the last sample not after ``t`` (the first sample if none)."""
    best = samples[0][1]
    for ts, v in samples:
        if ts > t:
            break
        best = v
    return best


def windows(ends: list[float], start: float, stop: float, window: float) -> list[float]:
    """evals/min in each whole window of ``window`` seconds from ``start`` to ``stop``."""
    n = int((stop - start) // window)
    counts = [0] * n
    for e in ends:
        k = int((e - start) // window)
        if 0 <= k < n:
            counts[k] += 1
    return [round(c * 60.0 / window, 2) for c in counts]


async def run_soak(task_refs: list[str], *, backend: str = "bwrap", concurrency: int = 4,
                   duration_s: float = 120.0, window_s: float = 30.0, say: Progress | None = None) -> dict[str, Any]:
    from sandfleet.bench.evals import find_task
    from sandfleet.rollout.policy import OraclePolicy
    from sandfleet.rollout.runner import RetryPolicy, RolloutRequest, run_with_retries, task_spec
    from sandfleet.rollout.suite import default_image_for
    from sandfleet.server.testing import leftovers

    if duration_s < 2 * window_s:
        raise ValueError(f"a soak of {duration_s} s has not two windows of {window_s} s")
    tasks = [find_task(t) for t in task_refs]
    specs = [task_spec(t, await default_image_for(t), backend) for t in tasks]  # built before the clock
    policy = OraclePolicy()
    retry = RetryPolicy(max_attempts=1)  # a soak counts every fault: none is refilled away
    results: list[Kept] = []
    started = 0
    ids: list[str | None] = []
    t0 = time.monotonic()
    deadline = t0 + duration_s
    rss: dict[str, float] = {"start": rss_mib()}

    async def worker(w: int) -> None:
        nonlocal started
        k = 0
        while time.monotonic() < deadline:
            i = (w + k * concurrency) % len(tasks)
            req = RolloutRequest(task=tasks[i], policy=policy, spec=specs[i], sample=w, run_id="soak",
                                 rollout_id=f"soak-{w}-{k}")
            started += 1
            k += 1
            r = await run_with_retries(req, retry, lambda a: ids.append(a.sandbox_id))
            # only what the report needs: a soak that kept every result whole would measure
            # its own list as the host side's memory growth (~8 KiB a rollout, spans and all)
            results.append(Kept(time.monotonic(), w, r.verdict, r.fault, (r.error or "")[:200], r.passed))
            if say is not None and len(results) % 50 == 0:
                say(f"soak: {len(results)} rollouts, {time.monotonic() - t0:.0f} s")

    cpu: list[tuple[float, float]] = [(t0, cpu_seconds())]
    host: list[tuple[float, float]] = [(t0, runnable())]
    counters: list[tuple[float, dict[str, float]]] = [(t0, host_counters())]
    speed: list[tuple[float, float]] = []
    stop_probing = asyncio.Event()

    async def probe() -> None:  # (ended by the event, never cancelled: no probe left unreaped)
        while time.monotonic() < deadline and not stop_probing.is_set():
            v = await probe_speed()
            if v is not None:
                speed.append((time.monotonic(), v))
            try:
                await asyncio.wait_for(stop_probing.wait(), PROBE_EVERY_S)
            except TimeoutError:
                pass

    async def sample_rss() -> None:
        n = 0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            n += 1
            cpu.append((time.monotonic(), cpu_seconds()))
            host.append((time.monotonic(), runnable()))
            if n % 20 == 0:  # every 5 s
                counters.append((time.monotonic(), host_counters()))
            if results and "first_window" not in rss:
                first_end = min(r.end for r in results)
                if time.monotonic() >= first_end + window_s:
                    rss["first_window"] = rss_mib()

    sampler = asyncio.create_task(sample_rss())
    prober = asyncio.create_task(probe())
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    sampler.cancel()
    stop_probing.set()
    await prober
    t_end = time.monotonic()
    rss["end"] = rss_mib()
    ends = [r.end for r in results]
    firsts: dict[int, float] = {}
    for r in results:
        firsts[r.worker] = min(r.end, firsts.get(r.worker, r.end))
    # the steady state: every worker has a rollout behind it (else from the first end)
    first = max(firsts.values()) if len(firsts) == concurrency else min(ends) if ends else t0
    per_window = windows(ends, first, min(t_end, deadline), window_s)
    verdicts = Counter(r.verdict for r in results)
    ours = [r for r in results if r.verdict == "infra_fault"
            and (r.fault or {}).get("cause") not in OUTSIDE_CAUSES]
    unlisted = [r for r in results if (r.fault or {}).get("cause") == "unlisted"]
    hours_measured = (t_end - first - window_s) / 3600
    base = rss.get("first_window", rss["start"])
    await asyncio.sleep(0.5)  # (the last closes' processes reaped)
    leaks = leftovers([i for i in ids if i]) + [f"zombie {z}" for z in zombie_children()]
    drift = (per_window[-1] - per_window[0]) / per_window[0] if len(per_window) >= 2 and per_window[0] else None
    cpu.append((time.monotonic(), cpu_seconds()))
    counters.append((time.monotonic(), host_counters()))
    per_cpu = []  # evals per CPU-second of the soak's own processes: what other load on the host does not move
    counts, used_s, run = [], [], []
    host_speed: list[float | None] = []  # the probe's median in each window
    hosts: dict[str, list[float | None]] = {"steal": [], "memory_cgroups": [], "negative_dentries": [], "slab_mib": []}
    for k, rate in enumerate(per_window):
        a, b = first + k * window_s, first + (k + 1) * window_s
        ca, cb = at(counters, a), at(counters, b)
        ticks = cb.get("ticks", 0.0) - ca.get("ticks", 0.0)
        hosts["steal"].append(round((cb.get("steal", 0.0) - ca.get("steal", 0.0)) / ticks, 4) if ticks > 0 else None)
        for key in ("memory_cgroups", "negative_dentries", "slab_mib"):
            hosts[key].append(round(cb[key], 1) if key in cb else None)
        used = at(cpu, b) - at(cpu, a)
        per_cpu.append(round(rate * window_s / 60.0 / used, 4) if used > 0 else None)
        counts.append(round(rate * window_s / 60.0))
        used_s.append(round(used, 1))
        m = mean_in(host, a, b)
        run.append(None if m is None else round(m, 1))
        v = median_in(speed, a, b)
        host_speed.append(None if v is None else round(v))
    cpu_drift = ((per_cpu[-1] - per_cpu[0]) / per_cpu[0]
                 if len(per_cpu) >= 2 and per_cpu[0] and per_cpu[-1] is not None else None)
    # the host's own change between the same two windows, and the drift net of it: what is
    # left of the change in evals per CPU-second once the CPU's own speed is divided out
    speed_drift = (host_speed[-1] / host_speed[0] - 1.0
                   if len(host_speed) >= 2 and host_speed[0] and host_speed[-1] else None)
    net_drift = ((1.0 + cpu_drift) / (1.0 + speed_drift) - 1.0
                 if cpu_drift is not None and speed_drift is not None else None)
    return {
        "tasks": [t.name for t in tasks], "backend": backend, "concurrency": concurrency,
        "duration_s": duration_s, "window_s": window_s, "wall_s": round(t_end - t0, 1),
        "rollouts": len(results), "started": started, "lost": started - len(results),
        "evals_per_min": per_window, "drift": None if drift is None else round(drift, 4),
        "evals_per_cpu_s": per_cpu, "cpu_drift": None if cpu_drift is None else round(cpu_drift, 4),
        "rollouts_per_window": counts, "cpu_s_per_window": used_s, "runnable_per_window": run,
        "drift_comparable": comparable(counts, run, used_s),
        # the host's speed per window (probe_speed's loop iterations per CPU-second, the median
        # of a probe every PROBE_EVERY_S), its drift, and cpu_drift net of it: recorded to see
        # whether the host's speed explains the drift of long soaks, not a pass criterion
        "host_speed_per_window": host_speed,
        "host_speed_drift": None if speed_drift is None else round(speed_drift, 4),
        "cpu_drift_net_of_host": None if net_drift is None else round(net_drift, 4),
        # per window: the share of the host's CPU time the hypervisor stole, and at its end the
        # memory cgroups (dying ones included), negative dentries and slab the host held
        "steal_per_window": hosts["steal"], "memory_cgroups_per_window": hosts["memory_cgroups"],
        "negative_dentries_per_window": hosts["negative_dentries"], "slab_mib_per_window": hosts["slab_mib"],
        "load_avg": [round(x, 1) for x in os.getloadavg()],
        "verdicts": dict(verdicts), "passed": sum(r.passed for r in results),
        "infra_faults_inside": len(ours),
        "infra_fault_examples": [f"{(r.fault or {}).get('cause')}: {(r.error or '')[:200]}" for r in ours[:5]],
        "unlisted": len(unlisted),
        "rss_mib": {k: round(v, 1) for k, v in rss.items()},
        "rss_growth_mib_per_hour": round((rss["end"] - base) / hours_measured, 1) if hours_measured > 0 else None,
        "leaks": leaks,
    }
