"""The figures of docs/cluster.md's "Without Ray", in one sitting: two ``sandfleet serve`` on
loopback, each with its own cache (base images only), state directory and cgroup parent.

    python -m sandfleet.bench.services_figures --rounds 3 --out services-figures.json

- **Balance**: 8 groups of 2 oracle rollouts submitted at once (capacity 2 per host), per
  round: rollouts per host, and the round's wall time.
- **Recovery after a host loss**: a group of a scripted agent that sleeps 6 s on the first
  host; that service SIGKILLed once both sandboxes are up; seconds until the pool sees the
  loss, until the group (placed again whole on the other host) has ended, and the re-placed
  group's own time. What the killed service left is reaped afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import click

from sandfleet.provenance import provenance

TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/out.txt 2>/dev/null)" = hello ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def _task(root: Path, name: str) -> Path:
    folder = root / name
    for sub in ("environment", "solution", "tests"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n'
                                      "[environment]\ncpus = 1\nmemory_mb = 512\nstorage_mb = 256\n")
    (folder / "instruction.md").write_text("Write the word hello into /app/out.txt.\n")
    (folder / "environment" / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\nWORKDIR /app\n")
    (folder / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho hello > /app/out.txt  # {name}\n")
    (folder / "tests" / "test.sh").write_text(TEST_SH)
    return folder


async def measure(rounds: int, groups: int) -> dict[str, Any]:
    from sandfleet.cluster.local import reap_nodes
    from sandfleet.cluster.services import ServicePool
    from sandfleet.rollout import OraclePolicy, ScriptedPolicy
    from sandfleet.server.testing import RunningService, own_cache, start_service, write_tokens
    from sandfleet.tasks import load_task

    root = Path(tempfile.mkdtemp(prefix="sfsvc-", dir="/tmp"))
    root.chmod(0o711)  # the sandboxes' mapped uids traverse to their state directories

    def env_of(i: int) -> dict[str, str]:
        d = root / f"s{i}"
        return {"SANDFLEET_CACHE": str(d / "cache"), "SANDFLEET_STATE": str(d / "state"),
                "SANDFLEET_CGROUP_PARENT": f"sandfleet-measure-{root.name}-{i}"}

    tokens = write_tokens(root / "tokens")
    svcs: list[RunningService] = []
    out: dict[str, Any] = {"load_start": os.getloadavg()[0]}
    try:
        for i in range(2):
            d = root / f"s{i}"
            (d / "state").mkdir(parents=True)
            shutil.copy(root / "tokens", d / "tokens")
            own_cache(d / "cache")
            svcs.append(start_service(d, tokens=tokens, env=env_of(i)))
        a, b = svcs
        tasks = [load_task(_task(root / "suite", f"t{i}")) for i in range(groups)]
        policy = OraclePolicy()
        pool = await ServicePool.create([a.url, b.url], a.token, capacity=2)
        try:
            await asyncio.gather(*(pool.run_group(t, 2, policy) for t in tasks[:2]))  # each host builds the image
            for _ in range(rounds):
                t0 = time.perf_counter()
                runs = await asyncio.gather(*(pool.run_group(t, 2, policy) for t in tasks))
                wall = time.perf_counter() - t0
                per = Counter(r.info["node"] for run in runs for r in run.results)
                hosts = {pool.placer.node(k).label: v for k, v in per.items()}
                out.setdefault("balance", []).append({"per_host": hosts, "wall_s": round(wall, 2)})
                if not all(r.reward == 1.0 for run in runs for r in run.results):
                    raise RuntimeError("an oracle rollout failed: the figures would not mean what they say")
            sleeper = ScriptedPolicy(["sleep 6", "echo hello > /app/out.txt"])
            running = asyncio.create_task(pool.run_group(tasks[0], 2, sleeper))  # equally free: the first host
            while len((await pool.leftovers())[a.url]) < 2:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            t_kill = time.perf_counter()
            a.kill()
            node = pool.placer.node(a.url)
            while not node.lost:
                await asyncio.sleep(0.02)
            t_seen = time.perf_counter()
            run = await running
            t_end = time.perf_counter()
            out["recovery"] = {
                "kill_to_loss_seen_s": round(t_seen - t_kill, 2), "kill_to_group_end_s": round(t_end - t_kill, 2),
                "replaced_group_s": round(run.info["placements"][-1]["seconds"], 2),
                "placements": [p["node"] for p in run.info["placements"]],
                "node_lost_attempts": sum(r.reason == "node_lost" for r in run.attempts),
                "final": [(r.status, r.reward, r.attempt, r.info["node"]) for r in run.results]}
            out["survivor_leftovers"] = (await pool.leftovers())[b.url]
        finally:
            await pool.close()
    finally:
        for s in svcs:
            s.stop()
        out["reaped_after"] = reap_nodes([env_of(i) for i in range(2)])
        shutil.rmtree(root, ignore_errors=True)
    out["load_end"] = os.getloadavg()[0]
    return out


@click.command()
@click.option("--rounds", default=3, show_default=True)
@click.option("--groups", default=8, show_default=True, help="Groups of 2 submitted at once per round.")
@click.option("--out", "out_path", type=click.Path(path_type=Path), default=None)
def main(rounds: int, groups: int, out_path: Path | None) -> None:
    figures = {**asyncio.run(measure(rounds, groups)), "provenance": provenance()}
    text = json.dumps(figures, indent=2)
    if out_path is not None:
        out_path.write_text(text + "\n")
    click.echo(text)


if __name__ == "__main__":
    main()
