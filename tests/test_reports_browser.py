"""Every HTML report, opened in a real headless Chromium: each expected chart is there, has a
size and data marks, and the console shows no errors (tests/browser.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from browser import browser, check_report  # noqa: F401  (the fixture)
from sandfleet.analysis.trace import write_trace
from sandfleet.testing.synth import STUDY_A, rollout_record, write_study

ANALYSIS_CHARTS = ["breakdown", "whatif", "kv-idle", "group-wait"]


def _analyze(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "sandfleet.cli", "analyze", *args], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_analysis_report_of_two_runs(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    a, b = write_study(tmp_path, steps=2, tasks_per_step=2, samples=4)
    _analyze(str(a.parent), str(b.parent), "--html", str(tmp_path / "ab.html"))
    page = check_report(browser, tmp_path / "ab.html", ANALYSIS_CHARTS)
    assert "platform overhead" in page.text.lower()


def test_analysis_report_of_one_run(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    a, _ = write_study(tmp_path, steps=1, tasks_per_step=2, samples=4)
    _analyze(str(a.parent), "--html", str(tmp_path / "a.html"))
    check_report(browser, tmp_path / "a.html", ANALYSIS_CHARTS)


def test_analysis_report_without_model_time(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    """A trace without model spans (as converted Harbor jobs): no what-if chart, the page says
    why, and the other charts are still drawn."""
    seconds = {k: v for k, v in STUDY_A.items() if k != "model"}
    seconds["agent_command"] += STUDY_A["model"]
    recs = [rollout_record("t", i, 1.7e9, {k: v * (1 + i / 10) for k, v in seconds.items()}, turns=2)
            for i in range(4)]
    for r in recs:  # a converted trace carries no model spans at all
        r["spans"] = [s for s in r["spans"] if s["name"] != "model"]
    run = write_trace(tmp_path / "conv", recs).parent
    _analyze(str(run), "--html", str(tmp_path / "conv.html"))
    page = check_report(browser, tmp_path / "conv.html", ["breakdown", "group-wait"])
    assert "whatif" not in page.charts
    assert "not applicable" in page.text.lower()


def test_bench_peers_page(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    """The peers page of a real (short) run of the systems that need nothing but root."""
    import os
    import shutil

    import pytest

    from sandfleet.bench.peers import default_image
    from sandfleet.bench.peers_report import expected_charts

    if os.geteuid() != 0 or not shutil.which("bwrap") or not shutil.which("crun") or default_image() == "host":
        pytest.skip("needs root, bubblewrap, crun and a base image (crun can't run on the host's root)")
    out, html = tmp_path / "peers.json", tmp_path / "peers.html"
    proc = subprocess.run([sys.executable, "-m", "sandfleet", "bench", "peers", "--only", "raw-bwrap,crun",
                           "--image", default_image(), "--rounds", "2", "--rtt", "2", "--out", str(out),
                           "--html", str(html)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    charts = expected_charts(json.loads(out.read_text()))
    assert charts == ["peers-create", "peers-rtt", "peers-cpu", "peers-pss"]
    page = check_report(browser, html, charts)
    assert "raw-bwrap" in page.text and "crun" in page.text
