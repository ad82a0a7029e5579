"""The capacity benchmark end to end, tiny: real sandboxes, real bare processes, real workload."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sandfleet.bench.run import BenchConfig, run_bench
from sandfleet.bench.workload import COMMANDS, QUICK, prepare_workload
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
    assert res["host"]["threads"] >= 1 and res["host"]["page_size"] > 0 and res["host"]["kernel"]
    assert set(res["single"]) == set(QUICK)
    assert all(v["median_s"] > 0 and v["failures"] == 0 for v in res["single"].values())
    assert set(res["sweep"]) == {"1", "2"}
    for row in res["sweep"].values():
        assert row["failures"]["count"] == 0
        assert all(v["n"] >= 3 for v in row["commands"].values())
        assert set(row["slowdown"]) == set(QUICK)
    one, two = res["sweep"]["1"]["commands"], res["sweep"]["2"]["commands"]
    for c, v in res["sweep"]["2"]["slowdown"].items():  # slowdown at N=2 is against N=1, per command
        assert v["slowdown_median"] == round(two[c]["median_s"] / one[c]["median_s"], 3)
        assert v["slowdown_p95"] == round(two[c]["p95_s"] / one[c]["p95_s"], 3)
    cap = res["capacity"]
    assert cap["target"] == 1.5 and 1 <= cap["sandboxes"] <= 2 and cap["per_thread"] == cap["sandboxes"] / 2
    ov = res["baseline_overhead"]
    assert ov["n"] == 2 and ov["full_load"] is not None and set(ov["per_command"]) == set(QUICK)
    assert res["baseline"]["failures"]["count"] == 0
    assert all(v["n"] == 1 for v in res["baseline"]["bare_single"].values())
    assert saved, "partial results are saved after each mode"
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


def test_cli_run_and_compare(workload: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    r = CliRunner().invoke(cli, ["bench", "run", "--modes", "single,sweep,capacity", "--commands",
                                  ",".join(QUICK), "--ns", "1,2", "--duration", "1", "--repeats", "1",
                                  "--min-samples", "0", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    for key in ("host", "single", "sweep", "capacity", "evals_per_min", "baseline_overhead"):
        assert key in data
    assert data["host"]["backend"] == resolve_backend("auto")
    assert "capacity at 1.5x p95" in r.output
    other = tmp_path / "b.json"  # host B: every single-command median twice as long
    data_b = json.loads(out.read_text())
    for v in data_b["single"].values():
        v["median_s"] *= 2
    other.write_text(json.dumps(data_b))
    html = tmp_path / "r.html"
    r = CliRunner().invoke(cli, ["bench", "compare", str(out), str(other), "--html", str(html)])
    assert r.exit_code == 0, r.output
    rows = [line.split() for line in r.output.splitlines() if line.split()[:1] and line.split()[0] in QUICK]
    assert rows and all(row[3] == "2.00" for row in rows), r.output  # the B/A column
    assert html.read_text().count("<svg") >= 4


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
    base = BenchConfig(modes=("single",), commands=("sqlite",), repeats=2)
    fast: dict[str, Any] = {}
    slow: dict[str, Any] = {}
    await run_bench(base, fast)
    await run_bench(BenchConfig(modes=("single",), commands=("sqlite",), repeats=2, throttle=0.3), slow)
    assert slow["host"]["throttle"] == 0.3
    assert slow["single"]["sqlite"]["median_s"] > 1.5 * fast["single"]["sqlite"]["median_s"]
    root = lay.mounts["cpu"]
    assert not list(root.glob(f"sandfleet-slowhost-{os.getpid()}")) and not list(root.glob("sandfleet-bench/run-*"))
    assert "sandfleet-bench" not in Path("/proc/self/cgroup").read_text()
    assert not _mine()
