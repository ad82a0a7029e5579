"""sandfleet.cluster on a local 3-node Ray cluster bound to loopback (slow suite).

Placement (rollouts land on every node), the same per-task rewards as a local run, and a
deterministic node loss: a scripted agent sleeps on a known node, that node is removed
mid-rollout, its group shows ``node_lost`` and is placed whole on another node, every
rollout completes and the remaining nodes keep nothing. A session fixture fails if any
process of these clusters survives.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandfleet.rollout import NoopPolicy, OraclePolicy, RunConfig, ScriptedPolicy, run_suite
from sandfleet.tasks import load_tasks
from test_rollout_support import make_task, needs_bwrap

pytestmark = [pytest.mark.slow, needs_bwrap(),  # not importorskip: Ray must not be imported before a local cluster
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the ray extra is not installed")]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tasks"
SOME = ["archive-verify-checksums", "jq-json-summary", "shell-quoting-bug"]
"""Three tasks, each by the oracle and the no-op agent in groups of 2: 6 groups over 3 nodes of
capacity 2 (a node takes a whole group), so every node runs some (six tasks until 2026-12-05:
24 rollouts locally and 24 on the cluster, 60 s of the slow pass; issue 43)."""
MARK = b"/tmp/sfray-"


def cluster_processes() -> list[str]:
    """Processes of any local cluster these tests started (Ray's session directory, or a
    node's sandfleet directories, lie under /tmp/sfray-*; some of Ray's agents carry only the
    node's cgroup parent, sandfleet-ray-*)."""
    return processes_where(lambda cmd, env: MARK in cmd or MARK in env
                           or b"SANDFLEET_CGROUP_PARENT=sandfleet-ray-" in env)


def processes_where(match: Callable[[bytes, bytes], bool]) -> list[str]:
    """"pid cmdline" of each process (but this one) whose command line and environment ``match``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            with contextlib.suppress(OSError):
                cmd = (d / "cmdline").read_bytes()
                if match(cmd, (d / "environ").read_bytes()):
                    out.append(f"{d.name} {cmd[:120]!r}")
    return out


@pytest.fixture(scope="session", autouse=True)
def no_ray_left() -> Iterator[None]:
    """Fails the session if any process of a local cluster outlives the tests."""
    yield
    deadline = time.monotonic() + 15
    while (left := cluster_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"Ray processes survived the tests: {left}"


async def test_rollouts_spread_over_every_node_with_a_local_runs_rewards(tmp_path: Path) -> None:
    from sandfleet.cluster import RolloutPool

    tasks = [t for t in load_tasks(EXAMPLES)[0] if t.name in SOME]
    assert len(tasks) == len(SOME)
    agents = [OraclePolicy(), NoopPolicy()]

    def vectors(results: list) -> dict[tuple[str, str], list[float | None]]:
        out: dict[tuple[str, str], list[float | None]] = {}
        for r in sorted(results, key=lambda r: (r.task, r.agent, r.sample)):
            out.setdefault((r.task, r.agent), []).append(r.reward)
        return out

    local = []
    for policy in agents:  # the local run first: it builds the images the nodes then find
        report = await run_suite(tasks, policy, RunConfig(n=2, concurrency=4, backend="bwrap"))
        local += report.results
    pool = await RolloutPool.create("local:3", capacity=2, backend="bwrap")
    try:
        assert len(pool.nodes) == 3 and {x.arch for x in pool.nodes} == {local_arch()}
        runs = await asyncio.gather(*(pool.run_group(t, 2, p) for t in tasks for p in agents))
        leftovers = await pool.leftovers()
    finally:
        reaped = await pool.close()
    remote = [r for run in runs for r in run.results]
    assert all(r.status == "completed" for r in remote), [(r.rollout_id, r.error) for r in remote]
    assert vectors(remote) == vectors(local)
    assert {tuple(x) for x in vectors(remote).values()} <= {(1.0, 1.0), (0.0, 0.0)}
    assert {r.info["node"] for r in remote} == {x.node_id for x in pool.nodes}  # every node ran some
    assert all(len(set(r.info["node"] for r in run.results)) == 1 for run in runs)  # a group on one node
    assert all(run.results[0].advantage is not None for run in runs)
    assert leftovers == {x.node_id: {"sandboxes": [], "snapshots": []} for x in pool.nodes}
    assert reaped == []


async def test_a_lost_node_fails_its_group_node_lost_and_the_group_runs_whole_elsewhere(tmp_path: Path) -> None:
    from sandfleet.cluster import RolloutPool

    task = make_task(tmp_path)
    sleeper = ScriptedPolicy(["sleep 8", "echo hello > /app/out.txt"])
    pool = await RolloutPool.create("local:3", capacity=2, backend="bwrap", image="host")
    n0, n1, n2 = sorted(pool.nodes, key=lambda x: x.label)
    lost_at = 0.0
    try:
        await pool.drain(n0.node_id)  # the head (the driver's node) can't be removed
        await pool.drain(n1.node_id)
        running = asyncio.create_task(pool.run_group(task, 2, sleeper))
        async with asyncio.timeout(60):  # both members' sandboxes are up on n2: the agent sleeps there
            while len((await pool.leftovers())[n2.node_id]["sandboxes"]) < 2:
                await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        await pool.undrain(n1.node_id)
        lost_at = time.time()
        pool.remove_local_node(n2.node_id)
        run = await asyncio.wait_for(running, 120)
        leftovers = await pool.leftovers()
    finally:
        reaped = await pool.close()
    recovered = time.time() - lost_at
    first, second = run.info["placements"]
    assert first["node"] == n2.node_id and first["lost"] is True
    assert second["node"] == n1.node_id and not second.get("lost")
    lost = [r for r in run.attempts if r.reason == "node_lost"]
    assert sorted(r.sample for r in lost) == [0, 1] and not any(r.final for r in lost)
    assert all(r.info["node"] == n2.node_id for r in lost)
    assert [(r.status, r.reward, r.attempt, r.info["node"]) for r in run.results] == [
        ("completed", 1.0, 2, n1.node_id)] * 2  # fmt: skip
    assert [r.rollout_id for r in run.results] == ["hello#0~2", "hello#1~2"]
    assert run.node == n1.node_id and recovered < 60
    assert leftovers == {n0.node_id: {"sandboxes": [], "snapshots": []},
                         n1.node_id: {"sandboxes": [], "snapshots": []}}
    assert len(reaped) >= 2  # the lost node's two sandboxes, reaped when the cluster stopped
    assert n2.lost and not cluster_processes_of(pool)



async def test_a_lost_node_keeps_the_members_it_finished_and_refills_the_rest(tmp_path: Path) -> None:
    """Refill in place on Ray: of a group of 2 on one node, one member finishes, then the
    node is removed; only the other member runs again, on another node, and the group ends whole."""
    from sandfleet.cluster import RolloutPool
    from sandfleet.testing.faultpolicies import Staggered

    task = make_task(tmp_path)
    # the quick member lives a second: a whole rollout here takes under 0.1 s, and polled every
    # 0.1 s its sandbox was missed (the wait for both up timed out)
    half = Staggered(["sleep 1; echo hello > /app/out.txt"], ["sleep 8; echo hello > /app/out.txt"])
    pool = await RolloutPool.create("local:3", capacity=2, backend="bwrap", image="host")
    n0, n1, n2 = sorted(pool.nodes, key=lambda x: x.label)
    try:
        await pool.drain(n0.node_id)  # the head (the driver's node) can't be removed
        await pool.drain(n1.node_id)
        running = asyncio.create_task(pool.run_group(task, 2, half))
        async with asyncio.timeout(60):  # both up on n2, then the quick one done and closed
            while len((await pool.leftovers())[n2.node_id]["sandboxes"]) < 2:
                await asyncio.sleep(0.1)
            while len((await pool.leftovers())[n2.node_id]["sandboxes"]) > 1:
                await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # the finished member's attempt streams back to the driver
        await pool.undrain(n1.node_id)
        pool.remove_local_node(n2.node_id)
        run = await asyncio.wait_for(running, 120)
    finally:
        await pool.close()
    first, second = run.info["placements"]
    assert first["node"] == n2.node_id and first["lost"] is True and second["node"] == n1.node_id
    done = [r for r in run.results if r.info["node"] == n2.node_id]
    assert len(done) == 1 and done[0].attempt == 1 and done[0].verdict == "scored"  # kept, not run again
    again = [r for r in run.results if r.info["node"] == n1.node_id]
    assert len(again) == 1 and second["samples"] == [again[0].sample] and again[0].attempt == 2
    lost = [r for r in run.attempts if r.reason == "node_lost"]
    assert [r.sample for r in lost] == [again[0].sample] and lost[0].verdict == "infra_fault" and not lost[0].final
    assert [r.reward for r in run.results] == [1.0, 1.0] and run.stats["complete"] is True
    assert not cluster_processes_of(pool)

def cluster_processes_of(pool: object) -> list[str]:
    local = getattr(pool, "local", None)
    return [] if local is None else [str(p) for p in local.processes()]


def local_arch() -> str:
    from sandfleet.imagestore import arch

    return arch()


def test_run_cli_on_a_local_cluster_writes_nodes_and_leaves_nothing(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    for name in ("a", "b"):
        make_task(tmp_path / "tasks", name)
    out = tmp_path / "out"
    # this run's own processes, told apart by a variable they inherit: the other worker's tests start local
    # clusters of their own meanwhile (cluster_processes() saw one of theirs, a ray::DashboardAgent, here once)
    mark = f"SANDFLEET_TEST_RUN={os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1]}
    res = subprocess.run([sys.executable, "-m", "sandfleet", "run", "--tasks", str(tmp_path / "tasks"), "--agent",
                          "oracle", "-n", "2", "--concurrency", "2", "--image", "host", "--backend", "bwrap",
                          "--ray", "local:2", "--out", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pass_rate"] == 1.0 and summary["n_rollouts"] == 4
    nodes = summary["nodes"]
    assert sorted(x["label"] for x in nodes.values()) == ["n0", "n1"]  # one group on each
    assert all(x["n_rollouts"] == 2 and x["pass_rate"] == 1.0 and "verifier" in x["spans_mean_s"]
               for x in nodes.values())
    groups = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
    assert sorted(g["node"] for g in groups) == sorted(nodes)
    assert "node n0: 2 rollouts" in res.stdout and not processes_where(lambda _cmd, env: mark.encode() in env)


def test_a_local_cluster_whose_driver_lost_track_of_it_still_leaves_nothing() -> None:
    """stop() ends every process naming the cluster's directory, also when Ray's Cluster
    object is gone (a start that failed half-way: its head runs, no Cluster to stop it)."""
    from sandfleet.cluster.local import LocalCluster

    c = LocalCluster(2, seed=False)
    c.start()
    root = c.root
    assert len(c.processes()) >= 4  # two raylets and their agents, the GCS, ...
    kept, c.cluster = c.cluster, None  # kept: Ray's process handles are dropped only once their processes ended
    c.stop()
    assert c.processes() == [] and not root.exists()
    for node in kept.list_all_nodes():  # collect their exit statuses, as Ray's own shutdown would
        for infos in node.all_processes.values():
            for info in infos:
                info.process.wait(5)
