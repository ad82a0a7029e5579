"""Rollouts that branch: at agent turn TURN a rollout's sandbox and conversation split into
WIDTH children that go on with independent model samples (``--branch TURN:WIDTH[,...]``).

A tree starts as one rollout (its root node, ``0``). When the agent has taken TURN turns
(the turn's commands ran, the next model request is not yet sent), the sandbox is branched
(``sandbox.branch(WIDTH)``), the conversation copied, and each child (``0.0`` .. ``0.W-1``)
plays on in its own sandbox with its own ``seed`` (the policy sends it with each request:
siblings sample independently, and the shipped scripted model picks a ``choices`` entry by
it). A second level splits each child again at its turn. Every node that ends (the agent
stopped, or the last level was reached) is a leaf: the verifier runs in its sandbox and it
is one rollout row, one trace line, with ``tree_id``, ``node_id``, ``parent_node`` and
``branch_turn``. A tree whose agent stops before the first split is one leaf (node ``0``).

The prefix runs once. Its spans (model calls, commands, the branch itself, the parent's
close) are on the line of the *first* child at each split (``.0`` all the way down): every
span carries the ``node`` it ran in, so a leaf's own spans are those of its ``node_id`` and
the ones of its ancestors are flagged by theirs; the other children's lines begin at the
instant of the split. Over a tree's lines every span appears once, so sums over a run stay
true (docs/trace-schema.md). A leaf's ``turns``, ``commands`` and token counts are its whole
trajectory's (what a trainer trains on).

Faults: a leaf's infra fault masks that leaf alone. A branch that fails, or a child that
comes back dead, is refilled in place from the same branch point (the parent is kept until
every child has started), up to the retry policy's attempts; a child still missing is a
failed leaf (phase ``start``: masked). A tree that fails before its first split is one leaf
and is retried whole like a straight rollout.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from sandfleet.errors import ConfigError, SandboxTimeoutError
from sandfleet.rollout.envrecord import inherit
from sandfleet.rollout.policy import AgentContext, TurnTaker
from sandfleet.rollout.record import make_tape
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.runner import (
    RetryPolicy,
    RolloutRequest,
    _close,
    _start,
    failure_reason,
    ready_sandbox,
    record_of,
    score,
)
from sandfleet.rollout.trace import SpanRecorder, now
from sandfleet.rollout.verdict import counted, settle, verdict_of
from sandfleet.sandbox.base import Sandbox
from sandfleet.traceschema import LINEAGE

log = logging.getLogger(__name__)

__all__ = ["LINEAGE", "BranchPlan", "parse_branch", "run_tree", "run_tree_with_retries", "tree_advantages"]
MAX_LEAVES = 1024
PROCESSES = ("error", "drop")


@dataclass(frozen=True)
class BranchPlan:
    """Where a tree splits: (turn, width) per level, turns strictly increasing."""

    levels: tuple[tuple[int, int], ...]

    @property
    def leaves(self) -> int:
        """Leaves of a tree that reaches every split."""
        return math.prod(w for _, w in self.levels)

    def __str__(self) -> str:
        return ",".join(f"{t}:{w}" for t, w in self.levels)


def parse_branch(text: str) -> BranchPlan:
    """``TURN:WIDTH[,TURN:WIDTH...]`` (``2:4``, ``1:2,3:2``); a clear ConfigError otherwise."""
    levels: list[tuple[int, int]] = []
    for part in str(text).split(","):
        part = part.strip()
        turn_s, sep, width_s = part.partition(":")
        try:
            turn, width = int(turn_s), int(width_s)
        except ValueError:
            turn = width = 0
            sep = ""
        if not sep:
            raise ConfigError(f"--branch {text!r}: {part!r} is not TURN:WIDTH (e.g. 2:4, or 1:2,3:2 for two levels)")
        if turn < 1:
            raise ConfigError(f"--branch {text!r}: the turn must be at least 1 (the split comes after that many "
                              f"agent turns), not {turn}")
        if width < 2:
            raise ConfigError(f"--branch {text!r}: the width must be at least 2 children, not {width}")
        if levels and turn <= levels[-1][0]:
            raise ConfigError(f"--branch {text!r}: the turns must increase level by level ({levels[-1][0]} then "
                              f"{turn})")
        levels.append((turn, width))
    plan = BranchPlan(tuple(levels))
    if plan.leaves > MAX_LEAVES:
        raise ConfigError(f"--branch {text!r}: {plan.leaves} leaves per tree, more than {MAX_LEAVES}")
    return plan


def check_policy(policy: Any) -> TurnTaker:
    """The policy, if it takes turns a tree can stop between; a ConfigError naming it otherwise."""
    if not isinstance(policy, TurnTaker):
        raise ConfigError(f"--branch needs an agent that takes turns (openai, or a ScriptedPolicy); "
                          f"{getattr(policy, 'name', type(policy).__name__)!r} does not")
    return policy


async def branch_sandbox(sandbox: Sandbox, n: int, processes: str) -> list[Sandbox]:
    """``n`` live sandboxes continuing from ``sandbox``'s state now (``sandbox.branch``:
    docs/branching.md says what each backend carries)."""
    kids = list(await sandbox.branch(n, processes="drop" if processes == "drop" else "error"))
    for kid in kids:  # the record of the image's venvs, taken before the agent's first command in the root
        inherit(kid, sandbox)
    return kids


@dataclass
class _Tree:
    req: RolloutRequest
    policy: TurnTaker
    plan: BranchPlan
    retry: RetryPolicy
    processes: str
    base_id: str
    model: Any = None
    leaves: list[RolloutResult] = field(default_factory=list)
    on_result: Callable[[RolloutResult], None] | None = None


async def run_tree(
    req: RolloutRequest, plan: BranchPlan, *, retry: RetryPolicy | None = None, processes: str = "error",
    on_result: Callable[[RolloutResult], None] | None = None,
) -> list[RolloutResult]:
    """Run one tree (one attempt); its leaves' results, each also given to ``on_result`` as it
    ends. Never raises for a failed tree; cancellation closes every sandbox and propagates."""
    if processes not in PROCESSES:
        raise ConfigError(f"processes must be error or drop, not {processes!r}")
    policy = check_policy(req.policy)
    base = req.rollout_id or f"{req.task.name}#{req.sample}"
    if req.attempt > 1:
        base += f"~{req.attempt}"
    tree = _Tree(req, policy, plan, retry or RetryPolicy(), processes, base, on_result=on_result)
    rec = SpanRecorder()
    rec.tags = {"node": "0"}
    result = _result(tree, rec, "0", None, None)
    async with policy.open_model() as model:
        tree.model = model
        await _root(tree, rec, result)
    return tree.leaves


async def run_tree_with_retries(
    req: RolloutRequest, plan: BranchPlan, retry: RetryPolicy, *, processes: str = "error",
    on_result: Callable[[RolloutResult], None] | None = None,
) -> list[RolloutResult]:
    """Attempts of a tree until one is kept: only a tree that failed before its first split
    (one leaf, node ``0``, an infra fault) is run again whole."""
    attempt = 1
    while True:
        req.attempt = attempt
        leaves = await run_tree(req, plan, retry=retry, processes=processes, on_result=on_result)
        if not (len(leaves) == 1 and not leaves[0].final):
            return leaves
        await asyncio.sleep(retry.backoff_s * 2 ** (attempt - 1))
        attempt += 1


def _result(tree: _Tree, rec: SpanRecorder, node: str, parent: str | None, turn: int | None,
            like: RolloutResult | None = None) -> RolloutResult:
    req = tree.req
    result = RolloutResult(
        rollout_id=f"{tree.base_id}/{node}", task=req.task.name, group=req.group or req.task.name,
        sample=req.sample, agent=req.policy.name, backend=like.backend if like else req.spec.backend,
        start=rec.start, end=rec.start, status="failed", spans=rec.spans, run_id=req.run_id, attempt=req.attempt,
        info=copy.deepcopy(like.info) if like else {},
    )  # fmt: skip
    result.tree = {"tree_id": tree.base_id, "node_id": node, "parent_node": parent, "branch_turn": turn}
    return result


async def _root(tree: _Tree, rec: SpanRecorder, result: RolloutResult) -> None:
    req = tree.req
    sandbox: Sandbox | None = None
    try:
        with rec.span("sandbox_start"):
            sandbox = await _start(req)
        await ready_sandbox(req, sandbox, rec, result)
    except asyncio.CancelledError:
        if sandbox is not None:
            await asyncio.shield(_close(sandbox, result))
        raise
    except Exception as e:
        result.reason, result.error = failure_reason(e), str(e) or type(e).__name__
        result.info["phase"] = "start"
        if sandbox is not None:
            with rec.span("other_sandbox", what="close"):
                await asyncio.shield(_close(sandbox, result))
        _leaf_done(tree, result, rec, None, e)
        return
    ctx = AgentContext(task=req.task, sandbox=sandbox, recorder=rec, deadline=now() + req.task.agent_timeout_s,
                       tape=make_tape(req.record), seed=req.sample)
    await _node(tree, "0", 0, ctx, tree.policy.begin(ctx), result, None)


async def _node(tree: _Tree, node: str, level: int, ctx: AgentContext, state: Any, result: RolloutResult,
                close_first: Sandbox | None) -> None:
    """Play node ``node`` from where its parent split (or from the start) to its split or its
    end; a leaf runs the verifier and is recorded, a split runs its children."""
    req, rec, sandbox = tree.req, ctx.recorder, ctx.sandbox
    phase, leaf, tape = "agent", True, ctx.tape
    failed_with: BaseException | None = None  # its type carries its cause (rollout/verdict.py)
    try:
        if close_first is not None:  # the parent, once every child has started (first child's line)
            with rec.span("other_sandbox", what="close", node=node.rpartition(".")[0]):
                await asyncio.shield(_close(close_first, result))
        until = tree.plan.levels[level][0] if level < len(tree.plan.levels) else None
        stop: str | None = None
        try:
            async with asyncio.timeout(ctx.remaining()):
                stop = await tree.policy.play(ctx, tree.model, state, until)
        except SandboxTimeoutError:
            raise
        except TimeoutError:
            stop = "agent_timeout"
        finally:
            result.turns, result.commands = ctx.turns, ctx.commands
            result.prompt_tokens, result.completion_tokens = ctx.prompt_tokens, ctx.completion_tokens
            result.info.update(ctx.info)
        if stop is None:  # the split
            leaf = False
            await _split(tree, node, level, ctx, state, result)
            return
        result.stop_reason = stop
        phase = "verifier"
        await score(req, sandbox, rec, result)
        result.status = "completed"
    except asyncio.CancelledError:
        result.status, result.reason, result.error = "cancelled", "cancelled", "rollout cancelled"
        raise
    except Exception as e:  # a failed leaf is a result, never a crash of the run
        result.reason, result.error = failure_reason(e), str(e) or type(e).__name__
        result.info["phase"] = phase
        failed_with = e
    finally:
        if leaf:
            with rec.span("other_sandbox", what="close"):
                await asyncio.shield(_close(sandbox, result))
            _leaf_done(tree, result, rec, tape, failed_with)


def _leaf_done(tree: _Tree, result: RolloutResult, rec: SpanRecorder, tape: Any,
               error: BaseException | None = None) -> None:
    result.end = rec.finish()
    settle(result, error)  # once, with the error it failed with: everything after reads the verdict
    if result.tree and result.tree["node_id"] == "0":  # never split: retried whole like a straight rollout
        result.final = not tree.retry.should_retry(result)
    if tape is not None:
        record_of(tape, tree.req, result)
        if result.record is not None:
            result.record["tree"] = dict(result.tree or {})
    tree.leaves.append(result)
    if tree.on_result is not None:
        tree.on_result(result)


async def _split(tree: _Tree, node: str, level: int, ctx: AgentContext, state: Any, parent: RolloutResult) -> None:
    """Branch the node's sandbox WIDTH ways (refilling children that fail to start from the same
    point), close it, and run the children."""
    turn, width = tree.plan.levels[level]
    rec = ctx.recorder
    kids: list[Sandbox] = []
    error: BaseException | None = None
    try:
        for attempt in range(1, tree.retry.max_attempts + 1):
            try:
                with rec.span("sandbox_start", what="branch", width=width - len(kids), attempt=attempt):
                    got = await branch_sandbox(ctx.sandbox, width - len(kids), tree.processes)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                error = e
                log.warning("branch of %s/%s failed (attempt %d): %s", tree.base_id, node, attempt, e)
            else:
                for kid in got:
                    if kid.alive:
                        kids.append(kid)
                    else:  # came back dead: refilled from the same point
                        error = RuntimeError(f"child sandbox {kid.id} was dead on arrival")
                        await _close(kid)
            if len(kids) == width:
                break
            await asyncio.sleep(tree.retry.backoff_s * 2 ** (attempt - 1))
        if len(kids) < width:
            parent.info["branch_refill_failed"] = width - len(kids)
    except BaseException:
        await asyncio.shield(asyncio.gather(*(_close(k) for k in kids), _close(ctx.sandbox)))
        raise
    children = []
    for i in range(width):
        crec = rec if i == 0 else rec.split()
        child = f"{node}.{i}"
        crec.tags = {"node": child}
        cres = _result(tree, crec, child, node, turn, like=parent)
        cres.turns, cres.commands = ctx.turns, ctx.commands
        cres.prompt_tokens, cres.completion_tokens = ctx.prompt_tokens, ctx.completion_tokens
        cctx = dataclasses.replace(
            ctx, sandbox=kids[i] if i < len(kids) else ctx.sandbox, recorder=crec, info=copy.deepcopy(ctx.info),
            tape=copy.deepcopy(ctx.tape), seed=i + width * (ctx.seed or 0), _session=None,
        )  # fmt: skip
        if i < len(kids):
            cctx._session = _carried_session(ctx, kids[i])
        children.append((child, cctx, copy.deepcopy(state), cres))
    for _, cctx, _, cres in children:
        cres.sandbox_id, cres.backend = cctx.sandbox.id, cctx.sandbox.backend
    runs: list[Coroutine[Any, Any, None]] = []
    for i, (child, cctx, cstate, cres) in enumerate(children):
        if i < len(kids):
            runs.append(_node(tree, child, level + 1, cctx, cstate, cres, ctx.sandbox if i == 0 else None))
        else:
            runs.append(_unborn(tree, cres, cctx.recorder, error))
    if not kids:  # nothing to close it after: close it here
        with rec.span("other_sandbox", what="close"):
            await asyncio.shield(_close(ctx.sandbox, parent))
    async with asyncio.TaskGroup() as tg:
        for run in runs:
            tg.create_task(run)


def _carried_session(ctx: AgentContext, kid: Sandbox) -> Any:
    """The child's continuation of the agent's shell session, where the branch carried the
    open sessions (``sandbox.sessions``, in order); None (a fresh one) otherwise."""
    mine, theirs = getattr(ctx.sandbox, "sessions", None), getattr(kid, "sessions", None)
    if ctx._session is None or not mine or not theirs:
        return None
    try:
        index = mine.index(ctx._session)
    except ValueError:
        return None
    return theirs[index] if index < len(theirs) else None


async def _unborn(tree: _Tree, result: RolloutResult, rec: SpanRecorder, error: BaseException | None) -> None:
    """A child that never started (the branch failed on every attempt): a failed leaf, masked."""
    e = error or RuntimeError("branch failed")
    result.reason, result.error = failure_reason(e), f"branch failed: {e}"
    result.info["phase"] = "start"
    result.sandbox_id = None
    _leaf_done(tree, result, rec, None, e)


# -- tree advantages (docs/figures.md, "Tree advantages")
def node_values(leaves: list[RolloutResult]) -> dict[str, dict[str, float | None]]:
    """Per tree, per node: the mean reward of its counted leaves (masked leaves left out; a
    policy fault counts 0); None where no leaf under it counts."""
    kept = {id(r) for r in counted(leaves)}
    trees: dict[str, dict[str, list[float]]] = {}
    for r in leaves:
        if not r.tree:
            continue
        nodes = trees.setdefault(r.tree["tree_id"], {})
        path = str(r.tree["node_id"]).split(".")
        for depth in range(1, len(path) + 1):
            bucket = nodes.setdefault(".".join(path[:depth]), [])
            if id(r) in kept and r.reward is not None:
                bucket.append(float(r.reward))
    return {t: {n: (sum(v) / len(v) if v else None) for n, v in nodes.items()} for t, nodes in trees.items()}


def tree_advantages(leaves: list[RolloutResult], plan: BranchPlan) -> dict[str, dict[str, float | None]]:
    """Set each leaf's ``tree_advantages`` (per turn of its trajectory: the value of the node
    that took the turn minus its parent's; 0 for the root's turns, which have no parent) and
    return the node values per tree."""
    values = node_values(leaves)
    for r in leaves:
        if not r.tree:
            continue
        vals = values.get(r.tree["tree_id"], {})
        path = str(r.tree["node_id"]).split(".")
        out: list[float | None] = []
        for t in range(1, r.turns + 1):
            depth = sum(1 for turn, _ in plan.levels if turn < t)  # splits before turn t
            depth = min(depth, len(path) - 1)
            if depth == 0:
                out.append(0.0)
                continue
            mine, up = vals.get(".".join(path[: depth + 1])), vals.get(".".join(path[:depth]))
            out.append(None if mine is None or up is None else mine - up)
        r.tree_advantages = out if verdict_of(r) != "infra_fault" else None
    return values
