"""``sandfleet bench interpreter`` (issue 47) at a tiny size: 2 kernels x 2 cells, a few round
trips, in process and through a real ``sandfleet serve`` it starts. The figures' keys and signs
only: no timing thresholds (the targets' verdicts are printed, not asserted)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import backend_skip
from sandfleet.bench.interpreter import targets


def test_targets_say_met_or_not_per_figure() -> None:
    got = targets({"local_cell_over_exec_true": 0.4, "v1_cell_over_exec_true": 3.5, "e2b_cell_over_exec_true": None,
                   "kernels_over_fresh": 5.0})
    assert got == {"local_cell_within_3x_exec_true": True, "v1_cell_within_3x_exec_true": False,
                   "kernels_at_least_5x_fresh": True}


def test_bench_interpreter_json() -> None:
    skip = backend_skip("bwrap")
    if skip:
        pytest.skip(skip)
    if importlib.util.find_spec("fastapi") is None:
        pytest.skip("the service needs the server extra (pip install -e '.[server]')")
    proc = subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", "bench", "interpreter", "-n", "4", "--concurrent", "2",
         "--cells", "2", "--rounds", "2", "--fusion-rounds", "2", "--json"],
        capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    sides = ["local", "v1"] + (["e2b"] if importlib.util.find_spec("e2b_code_interpreter") else [])
    for side in sides:
        for key in (f"{side}_cell_p50_ms", f"{side}_cell_p90_ms", f"{side}_exec_true_p50_ms",
                    f"{side}_exec_true_p90_ms", f"{side}_cell_over_exec_true"):
            assert out[key] > 0, key
        assert f"{side}_cell_within_3x_exec_true" in out["targets_met"]
    assert (out["concurrent"], out["cells"], out["rounds"]) == (2, 2, 2)
    assert out["kernel_cells_per_s"] > 0 and out["fresh_cells_per_s"] > 0 and out["kernels_over_fresh"] > 0
    assert len(out["kernel_cells_per_s_rounds"]) == len(out["fresh_cells_per_s_rounds"]) == 2
    assert "kernels_at_least_5x_fresh" in out["targets_met"]
    assert out["provenance"]["config"]["bench"] == "interpreter"
    assert (out["fusion_cells"], out["fusion_rounds"]) == (2, 2)
    for key in ("fusion_jupyter_cell_p50_ms", "fusion_jupyter_request_p50_ms", "fusion_run_code_cell_p50_ms",
                "fusion_run_code_over_jupyter"):
        assert out[key] > 0, key


def test_bench_interpreter_text_in_process_only() -> None:
    skip = backend_skip("bwrap")
    if skip:
        pytest.skip(skip)
    proc = subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", "bench", "interpreter", "-n", "2", "--concurrent", "2",
         "--cells", "2", "--rounds", "1", "--no-service"],
        capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for key in ("local_cell_p50_ms", "local_exec_true_p50_ms", "local_cell_over_exec_true", "kernel_cells_per_s",
                "fresh_cells_per_s", "kernels_over_fresh", "targets_met"):
        assert any(line.startswith(key + " ") for line in proc.stdout.splitlines()), (key, proc.stdout)
    assert "v1_cell_p50_ms" not in proc.stdout
    assert "... in process (bwrap)" in proc.stderr
