"""Bounded stress of a real ``sandfleet serve`` on loopback (slow): 200 concurrent sandboxes
with 10 commands each may cause no error or 5xx, and nothing may be left after them. (The
schemathesis fuzz of /openapi.json: test_service_fuzz.py.)"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                       reason="the service needs the server extra (pip install -e '.[server]')"),
]

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.client import connect
    from sandfleet.sandbox import state
    from sandfleet.server.testing import leftovers, running_service

SANDBOXES = 200
EXECS = 10


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or (name.endswith("}") and line.startswith(name)):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def owned_by(pid: int) -> list[str]:
    """Ids of the sandbox markers on this host whose owner is process ``pid``."""
    return [str(m["id"]) for m in state.list_sandboxes() if m.get("owner_pid") == pid]


async def test_load_200_sandboxes_10_execs_each(tmp_path: Path) -> None:
    with running_service(tmp_path, args=["--max-sandboxes", str(SANDBOXES)]) as svc:
        async with await connect(svc.url, svc.token, deadline_s=600) as c:

            async def one(i: int) -> str:
                async with await c.create_sandbox(ttl_s=900, labels={"load": "1"}) as sb:
                    for k in range(EXECS):
                        r = await sb.exec(["sh", "-c", f"echo {i}-{k}"])
                        assert (r.exit_code, r.stdout) == (0, f"{i}-{k}\n")
                    return sb.id

            async with asyncio.timeout(900):
                results = await asyncio.gather(*(one(i) for i in range(SANDBOXES)), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            assert errors == [], f"{len(errors)} failed, first: {errors[:1]!r}"
            ids = [str(r) for r in results]
            assert len(set(ids)) == SANDBOXES
            text = await c.metrics()
            assert metric(text, "sandfleet_sandboxes") == 0
            assert metric(text, "sandfleet_exec_seconds_count") == SANDBOXES * EXECS
            assert metric(text, "sandfleet_close_failures_total") == 0
            assert await c.find() == []
        assert owned_by(svc.proc.pid) == []
    assert leftovers(ids) == []


def test_bench_service_reports_every_figure() -> None:
    from click.testing import CliRunner

    from sandfleet.cli import cli

    r = CliRunner().invoke(cli, ["bench", "service", "-n", "3", "--rtt-n", "20", "--concurrency", "4",
                                 "--seconds", "0.5", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    figures = json.loads(r.stdout)
    for key in ("create_exec_close_p50_ms_remote", "create_exec_close_p50_ms_local", "create_exec_close_ratio",
                "exec_rtt_p50_ms_remote", "exec_rtt_p50_ms_local", "execs_per_s_4_remote", "execs_per_s_4_local",
                "fusion_run_code_p50_ms_c1", "v1_oneshot_p50_ms_c1", "fusion_run_code_p50_ms_c4",
                "v1_oneshot_p50_ms_c4"):
        assert figures[key] > 0, key
    assert isinstance(figures["exec_rtt_goal_met"], bool) and figures["provenance"]["config"]["bench"] == "service"
