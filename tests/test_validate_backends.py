"""``sandfleet tasks validate --backends``: each oracle on every backend asked for, and the
tasks whose oracle reward differs between them (issue 42)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import backend_skip
from sandfleet.cli import cli
from sandfleet.cli.validate_backends import differing
from sandfleet.rollout.validate import Verdict
from test_rollout_support import make_task, needs_bwrap

# gVisor says its kernel is 4.4.0: this task's tests refuse to pass there, whatever the agent did
KERNEL_BOUND = """#!/bin/bash
mkdir -p /logs/verifier
uname -r
case "$(uname -r)" in
  4.4.0*) echo 0 > /logs/verifier/reward.txt ;;
  *) if [ "$(cat /app/out.txt 2>/dev/null)" = hello ]; then echo 1 > /logs/verifier/reward.txt
     else echo 0 > /logs/verifier/reward.txt; fi ;;
esac
"""


def test_differing_compares_how_often_the_oracle_passed() -> None:
    per = {"bwrap": {"a": Verdict("valid", "", [1.0, 1.0]), "b": Verdict("valid", "", [1.0, 1.0])},
           "gvisor": {"a": Verdict("invalid", "", [0.0, 1.0]), "b": Verdict("valid", "", [1.0, 1.0])}}
    assert differing(per) == {"a": {"bwrap": [1.0, 1.0], "gvisor": [0.0, 1.0]}}
    per["gvisor"]["a"] = Verdict("invalid", "", [None, 1.0])  # masked counts as not passed
    assert list(differing(per)) == ["a"]


def test_backends_refusals(tmp_path: Path) -> None:
    for args, message in ((["--backends", "bwrap,nosuch"], "unknown backend(s) nosuch"),
                          (["--backends", "all", "--backend", "bwrap"], "--backends excludes --backend"),
                          (["--backends", "all", "--under-load"], "--backends excludes")):
        result = CliRunner().invoke(cli, ["tasks", "validate", str(tmp_path), *args])
        assert result.exit_code == 2 and message in result.output, result.output


@needs_bwrap()
@pytest.mark.slow
def test_backends_report_the_task_whose_oracle_differs(tmp_path: Path) -> None:
    why = backend_skip("gvisor")
    if why:
        pytest.skip(why)
    suite = tmp_path / "suite"
    make_task(suite, "same")
    make_task(suite, "kernel-bound", test_sh=KERNEL_BOUND)
    report = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["tasks", "validate", str(suite), "-r", "1", "--backends", "bwrap,gvisor",
                                      "--report", str(report)])
    assert result.exit_code == 1, result.output
    data = json.loads(report.read_text())
    assert data["backends"] == ["bwrap", "gvisor"] and data["unavailable"] == {}
    assert data["differs"] == {"kernel-bound": {"bwrap": [1.0], "gvisor": [0.0]}}
    assert data["per_backend"]["bwrap"]["same"]["status"] == "valid"
    assert data["per_backend"]["gvisor"]["same"]["status"] == "valid"
    assert "kernel-bound" in result.stdout and "DIFFERS" in result.stdout
    assert "1 task(s) whose oracle reward differs between bwrap, gvisor: kernel-bound" in result.stdout
