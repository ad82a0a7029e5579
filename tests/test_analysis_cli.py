"""``sandfleet analyze`` end to end: tables, JSON, the HTML report and bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandfleet.analysis.trace import write_trace
from sandfleet.cli import cli
from sandfleet.cli.analyze import analyze, table
from sandfleet.testing.synth import rollout_record, write_study


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    a, b = write_study(tmp_path / "runs", steps=2)
    return a.parent, b.parent


def test_two_runs_print_aligned_tables(runs: tuple[Path, Path]) -> None:
    res = CliRunner().invoke(cli, ["analyze", str(runs[0]), str(runs[1])])
    assert res.exit_code == 0, res.output
    out = res.output
    for heading in (
        "Breakdown per span",
        "Platform overhead",
        "B - A (same 8 tasks",
        "What if inference",
        "KV cache and GRPO groups",
        "Staleness",
        "training can step",
    ):
        assert heading in out
    iv = r"\[-?\d+\.\d, -?\d+\.\d\]"
    assert re.search(rf"^total\s+442\.0\s+495\.0\s+53\.0 s\s+{iv}\s+12\.0 %\s+{iv}$", out, re.M)
    assert re.search(r"^A\s+20\.0\s+4\.5 %\s+0\.500\s+n/a$", out, re.M)  # platform overhead: 20 s of 442 s
    assert re.search(r"^32\s+119\.4\s+168\.5\s+41\.1 %$", out, re.M)


def test_json_has_the_required_keys(runs: tuple[Path, Path]) -> None:
    res = CliRunner().invoke(
        analyze,
        [
            str(runs[0]),
            str(runs[1] / "trace.jsonl"),
            "--json",
            "--whatif",
            "1,8",
            "--step-time",
            "300",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    for key in (
        "spans_mean_s",
        "whatif",
        "kv_idle_fraction",
        "kv_idle_fraction_through_reward",
        "group_wait_fraction",
        "platform_overhead_s",
        "platform_overhead_fraction",
        "gap_definition",
        "staleness",
        "provenance",
    ):
        assert key in data
    assert data["whatif_not_applicable"] is None
    assert set(data["whatif"]) == {"1", "8"}
    assert data["whatif"]["8"] == pytest.approx(0.329, abs=0.005)
    assert data["staleness"]["step_time_s"] == 300
    assert data["spans_mean_s"]["B"]["agent_command"] == pytest.approx(69.0)


def test_one_run_whatif_maps_k_to_mean_time(runs: tuple[Path, Path]) -> None:
    res = CliRunner().invoke(analyze, [str(runs[0]), "--json", "--whatif", "1,333"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["whatif"] == {"1": pytest.approx(442.0), "333": pytest.approx(110.0)}
    assert "compare" not in data and "training_faster_pct" not in data["staleness"]


@pytest.mark.parametrize("two", [True, False])
def test_html_report_has_the_four_charts(runs: tuple[Path, Path], tmp_path: Path, two: bool) -> None:
    out = tmp_path / "report" / "index.html"
    args = [str(runs[0]), *([str(runs[1])] if two else []), "--html", str(out)]
    res = CliRunner().invoke(analyze, args)
    assert res.exit_code == 0, res.output
    html = out.read_text()
    assert html.startswith("<!doctype html>") and html.rstrip().endswith("</html>")
    charts = re.findall(r'<figure class="chart" data-chart="([^"]+)">', html)
    assert charts == ["breakdown", "whatif", "kv-idle", "group-wait"]
    assert html.count("<svg ") == html.count("</svg>") == 4
    # self-contained: no scripts, no links out (the SVG namespaces are names, not fetched)
    assert "<script" not in html and "<link rel='stylesheet'" not in html and "@import" not in html
    urls = set(re.findall(r"""(?:https?:)?//[^\s"'<>)]+""", html))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    ids = re.findall(r'\sid="([^"]+)"', html)
    assert len(ids) == len(set(ids))  # four SVGs in one page: no id twice
    for ref in set(re.findall(r"url\(#([^)]+)\)", html)):
        assert ref in ids
    assert "Platform overhead" in html and "Provenance" in html
    assert ("interval s" in html) == two


def test_matplotlib_is_not_loaded_by_the_cli() -> None:
    code = (
        "import sys, sandfleet.analysis, sandfleet.cli.analyze, sandfleet.analysis.html; "
        "sys.exit('matplotlib' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_runs_over_different_tasks_are_refused(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a", [rollout_record(t, 0, 0, {"model": 1.0}) for t in ("x", "y")])
    b = write_trace(tmp_path / "b", [rollout_record(t, 0, 0, {"model": 1.0}) for t in ("x", "z")])
    res = CliRunner().invoke(analyze, [str(a.parent), str(b.parent)])
    assert res.exit_code == 2
    assert res.output.startswith("error: ") and "only in A (1): y; only in B (1): z" in res.output


def _invoke_bad(path: Path) -> tuple[int, str]:
    res = CliRunner().invoke(analyze, [str(path)])
    return res.exit_code, res.output


def test_missing_trace_is_a_clear_error(tmp_path: Path) -> None:
    code, out = _invoke_bad(tmp_path / "nope")
    assert code == 2
    assert out.startswith("error: ") and "nope" in out and "no such trace file" in out


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"trace\.jsonl:2: not JSON"),
        (
            '{"start": 0, "end": 1, "spans": [{"name": "nap", "start": 0, "end": 1}]}',
            r"trace\.jsonl:2: span 0: unknown span name 'nap'",
        ),
        (
            '{"start": 0, "end": 1, "spans": [{"name": "model", "start": 1, "end": 0.5}]}',
            r"trace\.jsonl:2: span 0 \(model\): end 0\.5 is before start 1",
        ),
        (
            '{"start": 0, "end": 1, "spans": [{"name": "model", "start": 0, "end": 1}], '
            '"status": "done"}',
            r"trace\.jsonl:2: unknown status 'done'",
        ),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    good = '{"start": 0, "end": 1, "spans": [{"name": "model", "start": 0, "end": 1}]}'
    (tmp_path / "trace.jsonl").write_text(good + "\n" + line + "\n")
    code, out = _invoke_bad(tmp_path)
    assert code == 2
    assert re.search(message, out), out


def test_bad_options(runs: tuple[Path, Path]) -> None:
    res = CliRunner().invoke(analyze, [str(runs[0]), "--whatif", "1,0"])
    assert res.exit_code == 2 and "positive" in res.output
    res = CliRunner().invoke(analyze, [str(runs[0]), "--staleness-bound", "0"])
    assert res.exit_code == 2 and "error: staleness bound must be positive" in res.output
    res = CliRunner().invoke(analyze, [str(runs[0]), str(runs[0]), str(runs[1])])
    assert res.exit_code == 2


def test_table_aligns_columns() -> None:
    text = table(["name", "value"], [["a", "1.0"], ["longer", "10.25"]])
    lines = text.splitlines()
    assert lines[0] == "name    value"
    assert lines[2] == "a         1.0"
    assert lines[3] == "longer  10.25"
