"""``sandfleet bench rollout``: the platform's time around a real rollout, against the sandbox's own.

It runs a task suite (the bundled ``examples/tasks`` by default) with the oracle agent at
concurrency = this host's cores, reads the run's ``trace.jsonl``, and measures, in the same
process right after, the sandbox layer's create -> exec ``true`` -> close cycle
(:func:`sandfleet.bench.micro.create_exec_close_ms`, as ``bench micro``).

Figures (keys of the JSON; percentiles are :func:`sandfleet.stats.percentile`):
- ``platform_ms_per_rollout_p50`` / ``_mean`` / ``_p99``: per rollout attempt, the sum of its
  ``sandbox_start`` and ``other_sandbox`` spans (what the platform spends that is neither the
  agent's commands, the model nor the tests);
- ``spans_ms_per_rollout``: those spans by ``name: what`` (``sandbox_start: create`` for the
  sandbox's own start), mean milliseconds per rollout, largest first;
- ``create_exec_close_p50_ms``: the sandbox layer's cycle, measured after the suite;
- ``platform_to_create_exec_close``: the ratio of the two p50s.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sandfleet.bench.micro import create_exec_close_ms
from sandfleet.provenance import provenance
from sandfleet.stats import percentile

PLATFORM_SPANS = ("sandbox_start", "other_sandbox")
"""The spans that are the platform's own time around a rollout."""

Progress = Callable[[str], None]


def platform_figures(trace: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Platform milliseconds per rollout (p50, mean, p99) and the mean per ``name: what``, of
    the rows of a ``trace.jsonl`` (every attempt is a rollout's worth of platform work)."""
    per_rollout: list[float] = []
    by_what: dict[str, float] = defaultdict(float)
    for row in trace:
        total = 0.0
        for span in row.get("spans", ()):
            if span["name"] not in PLATFORM_SPANS:
                continue
            ms = (span["end"] - span["start"]) * 1e3
            total += ms
            what = span.get("what") or ("create" if span["name"] == "sandbox_start" else "other")
            by_what[f"{span['name']}: {what}"] += ms
        per_rollout.append(total)
    n = len(per_rollout)
    table = {k: round(v / n, 2) for k, v in sorted(by_what.items(), key=lambda kv: -kv[1])} if n else {}
    return {
        "rollouts": n,
        "platform_ms_per_rollout_p50": round(percentile(per_rollout, 50), 2),
        "platform_ms_per_rollout_mean": round(sum(per_rollout) / n, 2) if n else None,
        "platform_ms_per_rollout_p99": round(percentile(per_rollout, 99), 2),
        "spans_ms_per_rollout": table,
    }


def read_trace(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def run_rollout_bench(
    tasks_dir: Path,
    *,
    backend: str = "bwrap",
    n: int = 1,
    concurrency: int | None = None,
    only: Sequence[str] = (),
    micro_n: int = 30,
    out_dir: Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the suite with the oracle, then ``micro_n`` create/exec/close cycles; the figures.
    The run's files go to ``out_dir`` (a temporary folder, removed, when None)."""
    from sandfleet.errors import ConfigError
    from sandfleet.rollout.policy import OraclePolicy
    from sandfleet.rollout.suite import RunConfig, run_suite
    from sandfleet.sandbox.spec import SandboxSpec
    from sandfleet.tasks import load_tasks

    say = progress or (lambda _m: None)
    tasks, _failures = load_tasks(tasks_dir)
    if only:
        tasks = [t for t in tasks if t.name in set(only)]
    if not tasks:
        raise ConfigError(f"no task to run under {tasks_dir}")
    cores = os.cpu_count() or 1
    conc = max(concurrency or cores, n)
    out: dict[str, Any] = {
        "backend": backend, "tasks": len(tasks), "n": n, "concurrency": conc,
        "provenance": provenance({"bench": "rollout", "backend": backend, "tasks": str(tasks_dir), "n": n,
                                  "concurrency": conc, "micro_n": micro_n}),
    }  # fmt: skip
    config = RunConfig(n=n, concurrency=conc, backend=backend)
    with tempfile.TemporaryDirectory(prefix="sandfleet-bench-rollout-") as tmp:
        where = out_dir or Path(tmp) / "run"
        say(f"{len(tasks)} tasks x {n} with the oracle, concurrency {conc}")
        report = await run_suite(tasks, OraclePolicy(), config, out_dir=where, out_mode="overwrite")
        summary = report.summary()
        out["completed"] = summary["n_completed"]
        out["pass_rate"] = summary["pass_rate"]
        out["wall_s"] = round(summary["wall_s"], 2)
        out.update(platform_figures(read_trace(where / "trace.jsonl")))
    say(f"create+exec+close x{micro_n}")
    cycles = await create_exec_close_ms(SandboxSpec(backend=backend), micro_n)
    cec = percentile(cycles, 50)
    out["create_exec_close_p50_ms"] = round(cec, 2)
    p50 = out["platform_ms_per_rollout_p50"]
    out["platform_to_create_exec_close"] = round(p50 / cec, 2) if cec > 0 else None
    return out
