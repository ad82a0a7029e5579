"""One typed report, three renderers: the text, the JSON and the HTML of ``sandfleet analyze``
show the same numbers.

Each renderer reads only the :class:`~sandfleet.analysis.schema.Report`, and the JSON holds
all of it: the report read back from the printed JSON renders the very text that was
printed (and the same HTML). Checked on two real runs (bwrap sandboxes, the scripted model
server: model spans, so every figure has a value), and without the HTML on the synthetic
study traces (the quick tier).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandfleet.analysis.fmt import interval, num, pct
from sandfleet.analysis.html import render
from sandfleet.analysis.report import build_report
from sandfleet.analysis.schema import Report
from sandfleet.analysis.text import render_text
from sandfleet.analysis.trace import load_run
from sandfleet.cli import cli
from sandfleet.testing.fake_server import FakeModelServer
from sandfleet.testing.synth import write_study
from test_rollout_support import make_task, needs_bwrap

SCRIPT = [{"bash": "echo hello > /app/out.txt", "delay_s": 0.05}, {"bash": "cat /app/out.txt"}, "Done."]


def _analyze(*args: str) -> str:
    res = CliRunner().invoke(cli, ["analyze", *args])
    assert res.exit_code == 0, res.output
    return res.output


def _same_svg_ids(html: str) -> str:
    """matplotlib names clip paths and markers by a hash that differs per render."""
    return re.sub(r"-[pm][0-9a-f]{10}\b", "-ID", html)


def _rows(text: str, heading: str) -> dict[str, list[str]]:
    """The body rows of the table under ``heading`` in the text output, by first cell."""
    block = text.split(heading, 1)[1].split("\n\n", 1)[0].splitlines()[3:]  # heading line, header, rule
    return {cells[0]: cells[1:] for line in block if (cells := re.split(r"\s{2,}", line.strip()))}


def _check_renderers_agree(args: list[str], tmp_path: Path, *, html: bool = True) -> dict:
    """``html=False``: text and JSON only (the HTML's charts cost seconds of matplotlib)."""
    text = _analyze(*args)
    page = tmp_path / "report.html"
    data = json.loads(_analyze(*args, "--json", *(["--html", str(page)] if html else [])))  # one report
    report = Report.from_json(data)
    assert report.to_json() == data  # the JSON is the whole report
    assert render_text(report) + "\n" == text  # the text shows nothing the JSON does not hold
    if html:
        assert _same_svg_ids(render(report)) == _same_svg_ids(page.read_text())
    # and the numbers read the same, figure by figure
    labs = list(data["runs"])
    spans = _rows(text, "Breakdown per span")
    for col in data["spans"]["A"]:
        assert spans[col] == [num(data["spans"][lab][col][m]) for lab in labs for m in ("mean", "median", "p90")]
    platform = _rows(text, "Platform overhead")
    for lab in labs:
        overhead = [num(data["platform_overhead_s"][lab]), pct(data["platform_overhead_fraction"][lab])]
        assert platform[lab][:2] == overhead
    kv = _rows(text, "KV cache and GRPO groups")
    for lab in labs:
        assert kv[lab] == [pct(data[k][lab]) for k in ("kv_idle_fraction", "kv_idle_fraction_through_reward",
                                                       "group_wait_fraction")]
    if data["whatif_detail"] is not None:
        whatif = _rows(text, "What if inference")
        for k, d in data["whatif_detail"].items():
            assert whatif[k] == [num(d[lab]) for lab in labs] + ([pct(d["gap"])] if len(labs) == 2 else [])
    if "compare" in data:
        compare = _rows(text, "B - A (same")
        for col, d in data["compare"]["spans"].items():
            assert compare[col] == [num(d["a"]), num(d["b"]), num(d["delta_s"], suffix=" s"),
                                    interval(d["delta_s_ci90"]), num(d["delta_pct"], suffix=" %"),
                                    interval(d["delta_pct_ci90"])]
    return data


@needs_bwrap()
def test_renderers_agree_on_real_runs(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    for name in ("hello-a", "hello-b"):
        make_task(tasks, name)
    with FakeModelServer(SCRIPT) as server:
        for run in ("A", "B"):
            res = CliRunner().invoke(cli, ["run", "--tasks", str(tasks), "--agent", "openai", "--model-url", server.url,
                                           "--model", "fake-model", "-n", "2", "--concurrency", "2",
                                           "--backend", "bwrap", "--out", str(tmp_path / run)])
            assert res.exit_code == 0, res.output
    for run in ("A", "B"):
        assert len(load_run(tmp_path / run).completed) == 4
    data = _check_renderers_agree([str(tmp_path / "A"), str(tmp_path / "B")], tmp_path)
    assert data["compare"]["tasks"] == 2 and data["whatif_not_applicable"] is None
    assert all(v is not None for v in data["kv_idle_fraction"].values())  # real model spans with token counts
    one = _check_renderers_agree([str(tmp_path / "A")], tmp_path)
    assert "compare" not in one and set(one["whatif_detail"]["1"]) == {"A"}


@pytest.mark.parametrize("two", [True, False])
def test_renderers_agree_on_the_study(tmp_path: Path, two: bool) -> None:
    a, b = write_study(tmp_path / "runs", steps=2)
    data = _check_renderers_agree([str(a.parent), *([str(b.parent)] if two else [])], tmp_path, html=False)
    assert ("compare" in data) == two and ("training_faster_pct" in data["staleness"]) == two


def test_a_report_refuses_a_figure_it_does_not_know(tmp_path: Path) -> None:
    a, _ = write_study(tmp_path / "runs", steps=1)
    data = build_report([load_run(a)]).to_json()
    data["runs"]["A"]["pass_rte"] = 1.0  # a typo in a hand-edited or foreign JSON is refused, not dropped
    with pytest.raises(ValueError, match="pass_rte"):
        Report.from_json(data)
