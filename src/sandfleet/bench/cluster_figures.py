"""The figures of docs/cluster.md, measured in one sitting on a ``local:N`` cluster.

    python -m sandfleet.bench.cluster_figures --tasks examples/tasks --rounds 3 --out cluster-figures.json

Both sides' sandboxes run under cgroup parents of their own (the nodes', and one for the
local side), so that neither shares a parent's CPU weight with other sandboxes on the host.

- **Scheduling overhead per rollout**: each group runs both locally
  (:func:`~sandfleet.rollout.suite.run_suite`, this process) and through the pool, rounds
  alternating. Through Ray, a group's driver-side wall time minus the node's own time for
  the same ``run_suite`` is what Ray adds (placement, shipping, the call, streaming the
  results back), divided by n. Also: mean rollout seconds through Ray over local (ratio).
- **Balance**: rollouts per node over the whole run.
- **Recovery after a node loss**: a group of a sleeping scripted agent on a known node;
  the node is removed mid-rollout; seconds until the loss is seen, and until the group,
  placed again elsewhere, has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from sandfleet.provenance import provenance


async def measure(tasks_dir: Path, names: list[str], nodes: int, n: int, rounds: int, backend: str) -> dict[str, Any]:
    from sandfleet.cluster.pool import RolloutPool
    from sandfleet.rollout import OraclePolicy, RunConfig, ScriptedPolicy, run_suite
    from sandfleet.tasks import load_task, load_tasks

    tasks = [t for t in load_tasks(tasks_dir)[0] if not names or t.name in names]
    policy = OraclePolicy()
    for t in tasks:  # images built before the cluster starts: its nodes find them
        await run_suite([t], policy, RunConfig(n=1, concurrency=1, backend=backend))
    pool = await RolloutPool.create(f"local:{nodes}", capacity=n, backend=backend)
    local_s: list[float] = []
    ray_s: list[float] = []
    sched: list[float] = []
    local_mean: list[float] = []
    ray_mean: list[float] = []
    per_node: dict[str, int] = {}
    try:
        for r in range(rounds):
            for t in tasks:
                for side in (("local", "ray") if r % 2 == 0 else ("ray", "local")):
                    t0 = time.perf_counter()
                    if side == "local":
                        rep = await run_suite([t], policy, RunConfig(n=n, concurrency=n, backend=backend))
                        local_s.append(time.perf_counter() - t0)
                        local_mean.append(statistics.fmean(x.duration for x in rep.results))
                    else:
                        run = await pool.run_group(t, n, policy)
                        ray_s.append(time.perf_counter() - t0)
                        ray_mean.append(statistics.fmean(x.duration for x in run.results))
                        sched.append((run.info["driver_s"] - run.info["node_s"]) / n)
                        label = str(run.info["label"])
                        per_node[label] = per_node.get(label, 0) + n
        # balance: every group submitted at once
        runs = await asyncio.gather(*(pool.run_group(t, n, policy) for t in tasks for _ in range(2)))
        burst: dict[str, int] = {}
        for run in runs:
            burst[str(run.info["label"])] = burst.get(str(run.info["label"]), 0) + n
        recovery = await _recovery(pool, load_task, ScriptedPolicy, n)
    finally:
        await pool.close()
    ms = sorted(x * 1000 for x in sched)
    return {
        "provenance": provenance({"nodes": nodes, "n": n, "rounds": rounds, "backend": backend,
                                  "tasks": [t.name for t in tasks]}),
        "scheduling_overhead_ms_per_rollout": {"median": statistics.median(ms), "p90": ms[int(0.9 * (len(ms) - 1))],
                                               "max": ms[-1], "groups": len(ms)},
        "group_wall_s": {"local_median": statistics.median(local_s), "ray_median": statistics.median(ray_s)},
        "end_to_end_extra_ms_per_rollout": (statistics.median(ray_s) - statistics.median(local_s)) * 1000 / n,
        "mean_rollout_ratio_ray_over_local": statistics.fmean(ray_mean) / statistics.fmean(local_mean),
        "rollouts_per_node_sequential": per_node,
        "rollouts_per_node_burst": burst,
        "recovery": recovery,
    }  # fmt: skip


SLEEPER_TOML = """version = "1.0"
[agent]
timeout_sec = 120
[verifier]
timeout_sec = 30
[environment]
cpus = 1
memory_mb = 512
storage_mb = 256
"""
CHECK = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/out.txt 2>/dev/null)" = hello ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def sleeper_task(root: Path) -> Path:
    """A Harbor task (run on the host image) whose tests want ``hello`` in /app/out.txt."""
    folder = root / "sleeper"
    (folder / "tests").mkdir(parents=True)
    (folder / "environment").mkdir()
    (folder / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\n")  # run on host
    (folder / "task.toml").write_text(SLEEPER_TOML)
    (folder / "instruction.md").write_text("Write hello into /app/out.txt.\n")
    (folder / "tests" / "test.sh").write_text(CHECK)
    return folder


async def _recovery(pool: Any, load_task: Any, scripted: Any, n: int, sleep_s: float = 6.0) -> dict[str, Any]:
    """A group of an agent sleeping ``sleep_s`` on the last node; that node removed once the
    group's sandboxes are up: seconds until the loss is seen, and until the group, placed
    again on another node, has ended (its second placement's own seconds beside them)."""
    with tempfile.TemporaryDirectory() as tmp:
        task = load_task(sleeper_task(Path(tmp)))
        policy = scripted([f"sleep {sleep_s:g}", "echo hello > /app/out.txt"])
        nodes = sorted(pool.nodes, key=lambda x: x.label)
        target, others = nodes[-1], nodes[:-1]
        for x in others:
            await pool.drain(x.node_id)
        running = asyncio.create_task(pool.run_group(task, n, policy, image="host"))
        while len((await pool.leftovers())[target.node_id]["sandboxes"]) < n:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        for x in others:
            await pool.undrain(x.node_id)
        removed = time.time()
        await asyncio.to_thread(pool.remove_local_node, target.node_id)
        run = await running
        ended = time.time()
    first, second = run.info["placements"]
    return {"removed_to_loss_seen_s": first["lost_at"] - removed, "removed_to_group_end_s": ended - removed,
            "replaced_group_s": second["seconds"], "agent_sleep_s": sleep_s,
            "rewards": run.rewards, "reasons": [r.reason for r in run.attempts]}


@click.command()
@click.option("--tasks", "tasks_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=Path("examples/tasks"), show_default=True)
@click.option("--task", "names", multiple=True, help="Only these tasks (repeatable).")
@click.option("--nodes", default=3, show_default=True)
@click.option("-n", "n", default=2, show_default=True, help="Group size (and each node's capacity).")
@click.option("--rounds", default=3, show_default=True)
@click.option("--backend", default="bwrap", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(tasks_dir: Path, names: tuple[str, ...], nodes: int, n: int, rounds: int, backend: str,
         out: Path | None) -> None:
    """Measure the cluster figures of docs/cluster.md."""
    from sandfleet.sandbox import cgroups

    # The local side's sandboxes get a cgroup parent of their own, as each node's do: under
    # the shared default parent they would split one parent's CPU weight with every other
    # sandbox on this host, and the comparison would measure that. (An entry point's own
    # environment, set before any sandbox exists.)
    parent = f"sandfleet-measure-{os.getpid()}"
    os.environ["SANDFLEET_CGROUP_PARENT"] = parent
    try:
        result = asyncio.run(measure(tasks_dir, list(names), nodes, n, rounds, backend))
    finally:
        for root in set(cgroups.detect().mounts.values()):
            with contextlib.suppress(FileNotFoundError):
                (root / parent).rmdir()
    text = json.dumps(result, indent=2)
    if out is not None:
        out.write_text(text + "\n")
    click.echo(text)


if __name__ == "__main__":
    main()
