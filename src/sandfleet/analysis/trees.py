"""The trees of a branched run (``sandfleet run --branch``): their nodes, and the work saved.

A tree's lines in ``trace.jsonl`` are its leaves (lineage keys ``tree_id``, ``node_id``,
``parent_node``, ``branch_turn``); every span names the ``node`` it ran in, and a node that
split has its spans on its first child's line (docs/trace-schema.md). From them: each node's
commands and model work, each leaf's reward, and the work saved against independent
rollouts reaching the same leaves (docs/figures.md, "Work saved by branching").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

from sandfleet.analysis.schema import TreeFigures, TreeNode, WorkSaved
from sandfleet.analysis.trace import Rollout

WORK = ("commands", "command_s", "model_tokens", "model_calls")
"""What a node's work counts: commands run, their seconds, model tokens (prompt + completion), requests."""


@dataclass
class Node:
    """One node of a tree: what it ran (its own spans), and its leaves under it."""

    node_id: str
    commands: list[str] = field(default_factory=list)
    work: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WORK, 0.0))
    leaves: int = 0
    reward: float | None = None
    verdict: str | None = None
    rollout_id: str | None = None
    """Set on a leaf: its line's ``rollout_id``."""
    branch_s: float = 0.0
    """Seconds its branch took (the ``sandbox_start`` spans with ``what: branch``)."""


def _under(node: str, leaf: str) -> bool:
    return leaf == node or leaf.startswith(node + ".")


def trees_of(rollouts: Iterable[Rollout]) -> dict[str, dict[str, Node]]:
    """Tree id -> node id -> :class:`Node`, from final attempts (lines without lineage left out)."""
    lines = [r for r in rollouts if r.lineage]
    trees: dict[str, dict[str, Node]] = {}
    for r in lines:
        assert r.lineage is not None
        nodes = trees.setdefault(str(r.lineage["tree_id"]), {})
        leaf = str(r.lineage["node_id"])
        path = leaf.split(".")
        for depth in range(1, len(path) + 1):
            nid = ".".join(path[:depth])
            nodes.setdefault(nid, Node(nid))
        n = nodes[leaf]
        n.reward, n.verdict, n.rollout_id = r.reward, r.verdict, r.rollout_id
        for s in r.spans:
            owner = nodes.setdefault(str(s.attrs.get("node") or leaf), Node(str(s.attrs.get("node") or leaf)))
            if s.name == "agent_command":
                owner.commands.append(str(s.attrs.get("command", "")))
                owner.work["commands"] += 1
                owner.work["command_s"] += s.duration
            elif s.name == "model":
                owner.work["model_calls"] += 1
                owner.work["model_tokens"] += float(s.attrs.get("prompt_tokens") or 0) + float(
                    s.attrs.get("completion_tokens") or 0)
            elif s.name == "sandbox_start" and s.attrs.get("what") == "branch":
                owner.branch_s += s.duration
    for nodes in trees.values():
        leaves = [n for n in nodes.values() if n.rollout_id is not None]
        for node in nodes.values():
            node.leaves = sum(_under(node.node_id, leaf.node_id) for leaf in leaves)
    return trees


def work_saved(trees: Mapping[str, Mapping[str, Node]]) -> WorkSaved:
    """``ran`` (each node once), ``independent`` (each leaf's whole path alone), ``saved`` =
    independent - ran, and ``saved_fraction``, per measure of :data:`WORK`; with the
    branches' count and seconds beside it."""
    ran = dict.fromkeys(WORK, 0.0)
    independent = dict.fromkeys(WORK, 0.0)
    branches, branch_s = 0, 0.0
    for nodes in trees.values():
        for node in nodes.values():
            for k in WORK:
                ran[k] += node.work[k]
                independent[k] += node.leaves * node.work[k]
            if node.branch_s:
                branches += 1
                branch_s += node.branch_s
    saved = {k: independent[k] - ran[k] for k in WORK}
    return WorkSaved(trees=len(trees), leaves=sum(n.rollout_id is not None for t in trees.values() for n in t.values()),
                     ran=ran, independent=independent, saved=saved,
                     saved_fraction={k: (saved[k] / independent[k] if independent[k] else None) for k in WORK},
                     branches=branches, branch_s=branch_s)


def tree_figures(rollouts: Sequence[Rollout]) -> TreeFigures | None:
    """The report's ``trees`` entry: work saved, and each tree's nodes (None: no tree in the run)."""
    trees = trees_of(rollouts)
    if not trees:
        return None
    return TreeFigures(
        work_saved=work_saved(trees),
        trees={tid: {nid: TreeNode(commands=n.commands, work=n.work, leaves=n.leaves, reward=n.reward,
                                   verdict=n.verdict, rollout_id=n.rollout_id) for nid, n in sorted(nodes.items())}
               for tid, nodes in sorted(trees.items())})


MAX_DRAWN = 50
"""Trees drawn in the HTML report (the rest are counted)."""


def trees_html(figures: TreeFigures | None) -> str:
    """The HTML report's section: work saved, then each tree drawn as nested lists (a node
    with its commands; a leaf with its reward)."""
    if not figures:
        return ""
    ws = figures.work_saved
    rows = "".join(
        f"<tr><td>{escape(k)}</td><td>{ws.ran[k]:.6g}</td><td>{ws.independent[k]:.6g}</td>"
        f"<td>{ws.saved[k]:.6g}</td><td>{'-' if f is None else f'{100 * f:.1f} %'}</td></tr>"
        for k in WORK for f in [ws.saved_fraction[k]])
    out = [f"<h2 id='trees'>Trees (--branch)</h2><p class='note'>{ws.trees} trees, {ws.leaves} leaves, "
           f"{ws.branches} branches taking {ws.branch_s:.3f} s. Work saved against independent rollouts "
           "reaching the same leaves (docs/figures.md).</p>",
           "<table><thead><tr><th>work</th><th>ran</th><th>independent</th><th>saved</th><th>saved share</th>"
           f"</tr></thead><tbody>{rows}</tbody></table>"]
    drawn = list(figures.trees.items())[:MAX_DRAWN]
    for i, (tid, nodes) in enumerate(drawn):  # the first few open
        out.append(f"<details class='tree'{' open' if i < 5 else ''}><summary>tree {escape(tid)}</summary>"
                   f"{_draw('0', nodes)}</details>")
    if len(figures.trees) > MAX_DRAWN:
        out.append(f"<p class='note'>{len(figures.trees) - MAX_DRAWN} more trees not drawn.</p>")
    return "\n".join(out)


def _draw(nid: str, nodes: Mapping[str, TreeNode]) -> str:
    node = nodes.get(nid)
    if node is None:
        return ""
    kids = sorted((k for k in nodes if k.rpartition(".")[0] == nid), key=lambda k: int(k.rpartition(".")[2]))
    cmds = "".join(f"<li><code>{escape(c[:200])}</code></li>" for c in node.commands)
    label = f"<b>node {escape(nid)}</b>"
    if node.rollout_id is not None:
        reward = "masked" if node.verdict == "infra_fault" else f"reward {node.reward}"
        label += f" &mdash; leaf {escape(str(node.rollout_id))}, <b>{escape(reward)}</b>"
    else:
        label += f" &mdash; {node.leaves} leaves"
    inner = (f"<ul class='cmds'>{cmds}</ul>" if cmds else "") + (
        "<ul class='kids'>" + "".join(f"<li>{_draw(k, nodes)}</li>" for k in kids) + "</ul>" if kids else "")
    return f"<div class='node'>{label}{inner}</div>"
