"""Chaos: each fault injected into a real run with real sandboxes (bwrap, a task image built
here, a scripted model server on loopback). Each test asserts the verdict the fault earns
(docs/rollouts.md), that no result is lost or counted twice, and that nothing leaks
(processes, zombies, mounts, cgroups, loop devices, state directories: chaoskit.leaks).

Covered elsewhere, with the same checks: a sandbox's launcher SIGKILLed from the host
(tests/test_verdicts.py, refilled in place, local and --remote), one of several services and
one Ray node lost mid-group at a random point (test_lost_host.py; tests/test_cluster*.py
have deterministic ones), a run SIGKILLed at 20 random points (test_resume_exactly_once.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chaoskit import leaks, one_final_each

from conftest import backend_skip
from sandfleet.rollout import OpenAIPolicy, OraclePolicy, RetryPolicy
from sandfleet.rollout.policy import AgentContext
from sandfleet.rollout.verdict import INFRA, SCORED
from sandfleet.testing.fake_server import FakeModelServer
from test_rollout_support import make_task, run

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

SOLVE = [{"bash": "echo hello > /app/out.txt"}, "Done."]
RETRY = RetryPolicy(max_attempts=2, backoff_s=0.01)


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for t in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                kids = [int(x) for x in (t / "children").read_text().split()]
                out += kids
                todo += kids
    return out


class KillGuestAgent:
    """In the first rollout it acts in, SIGKILL the sandbox's guest agent (the process
    inside the sandbox that serves the host) from the host, then write the answer."""

    name = "kill-guest-agent"

    def __init__(self) -> None:
        self.killed: list[int] = []

    async def act(self, ctx: AgentContext) -> str:
        if not self.killed:
            root = ctx.sandbox.agent.proc.pid  # type: ignore[attr-defined]
            agents = [p for p in _descendants(root)
                      if Path(f"/proc/{p}/comm").read_text().strip() == "sandfleet-agent"]
            assert agents, "no guest agent below the sandbox's process"
            os.kill(agents[0], signal.SIGKILL)
            self.killed.append(agents[0])
        ctx.turns += 1
        await ctx.run("echo hello > /app/out.txt")
        return "done"


async def test_guest_agent_sigkilled_from_the_host(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    policy = KillGuestAgent()
    report = await run([task], policy, tmp_path / "out", n=2, retry=RETRY)
    assert policy.killed
    one_final_each(report.results, [task.name], 2)
    assert [(r.verdict, r.reward) for r in report.results] == [(SCORED, 1.0)] * 2  # refilled in place
    killed = [a for a in report.attempts if a.verdict == INFRA]
    assert len(killed) == 1 and killed[0].fault and killed[0].fault["cause"] == "sandbox_died", killed
    assert killed[0].reward is None and not killed[0].final
    assert leaks([a.sandbox_id for a in report.attempts]) == []


@pytest.mark.parametrize("fault", ["500", "hang", "cut"])
async def test_model_server_fault_is_masked_after_the_retry(tmp_path: Path, fault: str) -> None:
    """A model server that answers 500, does not answer (the policy's timeout: 2 s here),
    or cuts its answer half-way (headers sent, then the connection closed), on every
    request: masked after the retry, never a 0. Once only: the retry refills it."""
    task = make_task(tmp_path)
    with FakeModelServer(SOLVE, faults=[fault] * 4) as server:
        report = await run([task], OpenAIPolicy(server.url, "m", request_timeout_s=2.0), tmp_path / "out",
                           n=1, retry=RETRY)
    r = report.results[0]
    assert (r.verdict, r.reward, r.attempt) == (INFRA, None, 2), (r.reason, r.error)
    assert r.fault and r.fault["cause"] in ("model_overloaded", "model_timeout", "model_unreachable",
                                            "model_malformed"), r.fault
    with FakeModelServer(SOLVE, faults=[fault]) as server:
        again = await run([task], OpenAIPolicy(server.url, "m", request_timeout_s=2.0), tmp_path / "again",
                          n=1, retry=RETRY)
    assert [(a.verdict, a.final) for a in again.attempts] == [(INFRA, False), (SCORED, True)]
    assert leaks([a.sandbox_id for a in report.attempts + again.attempts]) == []


@contextlib.contextmanager
def small_state_dir(mib: int) -> Iterator[Path]:
    """A state directory on a tmpfs of its own, ``mib`` MiB (bwrap must reach it: under /run)."""
    d = Path(tempfile.mkdtemp(prefix="sandfleet-chaos-state-", dir="/run"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0711", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
        d.rmdir()


def fill(d: Path) -> None:
    """Fill ``d``'s filesystem to the last block."""
    for name, chunk in (("filler", 1 << 20), ("filler2", 512)):
        with open(d / name, "wb", buffering=0) as f:
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * chunk)


