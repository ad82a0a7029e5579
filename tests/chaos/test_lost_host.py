"""Chaos: one of several hosts lost mid-group, at a random point.

``sandfleet run --remote A,B,C`` over three real ``sandfleet serve`` on loopback (each with
its own state directory and cgroup parent): one of them, drawn at random, is SIGKILLed a
random moment after one of its first sandboxes appeared (so while a group of its runs). Every
rollout still ends exactly once, scored: the members in flight on the lost host get an
attempt ``infra_fault`` (``node_lost``, reward null, not final) and are refilled on another
host, the members it finished are kept, the other hosts' rollouts are scored as if nothing
happened. Nothing is left on the surviving hosts; the killed one's leftovers (markers,
cgroups) are reaped when it starts again on its state directory.

The same on Ray: one worker node of a local 3-node cluster removed (its processes killed)
mid-group; the removed node's leftovers are reaped when the cluster stops (a ``local:N``
node does not come back). ~100 s here at load 5-12, like tests/test_cluster.py's (slow pass).

The seed is printed; SANDFLEET_CHAOS_SEED replays one (the victim, the kill point, the tasks'
lengths).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from chaoskit import leaks

from conftest import backend_skip, sandbox_cgroups
from test_rollout_support import make_task

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

NAMES = [f"g{i}" for i in range(8)]
N = 2
SLEEPS = (3, 4, 5)
"""Each task's agent sleeps one of these (seconds) before it answers: a kill at most
``SLEEPS[0] - 1`` s after a sandbox appeared finds it still running its agent."""


def _rng() -> random.Random:
    seed = int(os.environ.get("SANDFLEET_CHAOS_SEED") or random.randrange(1 << 30))
    print(f"seed {seed} (SANDFLEET_CHAOS_SEED={seed} replays it)")
    return random.Random(seed)


def _tasks(root: Path, rng: random.Random) -> Path:
    for name in NAMES:
        make_task(root, name, solve=f"sleep {rng.choice(SLEEPS)}; echo hello > /app/out.txt")
    return root


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Host:
    """A service and its directories; ``seen``: every sandbox id that had a marker there."""

    dir: Path
    env: dict[str, str]
    svc: Any = None
    seen: set[str] = field(default_factory=set)

    @property
    def state(self) -> Path:
        return Path(self.env["SANDFLEET_STATE"])

    def live(self) -> set[str]:
        return {p.name for p in self.state.glob("sf-*")}

    def unfinished(self) -> list[str]:
        """Sandbox directories being made (or left half-made by a killed creator)."""
        return sorted(p.name for p in self.state.glob(".new-*"))

    def cgroups(self) -> list[str]:
        """The sandbox cgroups under this host's cgroup parent."""
        return sandbox_cgroups(self.env["SANDFLEET_CGROUP_PARENT"])


@contextlib.contextmanager
def _hosts(k: int) -> Iterator[tuple[list[Host], list[str]]]:
    from sandfleet.cluster.local import reap_nodes
    from sandfleet.server.testing import start_service, write_tokens

    root = Path(tempfile.mkdtemp(prefix="sfchaos-", dir="/tmp"))
    root.chmod(0o711)  # the sandboxes' mapped uids traverse to their state directories
    hosts = [Host(root / f"h{i}", {"SANDFLEET_STATE": str(root / f"h{i}" / "state"),
                                   "SANDFLEET_CGROUP_PARENT": f"sf-chaos-host-{os.getpid()}-{i}"})
             for i in range(k)]
    tokens = write_tokens(root / "tokens")
    try:
        for h in hosts:
            h.state.mkdir(parents=True, mode=0o711)
            shutil.copy(root / "tokens", h.dir / "tokens")
            (h.dir / "tokens").chmod(0o600)
            h.svc = start_service(h.dir, tokens=tokens, env=h.env)
        yield hosts, tokens
    finally:
        for h in hosts:
            if h.svc is not None:
                h.svc.stop()
        left = reap_nodes([h.env for h in hosts])  # (and the cgroup parents)
        shutil.rmtree(root, ignore_errors=True)
        assert left == [], f"left on a host after the test: {left}"


