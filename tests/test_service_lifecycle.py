"""The service's lifecycle against a real ``sandfleet serve``: admission (fair queue, 429 with
Retry-After, quota), SIGTERM drains, and a SIGKILLed service restarted (leftovers reaped,
clients get 410)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandfleet.errors import SandboxDiedError, ServiceBusyError, ServiceError
from support import running, until

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                                reason="the service needs the server extra (pip install -e '.[server]')")

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.client import connect
    from sandfleet.server.admission import AdmissionRejected, Gate
    from sandfleet.server.testing import leftovers, start_service


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


async def test_gate_takes_turns_by_owner() -> None:
    gate = Gate("busy", 1)
    order: list[str] = []
    far = time.monotonic() + 10

    async def take(owner: str, name: str) -> None:
        await gate.acquire(owner, far)
        order.append(name)
        await asyncio.sleep(0.01)
        gate.release()

    tasks = [asyncio.create_task(take("a", f"a{i}")) for i in range(4)]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(take("b", "b0")))
    await asyncio.gather(*tasks)
    assert order.index("b0") < order.index("a2")  # b is not starved behind all of a's queue
    with pytest.raises(AdmissionRejected) as err:
        gate.in_use = 1
        await gate.acquire("a", time.monotonic() + 0.05)
    assert err.value.retry_after >= 1


def test_default_limits_follow_the_rule(tmp_path: Path) -> None:
    import json
    import os

    from sandfleet.errors import ConfigError
    from sandfleet.server.admission import BUSY_MIB, IDLE_MIB, host_limits, mem_available_mib

    lim = host_limits()
    assert lim.max_busy == os.cpu_count()
    by_mem = int((mem_available_mib() * 0.9 - lim.max_busy * BUSY_MIB) / IDLE_MIB)
    assert lim.max_sandboxes <= by_mem + 64 and "MemAvailable" in lim.basis  # (memory moves a little meanwhile)
    result = tmp_path / "host.json"
    result.write_text(json.dumps({"capacity": {"target": 1.5, "sandboxes": 3.0, "per_thread": 1.5}}))
    assert host_limits(capacity_from=result).max_busy == 3
    result.write_text(json.dumps({"capacity": {"target": 1.5, "sandboxes": 0.0}}))
    with pytest.raises(ConfigError, match="give --max-busy"):
        host_limits(capacity_from=result)
    assert host_limits(max_sandboxes=5, max_busy=2).max_sandboxes == 5


async def test_admission_queues_then_429_and_quota(tmp_path: Path) -> None:
    svc = start_service(tmp_path, args=["--max-busy", "1", "--max-sandboxes", "3", "--quota", "2"])
    a_id = b_id = ""
    try:
        async with await connect(svc.url, svc.tokens[0]) as a, await connect(svc.url, svc.tokens[1]) as b, \
                httpx.AsyncClient(base_url=svc.url, headers=bearer(svc.tokens[0]), timeout=60) as h:
            sb = await a.create_sandbox(ttl_s=120)
            a_id = sb.id
            hold = asyncio.create_task(sb.exec("sleep 1.5; echo held"))
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            r = await h.post(f"/v1/sandboxes/{sb.id}/exec", json={"cmd": ["true"]}, headers={"X-Deadline-Ms": "100"})
            assert (r.status_code, r.json()["code"]) == (429, "busy") and int(r.headers["retry-after"]) >= 1
            assert time.monotonic() - t0 < 1.0
            queued = await sb.exec("echo queued")  # the default deadline (30 s) outlasts the holder
            assert queued.stdout == "queued\n" and (await hold).stdout == "held\n"

            await a.create_sandbox(ttl_s=120)  # a holds 2: its quota
            with pytest.raises(ServiceBusyError) as q:
                await a.create_sandbox(ttl_s=120)
            assert q.value.code == "quota_exceeded"
            kept = await b.create_sandbox(ttl_s=120)  # 3 live: --max-sandboxes
            b_id = kept.id
            b.deadline_s = 0.2
            with pytest.raises(ServiceBusyError) as busy:
                await b.create_sandbox(ttl_s=120)
            assert busy.value.code == "busy" and busy.value.retry_after
            b.deadline_s = 20
            waiting = asyncio.create_task(b.create_sandbox(ttl_s=120))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await sb.close()  # a slot frees: the waiter gets it
            second = await waiting
            text = await a.metrics()
            assert metric(text, 'sandfleet_admissions_rejected_total{gate="busy"}') == 1
            assert metric(text, 'sandfleet_admissions_rejected_total{gate="sandboxes"}') == 1
            assert metric(text, 'sandfleet_admissions_rejected_total{gate="quota"}') == 1
            assert metric(text, 'sandfleet_admissions_queued_total{gate="busy"}') >= 2
            assert metric(text, 'sandfleet_admissions_queued_total{gate="sandboxes"}') >= 2
            assert metric(text, "sandfleet_sandboxes") == 3
            await second.close()
            await kept.close()
            await a.delete_where()
    finally:
        assert svc.stop() == 0
    assert leftovers([a_id, b_id]) == []


@contextlib.asynccontextmanager
async def one_slot(tmp_path: Path, ttl_s: float) -> AsyncIterator[tuple[Any, Any]]:
    """(client, sandbox) of a service with one busy slot (--max-busy 1) and a 0.5-s default
    deadline; the sandbox closed, the service stopped and nothing of it left after."""
    svc = start_service(tmp_path, args=["--max-busy", "1", "--deadline", "0.5"])
    sid = ""
    try:
        async with await connect(svc.url, svc.token) as c:
            sb = await c.create_sandbox(ttl_s=ttl_s)
            sid = sb.id
            yield c, sb
            await sb.close()
    finally:
        assert svc.stop() == 0
    assert leftovers([sid]) == []


async def test_a_command_waits_for_a_busy_slot_as_long_as_it_may_run(tmp_path: Path) -> None:
    """A host at its --max-busy delays a command instead of failing it: the client that gave no
    deadline of its own asks the service to queue the command as long as its sandbox lives, so
    a service whose default deadline (--deadline 0.5) is shorter than the holder's command still
    runs it (before, a 429: ServiceBusyError, which a rollout takes for an infra fault and masks);
    so do a file's write and an upload, for most of their read timeout. A client that gave a
    deadline still gets its 429 when it passes."""
    async with one_slot(tmp_path, ttl_s=120) as (c, sb):
        hold = asyncio.create_task(sb.exec("sleep 2; echo held", timeout=30))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        queued = await sb.exec("echo queued", timeout=30)
        assert queued.stdout == "queued\n" and time.monotonic() - t0 > 1.0
        assert (await hold).stdout == "held\n"
        hold = asyncio.create_task(sb.exec("sleep 2", timeout=30))  # and a file's write, an upload
        await asyncio.sleep(0.3)
        await sb.write_file("/tmp/queued.txt", b"q")
        await sb.upload(__file__, "/tmp")
        assert await sb.read_file("/tmp/queued.txt") == b"q"
        await hold
        c.deadline_s = 0.2
        hold = asyncio.create_task(sb.exec("sleep 2", timeout=30))
        await asyncio.sleep(0.3)
        with pytest.raises(ServiceBusyError) as busy:
            await sb.exec("true", timeout=30)
        assert busy.value.code == "busy"
        await hold


@pytest.mark.slow
@pytest.mark.waits  # 41 s of wall behind a 40-s command, little CPU (scripts/test.sh: a lane of its own)
async def test_a_short_command_waits_behind_a_longer_one_for_as_long_as_the_sandbox_lives(tmp_path: Path) -> None:
    """How long a busy slot stays taken is the other command's business: a command with a 1-s
    timeout behind a 40-s one still runs (it queues for as long as its sandbox has left to live).
    Before, it queued for its own run time plus the client's grace (31 s) and got a 429, which a
    verifier through the service took for an infra fault: round IX's rows masked (issue 41)."""
    async with one_slot(tmp_path, ttl_s=300) as (_, sb):
        hold = asyncio.create_task(sb.exec("sleep 40; echo held", timeout=60))
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        short = await sb.exec("echo short", timeout=1)
        assert short.stdout == "short\n" and time.monotonic() - t0 > 35
        assert (await hold).stdout == "held\n"


