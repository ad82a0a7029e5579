"""Replay that leaves its sandbox alive (``--stop-before verifier``, ``--until-turn T``: a holder
process keeps it, ``sandbox ls/exec/rm`` reach it, its TTL ends it) and replay on a service
(``--remote``), on a real ``sandfleet serve`` on loopback (issue 45)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.rollout.replay_run import replay_run
from test_replay import EXAMPLES, sandfleet, scripted_run
from test_rollout_support import needs_bwrap

pytestmark = needs_bwrap()


def listed(sid: str, *remote: str) -> dict[str, Any] | None:
    rows = json.loads(sandfleet("sandbox", "ls", "--json", *remote).stdout)
    return next((r for r in rows if r["id"] == sid), None)


def holder_gone(sid: str) -> list[str]:
    from sandfleet.server.testing import leftovers

    return leftovers([sid])


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("live")
    shutil.copytree(EXAMPLES / "csv-awk-aggregate", root / "tasks" / "csv-awk-aggregate")
    sandfleet("run", "--tasks", root / "tasks", "--agent", "oracle", "-n", "1", "--backend", "bwrap",
              "--out", root / "run")
    return root / "run"


def test_stop_before_verifier_leaves_the_sandbox_for_sandbox_exec_until_rm(oracle_run: Path) -> None:
    proc = sandfleet("replay", oracle_run, "--stop-before", "verifier", "--ttl", "300", "--json")
    report = json.loads(proc.stdout)
    (row,) = report["rollouts"]
    assert row["status"] == "identical" and row["scored"] is False and row["verifier"] is None
    assert report["summary"]["keep_ttl_s"] == 300
    sid = row["kept"]["sandbox_id"]
    try:
        meta = listed(sid)
        assert meta is not None and meta["alive"] and not meta["expired"], meta
        # the state the verifier would see: the agent's work, and no tests copied in
        got = sandfleet("sandbox", "exec", sid, "--", "bash", "-c", "head -1 /app/report.csv; ls -A /tests /logs")
        assert got.stdout.startswith("region,orders,units,revenue\n") and "test_outputs.py" not in got.stdout, got
        text = sandfleet("replay", oracle_run, "--stop-before", "verifier", "--ttl", "300").stdout
        other = text.split("sandbox ")[1].split()[0]
        assert f"sandfleet sandbox exec {other} --" in text and "not scored" in text
        sandfleet("sandbox", "rm", other)
    finally:
        sandfleet("sandbox", "rm", sid)
    assert listed(sid) is None and holder_gone(sid) == []


@pytest.mark.slow
@pytest.mark.waits  # 27 s of wall, most of it a TTL, little CPU (scripts/test.sh: a lane of its own)
async def test_until_turn_leaves_the_sandbox_at_that_turn_until_its_ttl(tmp_path: Path) -> None:
    out = await scripted_run(tmp_path, "commands")  # turn 1 date, 2 /tmp/part, 3 /app/out.txt
    t0 = time.monotonic()
    ttl = 25.0  # room for the replay and a `sandbox exec` on a loaded host
    report = await replay_run(out, until_turn=2, keep=True, keep_ttl_s=ttl)
    (row,) = report.rollouts
    assert row["status"] == "identical" and row["commands"] == row["commands_identical"] == 2
    assert row["reward"]["replayed"] is None and row["verifier"] is None
    sid = row["kept"]["sandbox_id"]
    try:
        got = sandfleet("sandbox", "exec", sid, "--", "bash", "-c", "cat /tmp/part; test -e /app/out.txt",
                        check=False)
        assert (got.stdout, got.returncode) == ("hel\n", 1), (got, time.monotonic() - t0)  # turn 2 ran, not 3
        deadline = time.monotonic() + 60
        while listed(sid) is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert listed(sid) is None, f"still listed {time.monotonic() - t0:.1f} s after a TTL of {ttl:g} s"
        assert time.monotonic() - t0 >= ttl - 1  # not before its TTL
        assert holder_gone(sid) == []
        gone = sandfleet("sandbox", "exec", sid, "--", "true", check=False)
        assert gone.returncode == 1 and f"no sandbox {sid!r}" in gone.stderr
    finally:
        sandfleet("sandbox", "rm", sid, check=False)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if importlib.util.find_spec("fastapi") is None:
        pytest.skip("the service needs the server extra (pip install -e '.[server]')")
    from sandfleet.server.testing import running_service

    with running_service(tmp_path_factory.mktemp("service")) as svc:
        yield svc


def test_remote_replays_in_the_services_sandboxes(oracle_run: Path, service: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_TOKEN", service.token)
    proc = sandfleet("replay", oracle_run, "--remote", service.url, "--json")
    report = json.loads(proc.stdout)
    s = report["summary"]
    assert (s["rollouts"], s["identical"], s["same_reward"], s["remote"]) == (1, 1, 1, service.url), report
    text = sandfleet("replay", oracle_run, "--remote", service.url, "--stop-before", "verifier", "--ttl", "120").stdout
    assert f"on the service at {service.url}" in text
    sid = text.split("sandbox ")[1].split()[0]
    remote = ("--remote", service.url)
    try:
        rows = json.loads(sandfleet("sandbox", "ls", "--json", *remote).stdout)
        (mine,) = [r for r in rows if r["id"] == sid]
        assert mine["spec"]["labels"]["task"] == "csv-awk-aggregate" and 0 < mine["expires_in_s"] <= 120
        got = sandfleet("sandbox", "exec", *remote, sid, "--", "head", "-1", "/app/report.csv")
        assert got.stdout == "region,orders,units,revenue\n"
        assert f"sandfleet sandbox exec --remote {service.url} {sid}" in text
    finally:
        sandfleet("sandbox", "rm", *remote, sid)
    assert sid not in [r["id"] for r in json.loads(sandfleet("sandbox", "ls", "--json", *remote).stdout)]
    # a token the service refuses: one line, before anything runs
    monkeypatch.setenv("SANDFLEET_TOKEN", "not-a-token")
    bad = sandfleet("replay", oracle_run, "--remote", service.url, check=False)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "refused" in bad.stderr, bad.stderr


async def test_resume_takes_the_journal_and_refuses_other_options(tmp_path: Path) -> None:
    from sandfleet.errors import ConfigError

    out = await scripted_run(tmp_path, "commands")
    d = tmp_path / "replay"
    first = await replay_run(out, journal_dir=d)
    (row,) = first.rollouts
    lines = (d / "replays.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["rollout_id"] == row["rollout_id"]
    (d / "replays.jsonl").write_text("\n".join(lines) + '\n{"rollout_id": "torn')  # a kill mid-line
    again = await replay_run(out, journal_dir=d, resume=True)
    assert again.summary()["resumed"] == 1 and again.rollouts[0]["status"] == row["status"] == "identical"
    assert len(again.records) == 1 and again.records[0]["rollout_id"] == row["rollout_id"]
    assert (d / "replays.jsonl").read_text().splitlines() == lines  # the torn line cut off
    with pytest.raises(ConfigError, match="written with normalizers"):
        await replay_run(out, journal_dir=d, resume=True, normalizers=("dates",))
    usage = sandfleet("replay", out, "--resume", check=False)
    assert usage.returncode == 2 and "--resume needs --out DIR" in usage.stderr
