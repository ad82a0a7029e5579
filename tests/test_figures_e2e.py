"""End to end: two real runs against the scripted model server, analysed, and the report
opened in a real browser.

A runs at this host's speed; B with ``--cpu-fraction 0.1`` (every sandbox's cores deliver
a tenth). A and B run at the same time, so both see the same load from whatever else the
host runs: one after the other, a busier minute during A than during B (load 8-12 on 2
cores) made A the slower, and a throttle to 0.5 of a core bound nothing where a sandbox's
fair share was below it anyway; a tenth binds up to a load of about 20 per 2 cores. The
model replies after a fixed delay and every command is CPU-bound, so B must spend more time
in agent_command and in the verifier, the what-if gap must grow as inference gets faster
(model time, equal in both, shrinks; the CPU-bound difference stays), and the KV cache must
sit idle for a larger share of B's window (longer tool turns between equal model turns).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from browser import browser, check_report  # noqa: F401  (the fixture)
from sandfleet.testing.fake_server import FakeModelServer
from test_rollout_support import make_task, needs_bwrap

pytestmark = [pytest.mark.slow, needs_bwrap()]

# ~0.2 s of one core here, whatever the sandbox's user; ten times that at --cpu-fraction 0.1
CPU = "python3 -c 'sum(i * i for i in range(1500000))'"
TEST_SH = f"""#!/bin/bash
mkdir -p /logs/verifier
{CPU}
{CPU}
echo 1 > /logs/verifier/reward.txt
"""
SCRIPT = [{"bash": CPU, "delay_s": 0.3}, {"bash": CPU, "delay_s": 0.3}, {"bash": CPU, "delay_s": 0.3},
          {"text": "Done.", "delay_s": 0.3}]
ANALYSIS_CHARTS = ["breakdown", "whatif", "kv-idle", "group-wait"]


def _sandfleet(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _together([list(args)], check=check)[0]


def _together(argvs: list[list[str]], check: bool = True) -> list[subprocess.CompletedProcess[str]]:
    """Run several ``sandfleet`` commands at the same time; their results in order."""
    procs = [subprocess.Popen([sys.executable, "-m", "sandfleet.cli", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
             for args in argvs]
    done = []
    for args, p in zip(argvs, procs, strict=True):
        out, err = p.communicate(timeout=900)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        if check:
            assert p.returncode == 0, f"sandfleet {' '.join(args)}: {out[-2000:]}\n{err[-4000:]}"
    return done


def test_slower_host_costs_cpu_time_not_model_time(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    tasks = tmp_path / "tasks"
    for name in ("cpu-a", "cpu-b"):
        make_task(tasks, name, test_sh=TEST_SH, agent_timeout=300, verifier_timeout=300)
    with FakeModelServer(SCRIPT) as server:
        common = ["run", "--tasks", str(tasks), "--agent", "openai", "--model-url", server.url, "--model",
                  "fake-model", "-n", "2", "--concurrency", "2", "--backend", "bwrap"]
        _together([[*common, "--out", str(tmp_path / "A")],
                   [*common, "--out", str(tmp_path / "B"), "--cpu-fraction", "0.1"]])
    for run in ("A", "B"):
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["n_completed"] == 4 and summary["mean_reward"] == 1.0, summary

    out = _sandfleet("analyze", str(tmp_path / "A"), str(tmp_path / "B"), "--json", "--html",
                     str(tmp_path / "report.html"))
    a = json.loads(out.stdout)
    spans = a["compare"]["spans"]
    # the CPU-bound parts are slower on B ...
    assert spans["agent_command"]["delta_s"] > 0, spans["agent_command"]
    assert spans["verifier"]["delta_s"] > 0, spans["verifier"]
    assert spans["total"]["delta_s"] > 0, spans["total"]
    # ... so the gap grows as inference gets faster (model time is the same on both) ...
    gaps = [a["whatif"][k] for k in sorted(a["whatif"], key=float)]
    assert all(later > earlier for earlier, later in zip(gaps, gaps[1:], strict=False)), gaps
    # ... and the KV cache waits longer on B's tool turns
    kv = a["kv_idle_fraction"]
    assert kv["B"] > kv["A"], kv
    # sandbox_start is reported against a bare bwrap timed in the same run; provenance recorded
    assert all(v is not None and v > 0 for v in a["raw_bwrap_true_ms"].values()), a["raw_bwrap_true_ms"]
    assert all(p["commit"] for p in a["provenance"]["runs"].values()), a["provenance"]["runs"]
    print("e2e figures:", json.dumps({
        "delta_s": {k: round(v["delta_s"], 3) for k, v in spans.items()},
        "whatif_gap": a["whatif"], "kv_idle_fraction": kv,
        "kv_idle_fraction_through_reward": a["kv_idle_fraction_through_reward"],
        "group_wait_fraction": a["group_wait_fraction"],
        "platform_overhead_fraction": a["platform_overhead_fraction"],
        "sandbox_start_s": {r: a["spans"][r]["sandbox_start"]["mean"] for r in ("A", "B")},
        "raw_bwrap_true_ms": a["raw_bwrap_true_ms"]}))

    check_report(browser, tmp_path / "report.html", ANALYSIS_CHARTS)
