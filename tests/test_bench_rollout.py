"""``sandfleet bench rollout`` (issue 46): a small suite with the oracle, its platform time per
rollout and per span, and create/exec/close of a bare sandbox measured in the same run. The
figures' keys and signs only: no timing thresholds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import backend_skip
from sandfleet.bench.rollout import platform_figures

ROOT = Path(__file__).resolve().parents[1]


def test_platform_figures_sum_the_platform_spans() -> None:
    trace = [{"spans": [
        {"name": "sandbox_start", "start": 0.0, "end": 0.010},
        {"name": "sandbox_start", "start": 0.010, "end": 0.012, "what": "task folders to root"},
        {"name": "agent_command", "start": 0.012, "end": 1.0},
        {"name": "other_sandbox", "start": 1.0, "end": 1.004, "what": "close"},
    ]}] * 2
    got = platform_figures(trace)
    assert got["rollouts"] == 2
    assert got["platform_ms_per_rollout_p50"] == pytest.approx(16.0)
    assert got["platform_ms_per_rollout_mean"] == pytest.approx(16.0)
    assert list(got["spans_ms_per_rollout"]) == ["sandbox_start: create", "other_sandbox: close",
                                                 "sandbox_start: task folders to root"]


def test_bench_rollout_json(tmp_path: Path) -> None:
    skip = backend_skip("bwrap")
    if skip:
        pytest.skip(skip)
    proc = subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", "bench", "rollout", "--tasks", str(ROOT / "examples" / "tasks"),
         "--task", "csv-awk-aggregate", "--task", "c-off-by-one", "-n", "1", "--micro-n", "3",
         "--out", str(tmp_path / "run"), "--json"],
        capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["completed"] == out["rollouts"] == 2
    for key in ("platform_ms_per_rollout_p50", "platform_ms_per_rollout_mean", "platform_ms_per_rollout_p99",
                "create_exec_close_p50_ms", "platform_to_create_exec_close"):
        assert out[key] > 0, key
    table = out["spans_ms_per_rollout"]
    assert "sandbox_start: create" in table and "other_sandbox: close" in table
    assert all(v >= 0 for v in table.values())
    assert (tmp_path / "run" / "trace.jsonl").is_file()