def _metric(url: str, token: str, name: str) -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="the service needs the server extra")
@pytest.mark.waits  # 26 s of wall, 10 s of CPU (scripts/test.sh: a lane of its own)
def test_one_of_three_services_killed_mid_group(tmp_path: Path) -> None:
    from sandfleet.server.testing import start_service

    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    rng = _rng()
    tasks = _tasks(tmp_path / "tasks", rng)
    victim_i, k, delay = rng.randrange(3), rng.randint(1, 2 * N), rng.uniform(0.0, SLEEPS[0] - 1.0)
    out = tmp_path / "out"
    with _hosts(3) as (hosts, tokens):
        victim = hosts[victim_i]
        urls = [h.svc.url for h in hosts]
        print(f"victim {victim.svc.url} (host {victim_i}): killed {delay:.2f} s after its sandbox #{k} appeared")
        argv = [sys.executable, "-m", "sandfleet", "run", "--remote", ",".join(urls), "--tasks", str(tasks),
                "--agent", "oracle", "--image", "host", "-n", str(N), "--concurrency", str(N), "--attempts", "3",
                "--out", str(out)]
        client = subprocess.Popen(argv, env={**os.environ, "SANDFLEET_TOKEN": tokens[0]},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        kill: dict[str, Any] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(hosts, victim, k, delay, kill, stop), daemon=True)
        watcher.start()
        try:
            _, stderr = client.communicate(timeout=400)
        finally:
            stop.set()
            watcher.join(10)
            if client.poll() is None:
                client.kill()
                client.wait()
        assert client.returncode == 0, stderr[-3000:]
        assert "at" in kill, f"the victim was never killed: {kill}; {stderr[-2000:]}"
        print(f"killed at {kill['at']:.2f} with {len(kill['live'])} sandboxes live: {kill['live']}")
        assert kill["live"], "the kill was not mid-group"

        results = _check_run(out, {h.svc.url: h.seen for h in hosts}, victim.svc.url, kill)

        survivors = [h for h in hosts if h is not victim]
        for h in survivors:  # nothing left on the hosts that lived, right after the run
            assert h.live() == set(), h.live()
            assert leaks(h.seen, state=h.state) == [] and h.cgroups() == []
        # the killed host's leftovers: reaped when it starts again on its state directory
        victim.svc = start_service(victim.dir, tokens=tokens, env=victim.env)
        reaped = _metric(victim.svc.url, tokens[0], "sandfleet_reaped_leftovers_total")
        assert reaped >= len(kill["live"]), (reaped, kill["live"], victim.svc.log[-2000:])
        assert victim.live() == set() and victim.unfinished() == [] and victim.cgroups() == []
        for h in hosts:
            assert h.svc.stop() == 0
            h.svc = None
        ids = {t["sandbox_id"] for t in results if t.get("sandbox_id")}
        for h in hosts:
            assert leaks(ids, state=h.state, marks=[str(h.state)]) == []
        assert leaks(ids, marks=[str(tmp_path)]) == []


def _watch(hosts: list[Host], victim: Host, k: int, delay: float, kill: dict[str, Any],
           stop: threading.Event) -> None:
    """Record every host's sandboxes as they appear; SIGKILL the victim ``delay`` seconds
    after its ``k``-th sandbox appeared (``kill``: the ones live then, and when)."""
    order: list[str] = []
    due: float | None = None
    end = time.monotonic() + 300
    while not stop.is_set() and time.monotonic() < end:
        for h in hosts:
            if h is victim and "at" in kill:
                continue
            now = h.live()
            if h is victim:
                order += sorted(now - h.seen)
            h.seen |= now
        if due is None and len(order) >= k:
            due = time.monotonic() + delay
        if due is not None and "at" not in kill and time.monotonic() >= due:
            kill.update(live=sorted(victim.live()), at=time.time())
            victim.svc.kill()
        time.sleep(0.05)


