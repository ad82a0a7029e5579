"""The figures' arithmetic (capacity, slowdown, drift), compare and the HTML report, and the
throttled cgroup (real cgroups, real processes)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from sandfleet.bench import load
from sandfleet.bench.compare import compare, full_load_n, table_lines
from sandfleet.bench.report import html_report, summary_lines
from sandfleet.bench.throttle import Throttle
from sandfleet.bench.workers import BareWorker, Sample
from sandfleet.bench.workload import Command
from sandfleet.sandbox import cgroups


def _row(med: float, p95: float) -> dict[str, Any]:
    return {"n": 10, "failures": 0, "median_s": med, "p95_s": p95, "mean_s": med}


def _result(scale: float, slow: float, threads: int = 2, evals: float = 100.0) -> dict[str, Any]:
    single = {"gcc": _row(1.0 * scale, 1.1 * scale), "git": _row(0.1 * scale, 0.12 * scale)}
    sweep: dict[str, Any] = {}
    for n in (1, 2, 3, 4):
        f = 1 + slow * (n - 1)
        cmds = {c: _row(v["median_s"] * f, v["p95_s"] * f) for c, v in single.items()}
        sweep[str(n)] = {"commands": cmds, "failures": {"count": 0, "examples": []},
                         "slowdown": load.slowdowns(cmds, single)}
    return {"host": {"cpu_model": "cpu", "threads": threads, "backend": "bwrap", "throttle": None,
                     "kernel": "6", "page_size": 4096},
            "single": single, "sweep": sweep, "capacity": load.capacity(sweep, 1.5, threads),
            "evals_per_min": evals, "baseline_overhead": {"full_load": 0.01, "single": 0.0, "n": threads,
                                                          "per_command": {}}}


def test_slowdown_and_capacity() -> None:
    r = _result(1.0, 0.2)
    assert r["sweep"]["3"]["slowdown"]["gcc"] == {"slowdown_median": 1.4, "slowdown_p95": 1.4}
    cap = r["capacity"]
    assert cap["sandboxes"] == 3 and cap["per_thread"] == 1.5 and cap["measured_up_to"] == 4
    assert cap["worst_by_n"]["4"]["slowdown_p95"] == pytest.approx(1.6)
    r["sweep"]["2"]["failures"]["count"] = 1  # a failing level ends the capacity
    assert load.capacity(r["sweep"], 1.5, 2)["sandboxes"] == 1


def test_summarize_and_drift() -> None:
    samples = [Sample("a", 1.0 + 0.01 * i, True, float(i)) for i in range(100)]
    samples.append(Sample("a", 9.0, False, 50.0, "exit 1"))
    s = load.summarize(samples)["a"]
    assert s["n"] == 100 and s["failures"] == 1 and s["median_s"] == pytest.approx(1.5, abs=0.01)
    d = load.drift(samples, 100.0, windows=10)
    assert len(d["windows"]) == 10 and d["drift"] == pytest.approx(1.95 / 1.05 - 1, abs=0.02)
    assert load.failures_of(samples)["count"] == 1


def test_compare_table_and_html() -> None:
    a, b = _result(1.0, 0.1), _result(1.5, 0.3, evals=60.0)
    cmp = compare(a, b)
    assert full_load_n(a) == 2
    assert cmp["commands"]["gcc"]["single_ratio"] == 1.5
    assert cmp["commands"]["gcc"]["slowdown_a"] == 1.1 and cmp["commands"]["gcc"]["slowdown_b"] == 1.3
    assert cmp["capacity"]["a"] == 4 and cmp["capacity"]["b"] == 2 and cmp["capacity"]["ratio"] == 0.5
    assert cmp["evals_per_min"]["ratio"] == 0.6
    text = "\n".join(table_lines(cmp))
    assert "capacity at 1.50x p95" in text and "B/A 0.60" in text
    html = html_report(a, b, cmp, names=("fast", "slow"))
    assert html.count("<svg") == 2 + 2 + 4 and "<script" not in html
    assert any("capacity" in line for line in summary_lines(a))


def _need_cgroup_cpu() -> None:
    lay = cgroups.detect()
    if os.geteuid() != 0 or not lay.usable or "cpu" not in lay.mounts:
        pytest.skip("needs root and a writable cgroup cpu controller")


async def test_throttle_slows_bare_processes(tmp_path: Path) -> None:
    _need_cgroup_cpu()
    spin = Command("spin", "python3 -c 'import time; t=time.process_time()\nwhile time.process_time()-t<0.3: pass'")
    (tmp_path / "wl").mkdir()
    free = await BareWorker(tmp_path).run(spin, 0.0)
    th = Throttle(0.25)
    try:
        assert th.root.is_dir()
        own = Path("/proc/self/cgroup").read_text()
        assert "sandfleet-bench" in own
        slow = await BareWorker(tmp_path, th.procs_file("bare-0")).run(spin, 0.0)
    finally:
        await asyncio.to_thread(th.close)
    assert free.ok and slow.ok, (free.detail, slow.detail)
    assert slow.latency_s > free.latency_s * 2
    assert not th.root.exists() and "sandfleet-bench" not in Path("/proc/self/cgroup").read_text()
