"""``--remote URL`` on the command line: the same commands, their sandboxes on a real
``sandfleet serve`` on loopback (the token in SANDFLEET_TOKEN)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from sandfleet.cli import cli
from test_rollout_support import make_task, needs_bwrap

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                                reason="the service needs the server extra (pip install -e '.[server]')")

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.server.testing import RunningService, leftovers


@pytest.fixture(scope="module")
def svc(running_services: Any) -> RunningService:
    """The session's shared service, with two tokens of this module's own (tests/conftest.py)."""
    return running_services.view()


def created(svc: RunningService) -> float:
    """How many sandboxes the service has created so far."""
    text = httpx.get(svc.url + "/metrics", headers={"Authorization": f"Bearer {svc.token}"}, timeout=30).text
    return float(next(line for line in text.splitlines() if line.startswith("sandfleet_create_seconds_count")
                      ).split()[1])


def sandfleet(svc: RunningService, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), env={"SANDFLEET_TOKEN": svc.token}, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def test_sandbox_commands(svc: RunningService) -> None:
    code, out, err = sandfleet(svc, "sandbox", "run", "--remote", svc.url, "--ttl", "60", "--",
                               "sh", "-c", "echo hi; echo oops >&2; exit 3")
    assert (code, out, err) == (3, "hi\n", "oops\n")
    code, out, _ = sandfleet(svc, "sandbox", "run", "--remote", svc.url, "--timeout", "0.3", "--", "sleep", "9")
    assert code == 124
    code, sid, _ = sandfleet(svc, "sandbox", "create", "--remote", svc.url, "--ttl", "120")
    sid = sid.strip()
    assert code == 0 and sid.startswith("sf-")
    assert sandfleet(svc, "sandbox", "exec", "--remote", svc.url, sid, "--", "sh", "-c", "echo $((6*7))")[:2] == \
        (0, "42\n")
    code, out, _ = sandfleet(svc, "sandbox", "ls", "--remote", svc.url, "--json")
    assert [m["id"] for m in json.loads(out)] == [sid]
    assert sandfleet(svc, "sandbox", "rm", "--remote", svc.url, sid)[:2] == (0, f"removed {sid}\n")
    code, out, _ = sandfleet(svc, "sandbox", "exec", "--remote", svc.url, sid, "--", "true")
    assert code != 0 and "deleted" in out + _
    assert leftovers([sid]) == []
    r = CliRunner().invoke(cli, ["sandbox", "run", "--remote", svc.url, "--", "true"], env={"SANDFLEET_TOKEN": ""})
    assert r.exit_code != 0 and "SANDFLEET_TOKEN" in r.output
    r = CliRunner().invoke(cli, ["sandbox", "run", "--remote", svc.url, "--", "true"],
                           env={"SANDFLEET_TOKEN": "w" * 30})
    assert r.exit_code != 0 and "Bearer" in r.output


@pytest.mark.slow
@needs_bwrap()
def test_run_and_bench_micro(svc: RunningService, tmp_path: Path) -> None:
    make_task(tmp_path / "suite", "hello")
    before = created(svc)
    out = tmp_path / "run"
    code, stdout, err = sandfleet(svc, "run", "--remote", svc.url, "--tasks", str(tmp_path / "suite"),
                                  "--image", "host", "-n", "2", "--concurrency", "2", "--out", str(out))
    assert code == 0, stdout + err
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rollouts] == [1.0, 1.0]
    assert created(svc) - before == 2  # made by the service
    code, stdout, err = sandfleet(svc, "tasks", "validate", "--remote", svc.url, str(tmp_path / "suite"), "-r", "1",
                                  "--json", "--report", str(tmp_path / "v.json"))
    assert code == 0, stdout + err
    assert json.loads(stdout)["hello"]["status"] == "valid"
    assert created(svc) - before == 4  # the oracle's and the no-op agent's
    code, stdout, err = sandfleet(svc, "bench", "micro", "--remote", svc.url, "-n", "3", "--idle", "4", "--json")
    assert code == 0, err
    figures = json.loads(stdout)
    assert figures["backend"] == "bwrap" and figures["create_exec_close_p50_ms"] > 0
    assert figures["exec_per_s_64"] > 0
