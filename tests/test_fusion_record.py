"""verl's record (issue 45): a ``sandfleet serve`` started with SANDFLEET_RECORD_DIR records each
SandboxFusion ``run_code`` call (verl's only route into sandfleet), and ``sandfleet replay`` runs
the calls again and compares them; a record edited afterwards is refused."""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from sandfleet.cli import cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                                reason="the service needs the server extra (pip install -e '.[server]')")


def call(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_run_code_calls_are_recorded_and_replayed(tmp_path: Path) -> None:
    from sandfleet.server.testing import running_service

    rec = tmp_path / "verl-run"
    with running_service(tmp_path / "svc", env={"SANDFLEET_RECORD_DIR": str(rec)}) as svc:
        url = f"{svc.url}/sandbox-fusion/{svc.token}/run_code"
        right = call(url, {"code": "n = int(input())\nprint(sum(range(n + 1)))\n", "language": "python",
                           "stdin": "10", "run_timeout": 20})
        crash = call(url, {"code": "import sys\nprint('half')\nsys.exit(3)\n", "language": "python"})
        files = call(url, {"code": "cat data/in.txt | tr a-z A-Z > out.txt; cat out.txt", "language": "bash",
                           "files": {"data/in.txt": base64.b64encode(b"abc\n").decode()},
                           "fetch_files": ["out.txt"]})
        chance = call(url, {"code": "import random\nprint(random.random())\n", "language": "python"})
        call(url, {"code": "print(1)", "language": "python", "memory_limit_MB": 256})
    assert right["status"] == "Success" and crash["status"] == "Failed" and files["files"]
    assert chance["status"] == "Success"
    lines = [json.loads(x) for x in (rec / "records.jsonl").read_text().splitlines()]
    assert len(lines) == 5 and all(r["kind"] == "sandbox-fusion" for r in lines)
    first = lines[0]
    assert first["request"]["stdin"] == "10" and "sum(range(n + 1))" in first["request"]["code"]
    assert first["program"]["run"] == ["python3", "main.py"] and first["result"]["status"] == "Success"
    assert first["commands"][0]["exit_code"] == 0 and first["commands"][0]["output"] == "55\n"
    assert lines[1]["commands"][0]["exit_code"] == 3 and lines[1]["result"]["status"] == "Failed"
    assert lines[2]["request"]["files"] == {"data/in.txt": base64.b64encode(b"abc\n").decode()}
    assert lines[4]["spec"]["limits"]["memory_mib"] == 256
    ids = [str(r["rollout_id"]) for r in lines]

    # replay: each call run again in a fresh sandbox, no service; the random one drifts
    done = CliRunner().invoke(cli, ["replay", str(rec), "--json"])
    assert done.exit_code == 0, done.output
    got = json.loads(done.stdout)
    assert got["summary"]["rollouts"] == 5 and got["summary"]["same_reward"] == 5, got["summary"]
    assert got["summary"]["identical"] == 4 and got["summary"]["drifted"] == 1
    rows = {r["rollout_id"]: r for r in got["rollouts"]}
    assert rows[ids[3]]["status"] == "drifted" and rows[ids[3]]["command_rows"][0]["exit_code"] == "same"
    assert rows[ids[1]]["reward"] == {"recorded": "Failed", "replayed": "Failed"}
    assert rows[ids[0]]["commands_identical"] == 1 and rows[ids[0]]["task"] == "run_code:python"

    # one call alone, into --out: its own records.jsonl is a record of the same kind
    out = tmp_path / "again"
    done = CliRunner().invoke(cli, ["replay", str(rec), "--rollout", ids[2], "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "identical" in done.output and "1/1 commands identical" in done.output
    (again,) = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert again["kind"] == "sandbox-fusion" and again["result"]["status"] == "Success"

    # an edited record (other code) is refused before anything runs, naming what changed
    lines[0]["request"]["code"] = "print(55)\n"
    (rec / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    done = CliRunner().invoke(cli, ["replay", str(rec), "--rollout", ids[0], "--json"])
    assert done.exit_code == 1
    got = json.loads(done.stdout)
    assert got["summary"]["refused"] == 1 and got["rollouts"] == []
    assert "the record's request was changed after recording" in got["refused"][0]["why"]
    done = CliRunner().invoke(cli, ["replay", str(rec), "--rollout", ids[1], "--stop-before", "verifier", "--json"])
    assert done.exit_code == 1 and "no agent turns and no verifier" in done.stdout
