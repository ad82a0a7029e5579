"""A suite on a pool of hosts: ``sandfleet run --ray`` (:class:`~sandfleet.cluster.pool.RolloutPool`)
and ``sandfleet run --remote URL,URL,...`` (:class:`~sandfleet.cluster.services.ServicePool`).

The same run directory as a local run (:mod:`sandfleet.rollout.suite`'s writer: run.json,
trace.jsonl, rollouts.jsonl, groups.jsonl, summary.json; resume and overwrite alike), with
every group placed whole on a node. A group's attempts are written when the group ends
(the unfinished members of a group lost with its node are refilled on another, so its
attempts are numbered only then). ``summary.json`` gains ``nodes``: node id -> ``label``,
``n_rollouts``, ``pass_rate``, ``mask_rate``, ``spans_mean_s``; ``groups.jsonl`` lines carry
``node`` and ``placements``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.cluster.groups import GroupPool
from sandfleet.rollout.policy import Policy
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.suite import RunConfig, RunReport, _Writer, run_groups
from sandfleet.rollout.tree import tree_advantages
from sandfleet.tasks.model import Task
from sandfleet.traceschema import SPAN_NAMES


def node_summary(results: Sequence[RolloutResult], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Per node (its id): ``label``, ``n_rollouts``, ``pass_rate`` (over its scored and
    policy-fault rollouts), ``mask_rate``, ``spans_mean_s``."""
    by: dict[str, list[RolloutResult]] = {}
    for r in results:
        by.setdefault(str(r.info.get("node") or "?"), []).append(r)
    out = {}
    for node, rs in sorted(by.items(), key=lambda kv: (labels or {}).get(kv[0], kv[0])):
        spans = dict.fromkeys(SPAN_NAMES, 0.0)
        for r in rs:
            for name, seconds in r.span_seconds().items():
                spans[name] = spans.get(name, 0.0) + seconds
        kept = [r for r in rs if not r.masked]  # pass rate over scored and policy faults, masked apart
        out[node] = {"label": (labels or {}).get(node, node[:8]), "n_rollouts": len(rs),
                     "pass_rate": sum(r.passed for r in kept) / len(kept) if kept else 0.0,
                     "mask_rate": (len(rs) - len(kept)) / len(rs),
                     "spans_mean_s": {k: v / len(rs) for k, v in spans.items()}}
    return out


@dataclass
class ClusterRunReport(RunReport):
    """A :class:`RunReport` whose summary says how the rollouts spread over the nodes."""

    labels: dict[str, str] = field(default_factory=dict)
    group_info: dict[str, dict[str, Any]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "nodes": node_summary(self.results, self.labels)}


async def run_suite_on_pool(
    tasks: Sequence[Task],
    policy: Policy,
    pool: GroupPool,
    n: int,
    *,
    out_dir: Path | None = None,
    on_result: Callable[[RolloutResult], None] | None = None,
    out_mode: str = "new",
) -> ClusterRunReport:
    """Run ``n`` rollouts of every task as groups on the pool's nodes; every group is
    submitted at once and waits its turn for a node (first come first served)."""
    leaves = pool.config.plan.leaves if pool.config.plan else 1  # --branch: a tree holds a slot per leaf
    cfg = RunConfig(**{**pool.config.__dict__, "n": n, "concurrency": max(n * leaves, pool.config.concurrency)})
    writer = _Writer(out_dir, cfg, out_mode)
    prev = writer.previous
    attempts: list[RolloutResult] = list(prev.attempts)
    finals: list[RolloutResult] = list(prev.results)
    groups: dict[str, dict[str, Any]] = dict(prev.groups)
    infos: dict[str, dict[str, Any]] = {}

    def record(r: RolloutResult) -> None:
        attempts.append(r)
        writer.attempt(r)
        if on_result is not None:
            on_result(r)

    async def group(task: Task) -> None:
        run = await pool.run_group(task, n, policy, on_result=record)
        for r in run.results:
            finals.append(r)
            writer.rollout(r)
        groups[task.name] = run.stats
        info = {k: run.info.get(k) for k in ("node", "label", "admitted", "end", "attempts", "placements",
                                             "node_s", "driver_s")}
        if cfg.plan is not None:  # node values per tree, each leaf's per-turn tree advantages (rollout/tree.py)
            info["trees"] = tree_advantages(run.results, cfg.plan)
            info["tree_advantages"] = {r.rollout_id: r.tree_advantages for r in run.results}
        infos[task.name] = info
        writer.group(task.name, run.stats, run.results, info)

    return await run_groups(tasks, group, writer, finals, lambda wall_s, interrupted: ClusterRunReport(
        cfg, finals, attempts, groups, wall_s, interrupted=interrupted, resumed=len(prev.results),
        labels={x.node_id: x.label for x in pool.nodes}, group_info=infos))
