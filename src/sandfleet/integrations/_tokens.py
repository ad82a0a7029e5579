"""The trainer's own model seen token by token, and groups of branched rollouts grown with it
(``--branch``, issue 44): what the TRL and verl integrations share.

A trainer samples with its own model (a :class:`TokenEngine`: TRL's in-process model, verl's
rollout servers). :class:`TokenModel` is sandfleet's ``Model`` over it and keeps each
conversation's tokens exactly as sampled; :class:`TreeAgent` plays a task with it in fenced bash
blocks; :func:`grow_group` grows one GRPO group of trees of a task and returns a
:class:`TreeRow` per leaf: the tokens, the model's mask, the reward by its verdict, and each
completion token's tree advantage (that of the turn it was sampled in; docs/figures.md).
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandfleet.integrations._common import reward_of
from sandfleet.integrations._session import SessionPolicy
from sandfleet.rollout.policy import AgentContext
from sandfleet.rollout.result import RolloutResult
from sandfleet.tasks import Task

_FENCE = re.compile(r"```[ \t]*(?:bash|sh|shell|console)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


TREE_KEY = "sandfleet_trajectory"
"""The key an assistant message of a :class:`TokenModel` conversation carries: its trajectory's id."""
COMBINE = ("sum", "tree", "group")


class TokenEngine(Protocol):
    """The trainer's model seen token by token: how :class:`TokenModel` renders a conversation
    and samples a reply. :class:`HFEngine` is one over a transformers model; tests use
    :class:`sandfleet.testing.token_engine.CharEngine`."""

    eos_id: int

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The conversation as the model reads it, with the prompt of the assistant's next turn."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], *, skip_special: bool) -> str: ...

    async def generate(self, ids: list[int], *, seed: int | None, max_tokens: int | None,
                       temperature: float | None) -> list[int]:
        """Sampled token ids after ``ids`` (the end-of-turn token included when it was sampled)."""
        ...


