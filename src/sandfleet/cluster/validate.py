"""``sandfleet tasks validate --ray`` (or ``--remote URL,URL,...``): each task's oracle and no-op
repeats on the cluster (or the services).

The R oracle runs of a task go to one node, the R no-op runs to one node (each a group, so
a task's repeats see one host), without retries; verdicts as a local validation's
(:func:`sandfleet.rollout.validate.judge`). Unlike a local validation, a task whose oracle
fails is not tried again as root (run it locally for that diagnosis). Which pool, and its
closing, is the command's (:mod:`sandfleet.cli.where`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sandfleet.cluster.groups import GroupPool, PoolOptions
from sandfleet.rollout.policy import NoopPolicy, OraclePolicy
from sandfleet.rollout.runner import RetryPolicy
from sandfleet.rollout.validate import Verdict, fidelity, judge
from sandfleet.tasks.model import Task


def pool_options(repeats: int, concurrency: int | None, backend: str, agent_user: str | None,
                 network: bool, verify: str = "shared") -> PoolOptions:
    """A validation pool's options, Ray's or the services': at least ``repeats`` at once per
    host (a task's repeats are one group; None: the host's default, its CPU count or the
    service's ``max_busy``), no retries (a verdict counts every run)."""
    return {"capacity": max(concurrency, repeats) if concurrency else None, "backend": backend,
            "agent_user": agent_user, "network": network, "retry": RetryPolicy(max_attempts=1),
            "verify": verify}


async def validate_on_pool(pool: GroupPool, tasks: Sequence[Task], *, repeats: int, network: bool,
                           hosts: str) -> dict[str, Verdict]:
    """A verdict per task, its repeats run as groups on ``pool`` (``hosts``: what its hosts are,
    for the warning that names them)."""
    labels = {x.node_id: x.label for x in pool.nodes}
    oracle, noop = OraclePolicy(), NoopPolicy()
    runs = await asyncio.gather(*(pool.run_group(t, repeats, p, group=f"{t.name}/{p.name}")
                                  for t in tasks for p in (oracle, noop)))
    verdicts = {}
    for i, task in enumerate(tasks):
        mine_o, mine_n = runs[2 * i].results, runs[2 * i + 1].results
        v = judge(task, mine_o, mine_n)
        fidelity(v, task, None, [*mine_o, *mine_n], network=network)
        nodes = sorted({labels.get(str(r.info.get("node")), str(r.info.get("node", "?"))[:8])
                        for r in [*mine_o, *mine_n]})
        v.warnings.append(f"validated on {hosts} {', '.join(nodes)}")
        verdicts[task.name] = v
    return verdicts
