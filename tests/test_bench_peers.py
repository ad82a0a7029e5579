"""``sandfleet bench peers``: real systems side by side, the JSON the issue names, a missing
system reported with its install command (never skipped silently), and a bad name refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandfleet.bench.peers import SYSTEMS, default_image

KEYS = ("create_exec_close_p50_ms", "create_exec_close_p99_ms", "exec_rtt_p50_ms", "exec_rtt_p99_ms",
        "cpu16_slowdown", "idle_pss_mib", "ratio_to_raw_bwrap")


def _peers(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sandfleet", "bench", "peers", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"), reason="needs root and bubblewrap")


@needs_root
@pytest.mark.slow
def test_peers_measures_each_system_in_one_run(tmp_path: Path) -> None:
    image = default_image()
    only = ["raw-bwrap", "sandfleet-bwrap", "sandfleet-gvisor"]
    if image != "host":  # the OCI runtimes can't pivot_root into the host's own "/"
        only += [name for name in ("crun", "podman") if shutil.which(name)]
    if not shutil.which("runsc"):
        only.remove("sandfleet-gvisor")
    html = tmp_path / "peers.html"
    proc = _peers("--only", ",".join(only), "--rounds", "3", "--rtt", "3", "--image", image, "--json",
                  "--html", str(html))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    rows = {r["name"]: r for r in result["systems"]}
    assert list(rows) == [n for n in SYSTEMS if n in only]  # the names, in its order
    for row in rows.values():
        assert "error" not in row and "missing" not in row, row
        assert set(KEYS) <= set(row)
        assert 0 < row["create_exec_close_p50_ms"] <= row["create_exec_close_p99_ms"], row
        assert row["cpu16_slowdown"] > 0 and row["idle_pss_mib"] > 0, row
    assert rows["raw-bwrap"]["exec_rtt_p50_ms"] is None  # one-shot: no live sandbox to exec in
    for name, row in rows.items():  # every other system is measured live too: its exec and idle memory
        assert name == "raw-bwrap" or (row["exec_rtt_p50_ms"] or 0) > 0, row
    assert rows["raw-bwrap"]["ratio_to_raw_bwrap"] == 1.0
    assert 0 < rows["sandfleet-bwrap"]["exec_rtt_p50_ms"] <= rows["sandfleet-bwrap"]["exec_rtt_p99_ms"]
    assert [t["target"] for t in result["targets"]][0].startswith("sandfleet-bwrap create->exec->close / raw-bwrap")
    assert "<figure class=\"chart\" data-chart=\"peers-create\"" in html.read_text()


def test_a_missing_system_is_reported_with_its_install_command(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = _peers("--only", "crun,podman", "--json", "--image", "host", env={**os.environ, "PATH": str(empty)},
                  timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(proc.stdout)["systems"]}
    assert rows["crun"]["install"] == "apt-get install crun" and "crun not found" in rows["crun"]["missing"]
    assert rows["podman"]["install"] == "apt-get install podman"
    text = _peers("--only", "crun", "--image", "host", env={**os.environ, "PATH": str(empty)}, timeout=120)
    assert "crun               missing: apt-get install crun" in text.stdout


def test_an_unknown_system_is_refused_by_name() -> None:
    proc = _peers("--only", "raw-bwrap,docker", timeout=60)
    assert proc.returncode == 2 and "unknown system(s) docker" in proc.stderr
