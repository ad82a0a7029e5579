"""The capacity benchmark end to end, tiny: real sandboxes, real bare processes, real workload."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from browser import browser, check_report  # noqa: F401  (the fixture)
from sandfleet.bench import load
from sandfleet.bench.report import expected_charts
from sandfleet.bench.run import BenchConfig, _geo_ratio_ci, run_bench
from sandfleet.bench.workers import SandboxFleet, close_all
from sandfleet.bench.workload import COMMANDS, QUICK, prepare_workload, select
from sandfleet.cli import cli
from sandfleet.sandbox import resolve_backend
from sandfleet.sandbox.state import list_sandboxes


@pytest.fixture(scope="module")
def workload() -> Path:
    try:
        return prepare_workload()
    except Exception as e:  # the first preparation downloads pinned sdists
        pytest.skip(f"bench workload unavailable (needs the package index once): {e}")


def _mine() -> list[dict[str, Any]]:
    return [m for m in list_sandboxes() if m.get("owner_pid") == os.getpid()]


def test_workload_is_complete(workload: Path) -> None:
    for part in ("toolz/toolz/tests", "lz4/lz4frame.c", "repo/.git", "data.sqlite", "wheels"):
        assert (workload / part).exists(), part
    assert len(list((workload / "wheels").glob("*.whl"))) == 4
    assert len({c.name for c in COMMANDS}) == len(COMMANDS) >= 8


async def test_single_sweep_capacity_baseline(workload: Path) -> None:
    cfg = BenchConfig(modes=("single", "sweep", "capacity", "baseline"), commands=QUICK, ns=(1, 2),
                      duration_s=2.0, repeats=1, threads=2, min_samples=3)
    saved: list[int] = []
    res: dict[str, Any] = {}
    await run_bench(cfg, res, save=lambda r: saved.append(len(r)))
    prov = res["provenance"]
    host = prov["host"]
    assert host["threads"] >= 1 and host["page_size"] > 0 and host["kernel"] and host["cgroup"]
    assert prov["sandfleet"] and "commit" in prov and prov["config"]["commands"] == list(QUICK)
    assert prov["config"]["min_samples"] == 3 and prov["config"]["workload"]["version"]
    assert set(res["single"]) == set(QUICK)
    assert all(v["median_s"] > 0 and v["failures"] == 0 for v in res["single"].values())
    assert set(res["sweep"]) == {"1", "2"}  # adjacent levels: nothing finer to add
    ref = res["interleaved_single"]["commands"]
    assert all(ref[c]["n"] >= 3 for c in QUICK), ref  # 3 slots (before N=1, before N=2, after) of 1 round
    for n, row in res["sweep"].items():
        assert row["failures"]["count"] == 0 and row["grid"] == "coarse" and not row["short_of_min_samples"]
        for c, v in row["commands"].items():
            assert v["n"] >= 3 and 0 < v["p95_ci_s"][0] <= v["p95_ci_s"][1], (n, c, v)
        for c, v in row["slowdown"].items():  # against the interleaved single baseline, N=1 included
            assert v["slowdown_p95"] == round(row["commands"][c]["p95_s"] / ref[c]["p95_s"], 3), n
            assert v["slowdown_median"] == round(row["commands"][c]["median_s"] / ref[c]["median_s"], 3), n
            assert v["slowdown_p95_ci"][0] <= v["slowdown_p95_ci"][1]
        assert set(row["slowdown"]) == set(QUICK)
    cap = res["capacity"]
    assert cap["target"] == 1.5 and 0 <= cap["sandboxes"] <= 2 and cap["per_thread"] == round(cap["sandboxes"] / 2, 3)
    assert cap["measured"] == [1, 2] and cap["method"]
    bl = res["baseline"]
    assert bl["failures"]["count"] == 0, bl["failures"]
    ov = res["baseline_overhead"]
    assert ov["n"] == 2 and ov["full_load"] is not None and set(ov["per_command"]) == set(QUICK), bl
    for key in ("full_load", "single"):  # each with its bootstrap interval, which holds the estimate
        lo, hi = ov[f"{key}_ci"]
        assert lo <= hi and lo - 1e-3 <= ov[key] <= hi + 1e-3, (key, ov)
    assert all(v["n"] == 1 for v in bl["bare_single"].values())
    # the bare baseline as the sandboxes: the same CPU quota read back from both cgroups, a tmpfs
    # working copy on both sides, output captured and capped alike, process counts recorded
    if bl["quota"]["sandbox"]["cpus"] is not None:
        assert bl["quota"]["bare"] == bl["quota"]["sandbox"] and bl["quota"]["bare"]["cpus"] == 1.0
    assert bl["working_copy"]["bare"].startswith("tmpfs")
    if host["backend"] == "bwrap":
        assert bl["working_copy"]["sandbox"].startswith("tmpfs")
    assert bl["output"]["cap_bytes_each"] == 1 << 20 and bl["processes"]["full_load"] == 2
    assert saved, "partial results are saved after each mode"
    assert not _mine()
    assert not list(Path("/dev/shm").glob(f"sandfleet-bench-bare-{os.getpid()}-*")), "bare copies removed"


async def test_a_dead_sandbox_fails_once_not_in_a_loop(workload: Path) -> None:
    """A sandbox that dies under load is one failure of its level, not a busy loop of them
    while the others run on to the cap for min_samples."""
    fleet = SandboxFleet(workload, resolve_backend("auto"))
    try:
        ws = await fleet.workers(2)
        try:
            os.kill(ws[1].sb.agent.proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
            for _ in range(100):
                if not ws[1].alive:
                    break
                await asyncio.sleep(0.05)
            samples = await load.drive(ws, select(["git"]), 0.5, min_samples=1000, cap_s=2.0)
        finally:
            await close_all(ws)
    finally:
        fleet.close()
    bad = [s for s in samples if not s.ok]
    assert len(bad) == 1 and "died" in bad[0].detail, bad[:3]
    assert sum(s.ok for s in samples) >= 2  # the live one went on to the cap
    assert not _mine()


async def test_cancel_keeps_partial_results(workload: Path) -> None:
    cfg = BenchConfig(modes=("single", "sweep"), commands=QUICK, ns=(1, 2), duration_s=30.0, repeats=1)
    res: dict[str, Any] = {}
    task = asyncio.create_task(run_bench(cfg, res))
    for _ in range(600):
        await asyncio.sleep(0.1)
        if res.get("single"):
            break
    await asyncio.sleep(1.0)  # now inside the sweep
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert set(res["single"]) == set(QUICK)
    assert "finished" in res
    assert not _mine(), "no sandbox outlives a cancelled run"


def test_cli_run_report_and_compare(workload: Path, tmp_path: Path, browser: Any) -> None:  # noqa: F811
    out, html = tmp_path / "a.json", tmp_path / "a.html"
    r = CliRunner().invoke(cli, ["bench", "run", "--modes", "single,sweep,capacity", "--commands", "sqlite",
                                 "--ns", "1,2", "--duration", "1", "--repeats", "1", "--min-samples", "2",
                                 "--out", str(out), "--html", str(html)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    for key in ("schema", "provenance", "single", "sweep", "interleaved_single", "capacity"):
        assert key in data
    assert data["provenance"]["host"]["backend"] == resolve_backend("auto")
    assert "capacity at 1.5x p95" in r.output
    page = html.read_text()
    assert re.findall(r'data-chart="([^"]+)"', page) == expected_charts(data) == ["latency-sqlite", "capacity"]
    other = tmp_path / "b.json"  # host B: every single-command median twice as long
    data_b = json.loads(out.read_text())
    for v in data_b["single"].values():
        v["median_s"] *= 2
    other.write_text(json.dumps(data_b))
    both = tmp_path / "r.html"
    r = CliRunner().invoke(cli, ["bench", "compare", str(out), str(other), "--html", str(both)])
    assert r.exit_code == 0, r.output
    rows = [line.split() for line in r.output.splitlines() if line.split()[:1] == ["sqlite"]]
    assert rows and all(row[3] == "2.00" for row in rows), r.output  # the B/A column
    assert re.findall(r'data-chart="([^"]+)"', both.read_text()) == expected_charts(data, data_b)
    r = CliRunner().invoke(cli, ["bench", "report", str(out), "--html", str(tmp_path / "again.html")])
    assert r.exit_code == 0, r.output
    assert re.findall(r'data-chart="([^"]+)"', (tmp_path / "again.html").read_text()) == expected_charts(data)
    # each report in a real browser: every chart there, sized, with data drawn; no console errors
    for path, want in ((html, expected_charts(data)), (both, expected_charts(data, data_b)),
                       (tmp_path / "again.html", expected_charts(data))):
        check_report(browser, path, want)


@pytest.mark.slow
async def test_evals_soak_density(workload: Path) -> None:
    cfg = BenchConfig(modes=("evals", "soak", "density"), commands=QUICK, duration_s=4.0, threads=2,
                      density_max=32)
    res: dict[str, Any] = {}
    await run_bench(cfg, res)
    assert res["evals"]["failures"] == 0 and res["evals_per_min"] > 0
    assert res["soak"]["failures"]["count"] == 0 and res["soak"]["drift"] is not None
    assert res["density"]["created"] == 32 and res["density"]["pss_mib"] > 0
    assert not _mine()


async def test_throttled_run_is_slower_and_cleans_up(workload: Path) -> None:
    from sandfleet.sandbox import cgroups

    lay = cgroups.detect()
    if not lay.usable or "cpu" not in lay.mounts:
        pytest.skip("needs a writable cgroup cpu controller")
    # a throttle far under what a busy host leaves a command (0.1: a 1 ms quota in a 10 ms period,
    # the kernel's least): at 0.3 of a CPU, a run beside a
    # load of 10 on 2 cores (0.2 each) was no slower than the unthrottled one (0.67 s, 0.61 s)
    base = BenchConfig(modes=("single",), commands=("sqlite",), repeats=2)
    fast: dict[str, Any] = {}
    slow: dict[str, Any] = {}
    await run_bench(base, fast)
    await run_bench(BenchConfig(modes=("single",), commands=("sqlite",), repeats=2, throttle=0.1), slow)
    assert slow["provenance"]["host"]["throttle"] == 0.1
    assert slow["single"]["sqlite"]["median_s"] > 1.5 * fast["single"]["sqlite"]["median_s"]
    root = lay.mounts["cpu"]
    assert not list(root.glob(f"sandfleet-slowhost-{os.getpid()}")) and not list(root.glob("sandfleet-bench/run-*"))
    assert "sandfleet-bench" not in Path("/proc/self/cgroup").read_text()
    assert not _mine()


def test_baseline_overhead_interval_finds_a_known_overhead_and_none() -> None:
    """The bootstrap interval of the geometric-mean overhead: sandboxes 20 % slower than bare
    processes on every command (the same latencies, scaled) give an interval around +20 % that
    excludes 0; a side against itself gives one around 0; no common command gives None."""
    import random

    rng = random.Random(7)
    bare = {c: [rng.uniform(0.08, 0.12) for _ in range(40)] for c in ("git", "sqlite", "gcc_o2")}
    slower = {c: [x * 1.2 for x in xs] for c, xs in bare.items()}
    same = {c: list(xs) for c, xs in bare.items()}
    lo, hi = _geo_ratio_ci(slower, bare)
    assert 0 < lo < 0.2 < hi < 0.4, (lo, hi)
    lo, hi = _geo_ratio_ci(same, bare)
    assert lo < 0 < hi and hi - lo < 0.2, (lo, hi)
    assert _geo_ratio_ci({"git": [0.1]}, {"sqlite": [0.1]}) is None
