"""Many hosts on Ray: rollouts, validation and the benchmark spread over a cluster.

    from sandfleet.cluster import RolloutPool

    pool = await RolloutPool.create(address="auto")        # or "host:port", "local:3"
    run = await pool.run_group(task, 8, policy)             # one GRPO group, on one node
    await pool.close()

One host actor per node (:mod:`sandfleet.cluster.host`) owns that node's sandboxes, image
cache and admission limit; :mod:`sandfleet.cluster.placement` puts each group whole on the
node with the most free capacity of the task's arch; task folders travel by content hash
(:mod:`sandfleet.tasks.bundle`); ``local:N`` starts N loopback-only nodes here
(:mod:`sandfleet.cluster.local`). Ray (the ``ray`` extra) is imported only when a pool is
made. docs/cluster.md has the figures and the CLI.
"""

from __future__ import annotations

from sandfleet.cluster.groups import GroupRun
from sandfleet.cluster.pool import RolloutPool

__all__ = ["GroupRun", "RolloutPool"]