def _check_run(out: Path, seen: dict[str, set[str]], victim: str, kill: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (task, sample) once, scored; the victim's unfinished members lost and refilled
    elsewhere, its finished ones kept; nothing on a survivor but scored attempts. ``seen``:
    each node's sandboxes. Returns the attempts (trace.jsonl)."""
    on = {sid: node for node, ids in seen.items() for sid in ids}
    rows = _lines(out / "rollouts.jsonl")
    assert Counter((r["task"], r["sample"]) for r in rows) == Counter({(t, i): 1 for t in NAMES for i in range(N)})
    assert all((r["verdict"], r["reward"], r["final"]) == ("scored", 1.0, True) for r in rows), \
        [(r["rollout_id"], r["verdict"], r["reason"], r["error"]) for r in rows if r["verdict"] != "scored"]
    traces = _lines(out / "trace.jsonl")
    by_key: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for t in traces:
        by_key.setdefault((t["task"], t["sample"]), []).append(t)
    assert set(by_key) == {(t, i) for t in NAMES for i in range(N)}
    for ts in by_key.values():
        assert sum(t["final"] for t in ts) == 1, ts  # counted once
        assert sorted(t["attempt"] for t in ts) == list(range(1, len(ts) + 1)), ts  # each attempt once
    lost = [t for t in traces if t["reason"] == "node_lost"]
    assert lost, "no member was in flight on the killed host"
    for t in lost:  # masked, never a 0, superseded by a refill
        assert (t["verdict"], t["reward"], t["final"]) == ("infra_fault", None, False), t
        assert t["fault"]["cause"] == "node_lost", t
        assert t.get("sandbox_id") is None or on.get(t["sandbox_id"]) == victim, t
    for t in traces:
        if t["reason"] == "node_lost":
            continue
        assert (t["verdict"], t["reward"], t["final"]) == ("scored", 1.0, True), t  # no other fault anywhere
        assert on.get(t["sandbox_id"]) is not None, f"{t['sandbox_id']} seen on no node"
        if on[t["sandbox_id"]] == victim:  # kept: the victim finished it before it was killed
            assert t["end"] < kill["at"], (t, kill)
    groups = _lines(out / "groups.jsonl")
    assert sorted(g["group"] for g in groups) == sorted(NAMES)
    hit = [g for g in groups if g["placements"][0]["node"] == victim and g["placements"][0].get("lost")]
    assert hit and all(len(g["placements"]) == 2 and g["placements"][1]["node"] != victim for g in hit), hit
    assert {t["group"] for t in lost} <= {g["group"] for g in hit}
    assert not [g for g in groups if g not in hit and len(g["placements"]) != 1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_rollouts"] == len(NAMES) * N and summary["verdicts"]["scored"] == len(NAMES) * N
    assert summary["n_attempts"] == len(traces) == len(NAMES) * N + len(lost)
    print(f"{len(traces)} attempts for {len(rows)} rollouts; {len(lost)} lost with the node, "
          f"{len(hit)} groups placed again; sandboxes per node: { {n: len(ids) for n, ids in seen.items()} }")
    return traces


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the ray extra is not installed")
async def test_one_ray_node_removed_mid_group(tmp_path: Path) -> None:
    """The same on a local 3-node Ray cluster (``--ray local:3``'s pool): a worker node drawn
    at random (the head holds the driver) removed, its processes killed, mid-group; the
    cluster's stop reaps what the removed node's sandboxes left."""
    import asyncio

    from sandfleet.cluster import RolloutPool
    from sandfleet.cluster.suite import run_suite_on_pool
    from sandfleet.rollout import OraclePolicy
    from sandfleet.tasks import load_tasks

    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    rng = _rng()
    tasks = load_tasks(_tasks(tmp_path / "tasks", rng))[0]
    victim_i, k, delay = rng.randint(1, 2), rng.randint(1, 2 * N), rng.uniform(0.0, SLEEPS[0] - 1.0)
    pool = await RolloutPool.create("local:3", capacity=N, backend="bwrap", image="host")
    assert pool.local is not None
    nodes = {x.label: x for x in pool.local.nodes}
    states = {x.node_id: Path(x.env["SANDFLEET_STATE"]) for x in pool.local.nodes}
    victim = nodes[f"n{victim_i}"].node_id
    print(f"victim n{victim_i} {victim}: removed {delay:.2f} s after its sandbox #{k} appeared")
    seen: dict[str, set[str]] = {n: set() for n in states}
    kill: dict[str, Any] = {}
    out = tmp_path / "out"

    def live(node: str) -> set[str]:
        return {p.name for p in states[node].glob("sf-*")}

    async def chaos() -> None:
        order: list[str] = []
        due: float | None = None
        while True:
            for node in states:
                if node == victim and "at" in kill:
                    continue
                now = live(node)
                if node == victim:
                    order += sorted(now - seen[node])
                seen[node] |= now
            if due is None and len(order) >= k:
                due = time.monotonic() + delay
            if due is not None and "at" not in kill and time.monotonic() >= due:
                kill.update(live=sorted(live(victim)), at=time.time())
                pool.remove_local_node(victim)
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(chaos())
    try:
        await asyncio.wait_for(run_suite_on_pool(tasks, OraclePolicy(), pool, N, out_dir=out), 300)
        leftovers = await pool.leftovers()
    finally:
        watcher.cancel()
        reaped = await pool.close()
        processes = [str(p) for p in pool.local.processes()]
    assert "at" in kill, "the node was never removed"
    print(f"removed at {kill['at']:.2f} with {len(kill['live'])} sandboxes live: {kill['live']}")
    assert kill["live"], "the removal was not mid-group"
    results = _check_run(out, seen, victim, kill)
    assert leftovers == {n: {"sandboxes": [], "snapshots": []} for n in states if n != victim}  # survivors: none
    assert set(kill["live"]) <= set(reaped), (kill["live"], reaped)  # the removed node's, reaped at the stop
    assert processes == []
    assert leaks({t.get("sandbox_id") for t in results}, marks=[str(tmp_path)]) == []