async def test_sigterm_drains(tmp_path: Path) -> None:
    svc = start_service(tmp_path, args=["--drain-grace", "3"])
    tag = f"300.{uuid.uuid4().int % 10**9}"
    async with await connect(svc.url, svc.token) as c:
        sb = await c.create_sandbox(ttl_s=300)
        short = asyncio.create_task(sb.exec("sleep 1; echo finished"))
        long = asyncio.create_task(sb.exec(f"sleep {tag}"))
        await until(lambda: running(tag))
        t0 = time.monotonic()
        svc.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        with pytest.raises(ServiceError):  # draining: 503, or no longer listening
            await c.create_sandbox(ttl_s=60)
        assert (await short).stdout == "finished\n"  # within the grace
        with pytest.raises(SandboxDiedError):
            await long  # past the grace: killed, the connection closed
        assert svc.proc.wait(30) == 0 and svc.stop() == 0
        assert time.monotonic() - t0 < 15
    assert not running(tag)
    assert leftovers([sb.id]) == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_restart_after_sigkill_reaps_and_answers_410(tmp_path: Path) -> None:
    port = free_port()
    args = ["--state-dir", str(tmp_path / "journal")]
    svc = start_service(tmp_path / "one", args=args, port=port)
    tag = f"300.{uuid.uuid4().int % 10**9}"
    async with await connect(svc.url, svc.tokens[0]) as c:
        boxes = [await c.create_sandbox(ttl_s=300) for _ in range(3)]
        ids = [b.id for b in boxes]
        busy = asyncio.create_task(boxes[0].exec(f"sleep {tag}"))
        await until(lambda: running(tag))
        svc.kill()
        with pytest.raises(SandboxDiedError):  # mid-command: the service went away
            await busy
        two = tmp_path / "two"
        two.mkdir()
        (tmp_path / "one" / "tokens").replace(two / "tokens")  # the same tokens, the same port
        svc2 = start_service(two, port=port, args=args, tokens=svc.tokens)
        try:
            assert svc2.url == svc.url
            assert "3 sandbox ids of the last run now answer 410" in svc2.log
            await until(lambda: leftovers(ids) == [], timeout=10)  # reaped at start (or by any sandfleet)
            assert not running(tag)
            for b in boxes:  # the same client, the same objects: 410 sandbox_lost
                with pytest.raises(SandboxDiedError, match="lost when the service restarted"):
                    await b.exec("true")
            async with httpx.AsyncClient(base_url=svc2.url, timeout=30) as h:
                r = await h.get(f"/v1/sandboxes/{ids[1]}", headers=bearer(svc.tokens[0]))
                assert (r.status_code, r.json()["code"]) == (410, "sandbox_lost")
                r = await h.get(f"/v1/sandboxes/{ids[1]}", headers=bearer(svc.tokens[1]))
                assert r.status_code == 404  # not the other token's to know about
                text = (await h.get("/metrics", headers=bearer(svc.tokens[0]))).text
                assert metric(text, "sandfleet_sandboxes") == 0
            async with await c.create_sandbox(ttl_s=60) as fresh:
                assert (await fresh.exec("echo ok")).stdout == "ok\n"
            for b in boxes:
                await b.close()  # closing a lost sandbox is fine
        finally:
            assert svc2.stop() == 0