async def test_state_directory_disk_full(tmp_path: Path) -> None:
    """The state directory's filesystem is full: no sandbox can start; every rollout is
    masked (the agent had not acted), the error names the cause, and nothing is left. With
    the space back, the next run scores."""
    from sandfleet.sandbox.state import state_root

    task = make_task(tmp_path)
    before = os.environ.get("SANDFLEET_STATE")
    with small_state_dir(16) as state:
        os.environ["SANDFLEET_STATE"] = str(state)
        state_root.cache_clear()  # (read once per process)
        try:
            fill(state)
            report = await run([task], OraclePolicy(), tmp_path / "out", n=2, retry=RETRY)
            one_final_each(report.results, [task.name], 2)
            for r in report.results:
                assert (r.verdict, r.reward) == (INFRA, None) and r.fault, (r.reason, r.error)
                assert r.fault["cause"] == "sandbox_start" and "No space left" in (r.error or ""), r.error
            assert leaks([a.sandbox_id for a in report.attempts], state=state) == []
            summary = json.loads((tmp_path / "out" / "summary.json").read_text())
            assert summary["verdicts"][INFRA] == 2
            for f in state.glob("filler*"):
                f.unlink()
            report = await run([task], OraclePolicy(), tmp_path / "again", n=2, retry=RETRY)
            assert [(r.verdict, r.reward) for r in report.results] == [(SCORED, 1.0)] * 2
            assert leaks([a.sandbox_id for a in report.attempts], state=state) == []
        finally:
            if before is None:
                os.environ.pop("SANDFLEET_STATE", None)
            else:
                os.environ["SANDFLEET_STATE"] = before
            state_root.cache_clear()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="the service needs the server extra")
async def test_service_sigkilled_mid_exec_and_restarted(tmp_path: Path) -> None:
    """The sandbox service is SIGKILLed while the rollouts' commands run, and started again
    on the same port: the rollouts in flight are masked (their sandboxes are gone with it)
    and refilled on the new service (the retry waits 1.5, 3, 6 s: a refill while it starts
    finds nothing listening), which reaped what the old one left."""
    from sandfleet.client.remote import on_remote
    from sandfleet.server.testing import start_service

    task = make_task(tmp_path, solve="sleep 3; echo hello > /app/out.txt")
    port = _free_port()
    svc = start_service(tmp_path / "svc1", port=port)
    os.environ["SANDFLEET_TOKEN"] = svc.token
    restarted: list[Any] = []

    async def chaos() -> None:
        from sandfleet.sandbox.state import list_sandboxes

        end = time.monotonic() + 60
        while sum(m.get("owner_pid") == svc.proc.pid for m in list_sandboxes()) < 2:
            assert time.monotonic() < end, "the rollouts' sandboxes never appeared"
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # their commands run
        svc.kill()
        (tmp_path / "svc2").mkdir()
        shutil.copy(tmp_path / "svc1" / "tokens", tmp_path / "svc2" / "tokens")
        (tmp_path / "svc2" / "tokens").chmod(0o600)
        restarted.append(await asyncio.to_thread(start_service, tmp_path / "svc2", port=port, tokens=svc.tokens))

    try:
        kill = asyncio.create_task(chaos())
        report = await on_remote(svc.url, lambda: run([task], OraclePolicy(), tmp_path / "out", n=2,
                                                      retry=RetryPolicy(max_attempts=4, backoff_s=1.5)))
        await kill
    finally:
        del os.environ["SANDFLEET_TOKEN"]
        svc.kill()
        for s in restarted:
            assert s.stop() == 0
    one_final_each(report.results, [task.name], 2)
    assert [(r.verdict, r.reward) for r in report.results] == [(SCORED, 1.0)] * 2, \
        [(a.rollout_id, a.reason, a.error) for a in report.attempts]
    lost = [a for a in report.attempts if not a.final]
    assert lost and all(a.verdict == INFRA and a.reward is None for a in lost), \
        [(a.rollout_id, a.verdict, a.reason) for a in lost]
    assert leaks([a.sandbox_id for a in report.attempts], marks=[str(tmp_path)]) == []


def _memory_cgroup(name: str, limit: int) -> Path:
    from sandfleet.sandbox import cgroups

    lay = cgroups.detect()
    if not lay.usable or "memory" not in lay.mounts:
        pytest.skip("needs a writable memory cgroup controller")
    d = lay.mounts["memory"] / name
    d.mkdir()
    if lay.version == "v2":
        (d / "memory.max").write_text(str(limit))
        (d / "memory.swap.max").write_text("0")
    else:
        (d / "memory.limit_in_bytes").write_text(str(limit))
        with contextlib.suppress(OSError):
            (d / "memory.memsw.limit_in_bytes").write_text(str(limit))
    return d


def _oom_kills(d: Path) -> int:
    for f in ("memory.events", "memory.oom_control"):
        with contextlib.suppress(OSError):
            for line in (d / f).read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    return -1