@dataclass
class Trajectory:
    """A conversation's tokens so far: the first request's ``prompt_ids``, then the
    completion: the model's tokens (``mask`` 1, ``turn`` its turn number, from 1) and the
    template's glue and the commands' output between them (``mask`` 0, ``turn`` 0)."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    broken: str | None = None
    """Why the tokens are not what the model saw (the template did not render the next request
    as an extension of the last one): such a leaf is not trained on."""

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


class TokenModel:
    """A :class:`~sandfleet.rollout.policy.Model` over a :class:`TokenEngine` that keeps every
    conversation's tokens exactly as sampled: the next request of a conversation is its last
    tokens plus the template's new text, never a re-tokenization of the whole, so the
    trajectory trained on is the one sampled. Each reply's message carries
    ``sandfleet_trajectory``, an id into :attr:`trajectories` (a tree copies conversations at
    each split, so a leaf's last reply names its whole path)."""

    def __init__(self, engine: TokenEngine, *, model: str = "trainer"):
        self.engine = engine
        self.model = model
        self.trajectories: dict[str, Trajectory] = {}
        self._ids = itertools.count()

    async def complete(self, messages: list[dict[str, Any]], **opts: Any) -> Any:
        from sandfleet.rollout.chat import ChatReply

        clean = [{k: v for k, v in m.items() if k != TREE_KEY} for m in messages]
        text = self.engine.render(clean)
        last = next((m.get(TREE_KEY) for m in reversed(messages) if m.get("role") == "assistant"), None)
        before = self.trajectories.get(str(last)) if last is not None else None
        if before is None:
            traj = Trajectory(self.engine.encode(text))
        else:
            traj = Trajectory(list(before.prompt_ids), list(before.completion_ids), list(before.mask),
                              list(before.turn), before.broken)  # fmt: skip
            seen = self.engine.decode(before.ids, skip_special=False)
            if text.startswith(seen):
                glue = self.engine.encode(text[len(seen):])
            else:  # the template re-rendered the past differently: train on nothing of this leaf
                glue = self.engine.encode(text)[len(before.ids):]
                traj.broken = traj.broken or "the chat template does not render the conversation as a growing prefix"
            traj.completion_ids += glue
            traj.mask += [0] * len(glue)
            traj.turn += [0] * len(glue)
        extra = opts.get("extra") or {}
        seed = extra.get("seed")
        gen = await self.engine.generate(traj.ids, seed=seed if isinstance(seed, int) else None,
                                         max_tokens=opts.get("max_tokens"), temperature=opts.get("temperature"))
        turn = sum(1 for m in messages if m.get("role") == "assistant") + 1
        prompt_len = len(traj.ids)
        traj.completion_ids += gen
        traj.mask += [1] * len(gen)
        traj.turn += [turn] * len(gen)
        key = f"t{next(self._ids)}"
        self.trajectories[key] = traj
        content = self.engine.decode(gen, skip_special=True)
        finish = "stop" if gen and gen[-1] == self.engine.eos_id else "length"
        message = {"role": "assistant", "content": content, TREE_KEY: key}
        return ChatReply(content=content, finish_reason=finish, prompt_tokens=prompt_len, completion_tokens=len(gen),
                         raw_message=message, raw_choice={"message": message, "finish_reason": finish})


class TreeAgent(SessionPolicy):
    """The agent loop from the trainer's prompt over a :class:`TokenModel` (fenced bash blocks);
    a leaf notes its last reply's trajectory in ``info["sandfleet_trajectory"]``."""

    name = "token-tree"

    async def _run_reply(self, ctx: AgentContext, reply: Any, messages: list[dict[str, Any]]) -> bool:
        """As the agent loop's, and a reply cut at its token limit inside a fence runs what it
        holds (as :func:`extract_script` reads a single-turn completion)"""
        from sandfleet.rollout.loop import fenced_commands

        text = reply.content
        if reply.tool_calls or fenced_commands(text) or text.count("```") % 2 == 0:  # no fence left open
            return bool(await super()._run_reply(ctx, reply, messages))
        blocks = [b.strip("\n") for b in _FENCE.findall(text[text.rfind("```"):]) if b.strip()]
        if not blocks:
            return False
        outputs = [await self._execute(ctx, b, self.config.max_output_chars) for b in blocks]
        messages.append({"role": "user", "content": "\n\n".join(outputs)})
        return True

    async def play(self, ctx: AgentContext, model: Any, state: Any, until_turn: int | None) -> str | None:
        stop = await super().play(ctx, model, state, until_turn)
        if stop is not None:
            ctx.info[TREE_KEY] = next((m.get(TREE_KEY) for m in reversed(state.messages)
                                       if m.get("role") == "assistant"), None)  # fmt: skip
        return stop


def token_advantages(turns: Sequence[int], per_turn: Sequence[float | None] | None) -> list[float]:
    """Each completion token's tree advantage: that of the turn it was sampled in (glue and
    output tokens, turn 0, get 0.0; so does a turn whose value is None)."""
    values = list(per_turn or [])
    out: list[float] = []
    for t in turns:
        v = values[t - 1] if 0 < t <= len(values) else None
        out.append(float(v) if v is not None else 0.0)
    return out


def combine_advantages(group: float, tokens: Sequence[float], combine: str = "sum") -> list[float]:
    """A completion's per-token advantage: TRL's group advantage plus the token's tree advantage
    (``sum``, Tree-GRPO's inter-tree plus intra-tree terms), the tree advantage alone (``tree``),
    or the group advantage alone (``group``)."""
    if combine not in COMBINE:
        raise ValueError(f"combine must be one of {', '.join(COMBINE)}, not {combine!r}")
    if combine == "group":
        return [group] * len(tokens)
    return [t + (group if combine == "sum" else 0.0) for t in tokens]


@dataclass
class TreeRow:
    """One completion a trainer gets from a group of trees (:func:`grow_group`): a leaf, or a filler where a tree grew
    fewer leaves than its plan (reward None, nothing trained)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    reward: float | None
    tree_advantages: list[float]
    """Per completion token."""
    leaf: RolloutResult | None = None


class TreeRunner(Protocol):
    """What grows a tree (the TRL integration's ``Runner``)."""

    async def tree(self, task: Task, policy: Any, plan: Any, *, sample: int = 0, processes: str = "error",
                   info: dict[str, Any] | None = None) -> list[RolloutResult]: ...


def leaf_order(leaf: RolloutResult) -> list[int]:
    """A leaf's place in its tree: its node id's numbers (``0.2.1`` -> ``[0, 2, 1]``)."""
    return [int(x) for x in str((leaf.tree or {}).get("node_id", "0")).split(".")]


async def grow_group(runner: TreeRunner, task: Task, prompt: Any, plan: Any, trees: int, model: TokenModel,
                     agent: Any, *, processes: str = "error") -> list[TreeRow]:
    """One GRPO group: ``trees`` trees of ``task`` by ``agent(k)`` (the k-th tree's agent, a
    :class:`TreeAgent` over ``model``), grown at once; a :class:`TreeRow` per leaf, tree by tree
    and in node order within a tree, ``plan.leaves`` per tree (a filler row, reward None, where a
    tree grew fewer). Each leaf's per-turn tree advantages are set over the whole group
    (:func:`sandfleet.rollout.tree.tree_advantages`) and spread over its completion tokens."""
    from sandfleet.rollout.tree import tree_advantages

    grown = await asyncio.gather(*(runner.tree(task, agent(k), plan, sample=k, processes=processes)
                                   for k in range(trees)))  # fmt: skip
    every = [leaf for tree in grown for leaf in tree]
    tree_advantages(every, plan)  # sets each leaf's per-turn list
    engine = model.engine
    first = engine.encode(engine.render([dict(m) for m in prompt])) if isinstance(prompt, list) else [engine.eos_id]
    rows: list[TreeRow] = []
    for tree in grown:
        mine = sorted(tree, key=leaf_order)
        for leaf in mine:
            traj = model.trajectories.get(str(leaf.info.get(TREE_KEY)))
            if traj is None or traj.broken or not traj.completion_ids:
                rows.append(TreeRow(first, [engine.eos_id], [0], None, [0.0], leaf))
                continue
            rows.append(TreeRow(traj.prompt_ids, traj.completion_ids, traj.mask, reward_of(leaf),
                                token_advantages(traj.turn, leaf.tree_advantages), leaf))  # fmt: skip
        rows += [TreeRow(first, [engine.eos_id], [0], None, [0.0]) for _ in range(plan.leaves - len(mine))]
    return rows
