"""The trace format's names, in one place: rollout/ writes traces, analysis/ reads them.

See ``docs/trace-schema.md`` for the format itself.
"""

from __future__ import annotations

SCHEMA = "sandfleet.trace/1"
"""The ``schema`` field of every trace record."""
SPAN_NAMES = ("sandbox_start", "model", "agent_command", "verifier", "other_sandbox", "overhead")
"""Every span name a trace may hold, in the order reports list them."""
LINEAGE = ("tree_id", "node_id", "parent_node", "branch_turn")
"""The lineage keys of a leaf of a branched rollout (``--branch``; rollout/tree.py)."""