def test_host_side_out_of_memory_in_a_cgroup_around_the_run(tmp_path: Path) -> None:
    """``sandfleet run`` itself in a memory cgroup of 400 MiB (never the machine's memory);
    the model answers with a 300 MiB completion: the host side runs out of memory and the
    kernel kills the run. Its sandboxes die with it; ``--resume`` (the model sane again)
    ends with every rollout once, scored, and nothing left."""
    names = ["a", "b"]
    for n in names:
        make_task(tmp_path / "tasks", n)
    cg = _memory_cgroup(f"sandfleet-chaos-oom-{os.getpid()}", 400 << 20)
    out = tmp_path / "out"
    try:
        with FakeModelServer([{"bash": "sleep 1"}, *SOLVE], faults=["huge"], huge_mib=300) as model:
            argv = [sys.executable, "-m", "sandfleet", "run", "--tasks", str(tmp_path / "tasks"), "--agent",
                    "openai", "--model-url", model.url, "-n", "2", "--concurrency", "4", "--backend", "bwrap",
                    "--out", str(out)]
            res = subprocess.run(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", *argv],
                                 capture_output=True, text=True, timeout=300)
            assert res.returncode == -signal.SIGKILL, (res.returncode, res.stderr[-2000:])
            assert _oom_kills(cg) >= 1
            again = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
    finally:
        with contextlib.suppress(OSError):
            cg.rmdir()
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted((r["task"], r["sample"]) for r in rows) == [(t, i) for t in names for i in range(2)]
    assert all((r["verdict"], r["reward"]) == (SCORED, 1.0) for r in rows)
    ids = [json.loads(x).get("sandbox_id") for x in (out / "trace.jsonl").read_text().splitlines()]
    assert leaks(ids, marks=[str(tmp_path)]) == []
    assert not cg.exists()


@pytest.mark.waits  # 24 s of wall, 5 s of CPU (scripts/test.sh: a lane of its own)
def test_client_connection_to_the_service_cut(tmp_path: Path) -> None:
    """The client's connection to the service is cut for 15 s (a network namespace of the
    test's own, a drop rule on its loopback only) while the rollouts' commands run: the
    requests in flight wait (within the client's timeout) and complete once the path is
    back; every rollout scored once, nothing left."""
    for tool in ("ip", "nft", "nsenter"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool}")
    if importlib.util.find_spec("fastapi") is None:
        pytest.skip("the service needs the server extra")
    from sandfleet.server.testing import READY, write_tokens

    ns = f"sf-chaos-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    svc = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        token = write_tokens(tmp_path / "tokens", 1)[0]
        port = 18765
        inside = ["nsenter", f"--net=/run/netns/{ns}"]  # (not ip netns exec: it mounts a /sys without cgroups)
        with open(tmp_path / "serve.log", "wb") as log:
            svc = subprocess.Popen([*inside, sys.executable, "-m", "sandfleet", "serve", "--port", str(port),
                                    "--token-file", str(tmp_path / "tokens")], stdout=subprocess.PIPE, stderr=log)
        assert svc.stdout is not None
        assert READY in svc.stdout.readline().decode()
        make_task(tmp_path / "tasks", solve="sleep 6; echo hello > /app/out.txt")
        out = tmp_path / "out"
        run_argv = [*inside, sys.executable, "-m", "sandfleet", "run", "--remote", f"http://127.0.0.1:{port}",
                    "--tasks", str(tmp_path / "tasks"), "--agent", "oracle", "-n", "2", "--attempts", "3",
                    "--out", str(out)]
        client = subprocess.Popen(run_argv, env={**os.environ, "SANDFLEET_TOKEN": token},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        from sandfleet.sandbox.state import list_sandboxes

        end = time.monotonic() + 120
        while sum(m.get("owner_pid") == svc.pid for m in list_sandboxes()) < 2:  # both commands start
            assert time.monotonic() < end and client.poll() is None, "the rollouts' sandboxes never appeared"
            time.sleep(0.1)
        time.sleep(1.0)
        rule = [*inside, "nft"]
        cut = [time.time()]
        subprocess.run([*rule, "add", "table", "inet", "chaos"], check=True)
        subprocess.run([*rule, "add", "chain", "inet", "chaos", "out", "{ type filter hook output priority 0; }"],
                       check=True)
        subprocess.run([*rule, "add", "rule", "inet", "chaos", "out", "oifname", "lo", "tcp", "dport", str(port),
                        "drop"], check=True)
        time.sleep(15)
        subprocess.run([*rule, "delete", "table", "inet", "chaos"], check=True)
        cut.append(time.time())
        stdout, stderr = client.communicate(timeout=300)
        assert client.returncode == 0, stderr[-3000:]
    finally:
        if svc is not None:
            svc.send_signal(signal.SIGTERM)
            assert svc.wait(60) == 0
            assert svc.stdout is not None
            svc.stdout.close()
        subprocess.run(["ip", "netns", "delete", ns], check=False)
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(r["sample"] for r in rows) == [0, 1]
    assert all((r["verdict"], r["reward"]) == (SCORED, 1.0) for r in rows), rows
    traces = [json.loads(x) for x in (out / "trace.jsonl").read_text().splitlines()]
    assert all(t["start"] < cut[0] and t["end"] > cut[1] for t in traces), (cut, traces)  # they sat through it
    assert leaks([t.get("sandbox_id") for t in traces], marks=[str(tmp_path / "out")]) == []
