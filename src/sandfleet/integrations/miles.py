"""Miles: sandfleet as the custom agent function of Miles' agentic rollouts.

    --custom-generate-function-path miles.rollout.generate_hub.agentic_tool_call.generate
    --custom-agent-function-path sandfleet.integrations.miles.run
    --custom-rm-path sandfleet.integrations.miles.custom_rm
    --use-session-server --tito-model <family>

Each call of :func:`run` is one rollout: a fresh sandbox for the task named by
``metadata["sandfleet_task"]`` (a task folder, or a name under ``$SANDFLEET_TASKS``),
sandfleet's agent loop against the session server at ``f"{base_url}/v1"`` (the whole
history every turn, assistant messages echoed verbatim: Miles records the tokens), the
task's verifier, and the reward. The returned dict is merged into the sample's metadata;
:func:`custom_rm` reads the reward back, and :func:`abort` ends every rollout and sandbox
of the process when Miles aborts oversampled work. No Miles import is needed: its call
shapes are plain Python.

**The mask.** A rollout's ``verdict`` (docs/rollouts.md) goes into the metadata. An
``infra_fault`` (masked: the agent could not have caused it) is passed to Miles in its own
mechanism, the sample status: :func:`custom_rm` sets the sample ``ABORTED``, and Miles'
aborted-group filter (``--dynamic-sampling-filter-path
miles.rollout.filter_hub.dynamic_sampling_filters.check_no_aborted``) drops the group and
samples it again, as for its own aborts, so the masked rollout enters neither the loss nor its
group's statistics. :func:`mask_infra_faults` (``--rollout-sample-filter-path``) is the
lighter alternative: ``remove_sample`` keeps the group but Miles still counts the removed
sample in the group's reward normalisation (at reward 0).
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass, replace
from typing import Any

from sandfleet.errors import ConfigError
from sandfleet.integrations._common import LIVE, Aborted, Settings, agent_metrics, resolve_task, run_task
from sandfleet.integrations._session import SessionPolicy
from sandfleet.rollout.loop import AgentConfig
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.verdict import INFRA, verdict_of

TASK_KEY = "sandfleet_task"
"""The sample-metadata key naming the task."""
OUTPUT_TAIL_CHARS = 4000
"""How much of the verifier's output goes into ``eval_report``."""


async def run(base_url: str, prompt: Any, request_kwargs: dict[str, Any], metadata: dict[str, Any],
              **kwargs: Any) -> dict[str, Any]:
    """One rollout of ``metadata["sandfleet_task"]`` against Miles' session server.

    Per-sample options in ``metadata``: ``sandfleet_max_turns``, ``sandfleet_tool_mode``
    (``auto``, ``tools``, ``text``); process-wide ones in the environment (``SANDFLEET_BACKEND``,
    ``SANDFLEET_NETWORK``, ``SANDFLEET_AGENT_USER``: :mod:`sandfleet.integrations._common`).
    Python callers may pass ``agent_config`` (an :class:`AgentConfig`), ``settings`` (a
    ``Settings``) and ``model`` (a :class:`~sandfleet.rollout.policy.Model` that answers in
    place of the session server at ``base_url``: a ``ChatClient`` with a transport of its own,
    an in-process engine).

    Returns ``reward`` (the verifier's; 0.0 for a policy fault; None for a masked rollout:
    an infra fault, or one Miles aborted), ``verdict`` (``scored``, ``policy_fault``,
    ``infra_fault``) and on a fault ``fault`` (its evidence), ``exit_status`` (why the agent
    stopped, or ``failed`` / ``aborted``), ``reward_details``, ``eval_report``,
    ``agent_metrics`` (``total_tool_time``, which Miles makes the sample's
    ``non_generation_time``; ``turns``, ``commands``, tokens, seconds per span) and
    ``sandfleet_spans`` (the rollout's trace spans, docs/trace-schema.md).
    """
    if TASK_KEY not in (metadata or {}):
        raise KeyError(f"the sample's metadata has no {TASK_KEY!r} (a task folder or a name under $SANDFLEET_TASKS)")
    task = resolve_task(str(metadata[TASK_KEY]))
    settings = kwargs.get("settings") or Settings.from_env()
    config = replace(kwargs.get("agent_config") or AgentConfig())  # a copy: per-sample options stay per sample
    if "sandfleet_max_turns" in metadata:
        config.max_turns = int(metadata["sandfleet_max_turns"])
    if "sandfleet_tool_mode" in metadata:
        config.tool_mode = metadata["sandfleet_tool_mode"]
    if "transport" in kwargs:
        raise ConfigError("miles.run takes a model, not a transport: pass model=ChatClient(url, name, transport=...)")
    if kwargs.get("model") is not None:
        policy = SessionPolicy("", prompt, model=kwargs["model"], request_kwargs=request_kwargs, config=config)
    else:
        policy = SessionPolicy(f"{base_url.rstrip('/')}/v1", prompt, model=str(metadata.get("model") or "default"),
                               request_kwargs=request_kwargs, config=config)
    try:
        result = await run_task(task, policy, settings, group=task.name)
    except Aborted:
        return {"reward": None, "exit_status": "aborted", "verdict": INFRA,
                "fault": {"cause": "cancelled", "reason": "aborted"}, "agent_metrics": {"turns": len(policy.turns)}}
    return outcome(result)


def outcome(result: RolloutResult) -> dict[str, Any]:
    """What :func:`run` returns for a finished rollout."""
    completed = result.status == "completed"
    verdict = verdict_of(result)
    return {
        "reward": None if verdict == INFRA else float(result.reward or 0.0),
        "verdict": verdict, **({"fault": result.fault} if result.fault else {}),
        "exit_status": result.stop_reason if completed else "failed",
        "reward_details": result.reward_details,
        "eval_report": {
            "status": result.status, "reason": result.reason, "error": result.error,
            "verifier_exit_code": result.verifier_exit_code,
            "verifier_output": result.verifier_output[-OUTPUT_TAIL_CHARS:],
        },
        "agent_metrics": agent_metrics(result),
        "sandfleet_spans": result.spans,
        "sandfleet_rollout": {"rollout_id": result.rollout_id, "task": result.task, "sandbox_id": result.sandbox_id,
                              "backend": result.backend, "start": result.start, "end": result.end},
    }  # fmt: skip


async def abort(args: Any = None) -> None:
    """Miles' abort hook: end every rollout and sandbox this process has in flight (each
    rollout closes its sandbox as it is cancelled); :func:`run` then returns ``aborted``."""
    await LIVE.abort()


async def custom_rm(args: Any, samples: Any, **kwargs: Any) -> float | list[float]:
    """``--custom-rm-path``: the reward :func:`run` put in the sample's metadata (0.0 if
    none); a list of samples (``--group-rm``) gives a list. A masked sample (its ``verdict``
    ``infra_fault``) is set ``ABORTED`` here, Miles' own status for a rollout that must not
    train (its slot gets 0.0, which the aborted-group filter discards with the group)."""
    if isinstance(samples, list):
        return [_reward(s) for s in samples]
    return _reward(samples)


def _reward(sample: Any) -> float:
    metadata = getattr(sample, "metadata", None) or {}
    if metadata.get("verdict") == INFRA:
        mark_aborted(sample)
        return 0.0
    reward = metadata.get("reward")
    return float(reward) if reward is not None else 0.0


def mark_aborted(sample: Any) -> None:
    """Set a Miles (or slime) ``Sample`` ``ABORTED`` through its own ``Status`` enum."""
    status = getattr(type(sample), "Status", None)
    if status is not None and hasattr(status, "ABORTED"):
        sample.status = status.ABORTED


def mask_infra_faults(args: Any, data: Any) -> None:
    """``--rollout-sample-filter-path``: leave masked samples out of the loss
    (``remove_sample = True``). Miles still counts removed samples in their group's reward
    normalisation; prefer :func:`custom_rm` with the aborted-group filter (module docs)."""
    stack = list(data)
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif (getattr(item, "metadata", None) or {}).get("verdict") == INFRA:
            item.remove_sample = True


# -- trees (``--branch``, issue 44): a Miles generate function whose group of samples is a set
#    of trees (one leaf a sample), and the reward post-process that adds the tree advantages
BRANCH_KEY = "sandfleet_branch"
"""The sample-metadata key (or ``args.sandfleet_branch``, or ``$SANDFLEET_BRANCH``) giving the
tree's ``TURN:WIDTH[,...]``."""
SAMPLES_KEY = "sandfleet_tree_samples"
"""``args.sandfleet_tree_samples`` (or the sample's metadata): how a leaf reaches Miles.
``turns`` (the default): a sample per run of turns that share a tree advantage, siblings of one
rollout (one ``rollout_id``), so that each turn trains with its own advantage; ``leaf``: one
sample, with its own step's advantage on all its tokens."""
SAMPLE_MODES = ("turns", "leaf")


class _TreeSession(SessionPolicy):
    """The session agent loop against Miles' router, played as a tree: each leaf's conversation
    is kept (:attr:`conversations`, by the key in its ``info``) and its turns found again among
    the policy's (:meth:`turns_of`)."""

    name = "openai-session-tree"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.conversations: dict[str, list[dict[str, Any]]] = {}

    async def play(self, ctx: Any, model: Any, state: Any, until_turn: int | None) -> str | None:
        stop = await super().play(ctx, model, state, until_turn)
        if stop is not None:
            key = f"c{len(self.conversations)}"
            self.conversations[key] = state.messages
            ctx.info["sandfleet_conversation"] = key
        return stop

    def turns_of(self, messages: list[dict[str, Any]]) -> list[Any]:
        """The turns of one leaf's conversation (each assistant message's request and choice)."""
        from sandfleet.integrations.slime import TokenizationError

        out = []
        for j, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            turn = next((t for t in self.turns if t.sent == j and t.message == m), None)
            if turn is None:
                raise TokenizationError(f"no recorded request for the reply at message {j}")
            out.append(turn)
        return out


def branch_of(args: Any, metadata: dict[str, Any]) -> Any:
    """The tree's plan: the sample's ``sandfleet_branch``, else ``args.sandfleet_branch``, else
    ``$SANDFLEET_BRANCH``; a ConfigError when none is given or it is malformed."""
    from sandfleet.rollout.tree import parse_branch
    from sandfleet.settings import environment

    spec = metadata.get(BRANCH_KEY) or getattr(args, "sandfleet_branch", None) or environment().get("SANDFLEET_BRANCH")
    if not spec:
        raise ConfigError(f"generate_tree needs a branch: metadata[{BRANCH_KEY!r}], args.sandfleet_branch or "
                          "$SANDFLEET_BRANCH (TURN:WIDTH[,TURN:WIDTH...])")
    return parse_branch(str(spec))


@dataclass
class GenerateOutput:
    """Miles' ``GenerateFnOutput`` fields (used where Miles is not importable)."""

    samples: Any


@dataclass
class _Grown:
    """A group's trees once grown: each leaf with the policy that played its tree."""

    leaves: list[tuple[RolloutResult, _TreeSession]]
    planned: int


@dataclass
class _Group:
    size: int
    growth: asyncio.Task[_Grown] | None = None
    claimed: int = 0
    waiting: int = 0
    done_at: float | None = None
    """When its last waiting call ended (the group kept for samples still to come)."""


STALE_GROUP_S = 600.0
"""A grown group whose other samples have not come for this long is forgotten (Miles retried or
dropped them): its leaves are not held for ever."""


class TreeGroups:
    """The groups Miles is generating (``group_index`` -> its trees): Miles calls the generate
    function once per sample, the ``n_samples_per_prompt`` samples of a group concurrently; the
    first call of a group starts its trees, each call claims the next leaf (in the order the
    calls come, which is Miles' order of the group's samples), and the group is forgotten when
    every sample has taken its leaf. When every call waiting on a growth is cancelled (Miles'
    abort), the growth is cancelled with them: its sandboxes close."""

    def __init__(self) -> None:
        self._groups: dict[Any, _Group] = {}

    def claim(self, key: Any, size: int) -> tuple[_Group, int]:
        now = time.monotonic()
        for k in [k for k, g in self._groups.items() if g.done_at is not None and now - g.done_at > STALE_GROUP_S]:
            del self._groups[k]
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(size)
        elif group.size != size:
            raise ConfigError(f"group {key!r} was opened with {group.size} samples, this sample says {size}")
        if group.claimed >= group.size:
            raise ConfigError(f"group {key!r} has {group.size} samples (n_samples_per_prompt) and all have taken "
                              "their leaf; each sample of a group must have its own index")  # fmt: skip
        group.claimed += 1
        return group, group.claimed - 1

    async def wait(self, key: Any, group: _Group) -> _Grown:
        assert group.growth is not None
        group.waiting += 1
        try:
            return await asyncio.shield(group.growth)
        finally:
            group.waiting -= 1
            if group.waiting == 0:
                if not group.growth.done():  # every call waiting on it was cancelled
                    group.growth.cancel()
                    self._groups.pop(key, None)
                elif group.claimed >= group.size:
                    self._groups.pop(key, None)
                else:
                    group.done_at = time.monotonic()

    def __len__(self) -> int:
        return len(self._groups)


GROUPS = TreeGroups()
"""This process's groups in generation (Miles' rollout manager: one process, one event loop)."""


async def _grow(args: Any, sample: Any, metadata: dict[str, Any], plan: Any, trees: int,
                sampling_params: dict[str, Any]) -> _Grown:
    """``trees`` trees of the sample's task, concurrently, each against Miles' router with a
    policy of its own (seeds: the group's index times ``trees`` plus the tree's number)."""
    from sandfleet.integrations._common import run_tree_task
    from sandfleet.integrations._tokens import leaf_order
    from sandfleet.integrations.slime import request_kwargs, router_url
    from sandfleet.rollout.tree import tree_advantages

    task = resolve_task(str(metadata[TASK_KEY]))
    config = AgentConfig(max_turns=int(getattr(args, "sandfleet_max_turns", None) or 30),
                         tool_mode=getattr(args, "sandfleet_tool_mode", None) or "auto")
    model = str(getattr(args, "sandfleet_model", None) or "default")
    kwargs = request_kwargs(sampling_params)
    policies = [_TreeSession(router_url(args), sample.prompt, model=model, request_kwargs=kwargs, config=config)
                for _ in range(trees)]  # fmt: skip
    base = int(getattr(sample, "group_index", None) or 0) * trees
    settings = Settings.from_env()
    grown = await asyncio.gather(*(run_tree_task(task, p, plan, settings, sample=base + t)
                                   for t, p in enumerate(policies)))  # fmt: skip
    tree_advantages([leaf for leaves in grown for leaf in leaves], plan)
    pairs = [(leaf, p) for leaves, p in zip(grown, policies, strict=True) for leaf in sorted(leaves, key=leaf_order)]
    return _Grown(pairs, planned=trees * plan.leaves)


def turn_runs(per_turn: list[float | None] | None, turns: int) -> list[tuple[int, int, float]]:
    """The leaf's turns as runs that share a tree advantage: ``(first, last, advantage)``, turns
    counted from 1 (a turn whose advantage is unknown counts 0.0, as in TRL and verl)."""
    values = [float(v) if v is not None else 0.0 for v in (per_turn or [])]
    values = (values + [0.0] * turns)[:turns]
    runs: list[tuple[int, int, float]] = []
    for t, v in enumerate(values, start=1):
        if runs and runs[-1][2] == v:
            runs[-1] = (runs[-1][0], t, v)
        else:
            runs.append((t, t, v))
    return runs


async def generate_tree(input: Any) -> Any:
    """``--custom-generate-function-path``: the samples of a group (``n_samples_per_prompt`` of
    them, one ``group_index``) are the leaves of ``n / leaves`` trees of the sample's task (Miles'
    generate contract: ``input.args``, ``input.sample``, ``input.sampling_params``; returns
    ``GenerateFnOutput(samples=...)``).

    The group's first call grows its trees against Miles' rollout router (``http://{sglang_router_ip}:
    {sglang_router_port}/v1``; no session server: a tree's branches are not one session): the
    sandbox and conversation split at the plan's turns, every leaf is verified. Each call then
    answers one leaf, filled as slime's generate fills a sample (:func:`sandfleet.integrations.slime.generate`:
    ``tokens``, ``response``, ``loss_mask``, ``rollout_log_probs``, ``reward``, ``status``), with
    ``metadata["sandfleet"]`` (verdict, ``tree`` lineage, per-turn ``tree_advantages``):

    - ``turns`` (:data:`SAMPLES_KEY`, the default): a sample per run of turns that share a tree
      advantage (the prefix's, each split's), siblings of one rollout in Miles' own sense: one
      ``rollout_id`` (the sample's), one reward, the prefix up to the run as context and the
      run's tokens alone in the ``loss_mask``; each sibling's ``metadata["sandfleet_tree_advantage"]``
      is its run's advantage. Miles' loss takes one token-weighted mean per rollout over its
      siblings, so each turn trains with the group advantage plus its own tree advantage, as in
      TRL and verl.
    - ``leaf``: one sample, its ``sandfleet_tree_advantage`` its own step's (the last split's).

    :func:`post_process_rewards` adds ``sandfleet_tree_advantage`` to the group advantage. A leaf
    the trees did not grow (a tree that stopped before a split) is an ``ABORTED`` filler. Options
    as slime's generate (``args.sandfleet_max_turns``, ``sandfleet_tool_mode``,
    ``sandfleet_tokenizer``, ``sandfleet_model``) and the plan (:func:`branch_of`)."""
    args, sample = input.args, input.sample
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    if TASK_KEY not in metadata:
        raise KeyError(f"the sample's metadata has no {TASK_KEY!r} (a task folder or a name under $SANDFLEET_TASKS)")
    plan = branch_of(args, metadata)
    mode = str(metadata.get(SAMPLES_KEY) or getattr(args, SAMPLES_KEY, None) or "turns")
    if mode not in SAMPLE_MODES:
        raise ConfigError(f"{SAMPLES_KEY} must be one of {', '.join(SAMPLE_MODES)}, not {mode!r}")
    n = getattr(args, "n_samples_per_prompt", None)
    if not isinstance(n, int) or n < 1:
        raise ConfigError("generate_tree needs args.n_samples_per_prompt (a group's samples are its trees' leaves)")
    if n % plan.leaves:
        raise ConfigError(f"n_samples_per_prompt {n} is not a multiple of the {plan.leaves} leaves of a "
                          f"{','.join(f'{t}:{w}' for t, w in plan.levels)} tree")  # fmt: skip
    key = getattr(sample, "group_index", None)
    if key is None:
        raise ConfigError("generate_tree needs the sample's group_index (Miles sets it: the samples of one prompt)")
    group, k = GROUPS.claim(key, n)
    if group.growth is None:
        group.growth = asyncio.ensure_future(_grow(args, sample, metadata, plan, n // plan.leaves,
                                                   dict(input.sampling_params or {})))
    try:
        grown = await GROUPS.wait(key, group)
    except Aborted:
        return _masked_copy(sample, metadata, {"verdict": INFRA, "fault": {"cause": "cancelled", "reason": "aborted"}})
    if k >= len(grown.leaves):
        return _masked_copy(sample, metadata, {"filler": True, "reason": f"the trees grew {len(grown.leaves)} "
                                               f"leaves of the {grown.planned} planned"})  # fmt: skip
    leaf, policy = grown.leaves[k]
    return _output(await _leaf_samples(args, sample, metadata, leaf, policy, mode))


def _masked_copy(sample: Any, metadata: dict[str, Any], info: dict[str, Any]) -> Any:
    """Miles' output for a call with no leaf to train: a copy of the sample, ``ABORTED``, with
    ``info`` as its ``metadata["sandfleet"]``."""
    from sandfleet.integrations.slime import _masked

    out = copy.deepcopy(sample)
    out.metadata = {**metadata, "sandfleet": info}
    return _output([_masked(out, type(sample).Status)])


async def _leaf_samples(args: Any, sample: Any, metadata: dict[str, Any], leaf: RolloutResult,
                        policy: _TreeSession, mode: str) -> list[Any]:
    from sandfleet.integrations.slime import TokenizationError, _masked, tokenizer_for, trajectory

    status = type(sample).Status
    out = copy.deepcopy(sample)
    out.metadata = dict(metadata)
    verdict = verdict_of(leaf)
    per_turn = leaf.tree_advantages
    metrics = agent_metrics(leaf)
    info: dict[str, Any] = {"status": leaf.status, "verdict": verdict, "fault": leaf.fault, "reason": leaf.reason,
                            "error": leaf.error, "stop_reason": leaf.stop_reason, "reward_details": leaf.reward_details,
                            "agent_metrics": metrics, "rollout_id": leaf.rollout_id, "tree": leaf.tree,
                            "tree_advantages": per_turn}  # fmt: skip
    out.metadata["sandfleet"] = info
    own = [a for a in (per_turn or []) if a is not None]
    out.metadata["sandfleet_tree_advantage"] = own[-1] if own and verdict != INFRA else 0.0
    if getattr(out, "rollout_id", None) is None:
        out.rollout_id = getattr(sample, "index", None)  # Miles' key of a rollout's siblings
    messages = policy.conversations.get(str(leaf.info.get("sandfleet_conversation")))
    tokenizer = await tokenizer_for(args)
    try:
        traj = trajectory(tokenizer, messages or [], policy.turns_of(messages or []))
    except TokenizationError as e:
        info.update(verdict=INFRA, fault={"cause": "tokenization", "error": str(e)})
        return [_masked(out, status)]
    out.tokens = traj.prompt_ids + traj.response_ids
    out.response = tokenizer.decode(traj.response_ids)
    out.response_length = len(traj.response_ids)
    out.loss_mask = traj.loss_mask
    out.rollout_log_probs = traj.log_probs
    if hasattr(out, "non_generation_time"):
        out.non_generation_time = metrics["total_tool_time"]
    if verdict == INFRA or messages is None:
        return [_masked(out, status)]
    out.reward = float(leaf.reward or 0.0)
    truncated = leaf.stop_reason == "max_tokens"
    out.status = status.TRUNCATED if truncated else status.COMPLETED
    runs = turn_runs(per_turn, len(traj.turn_ends))
    if mode == "leaf" or len(runs) < 2:
        return [out]
    samples = []
    for first, last, value in runs:
        begin, end = (traj.turn_ends[first - 2] if first > 1 else 0), traj.turn_ends[last - 1]
        part = copy.deepcopy(out)
        part.tokens = traj.prompt_ids + traj.response_ids[:end]
        part.response = tokenizer.decode(traj.response_ids[:end])
        part.response_length = end
        part.loss_mask = [m if begin <= i else 0 for i, m in enumerate(traj.loss_mask[:end])]
        part.rollout_log_probs = traj.log_probs[:end] if traj.log_probs is not None else None
        part.status = status.TRUNCATED if truncated and last == runs[-1][1] else status.COMPLETED
        part.metadata["sandfleet_tree_advantage"] = value
        part.metadata["sandfleet_turns"] = [first, last]
        samples.append(part)
    return samples


def _output(samples: list[Any]) -> Any:
    body: Any = samples[0] if len(samples) == 1 else samples
    try:
        from miles.rollout.base_types import GenerateFnOutput  # Miles' own type, where installed
    except ImportError:
        return GenerateOutput(body)
    return GenerateFnOutput(samples=body)


def post_process_rewards(args: Any, samples: list[Any], **kwargs: Any) -> tuple[list[float], list[float]]:
    """``--custom-reward-post-process-path``: ``(raw_rewards, rewards)``, the rewards Miles takes
    its advantages from: per group (``group_index``), GRPO's ``(r - mean) / (std + 1e-6)`` (``r -
    mean`` when ``args.grpo_std_normalization`` is false) over the group's rollouts that are not
    ``ABORTED`` (a rollout counted once however many siblings it has: Miles' ``rollout_id``, else
    its ``index``), plus each sample's ``sandfleet_tree_advantage`` (:func:`generate_tree`; 0 for
    a straight rollout). An aborted (masked) sample gets 0."""
    raw = [float(s.reward) if isinstance(getattr(s, "reward", None), (int, float)) else 0.0 for s in samples]
    scale = getattr(args, "grpo_std_normalization", True) is not False
    groups: dict[Any, dict[Any, list[int]]] = {}
    for i, s in enumerate(samples):
        if getattr(getattr(s, "status", None), "name", "") != "ABORTED":
            rid = getattr(s, "rollout_id", None)
            rid = rid if rid is not None else getattr(s, "index", None)
            rollouts = groups.setdefault(getattr(s, "group_index", None), {})
            rollouts.setdefault(rid if rid is not None else ("row", i), []).append(i)
    out = [0.0] * len(samples)
    for rollouts in groups.values():
        values = [raw[members[0]] for members in rollouts.values()]
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
        for members in rollouts.values():
            for i in members:
                tree = float((getattr(samples[i], "metadata", None) or {}).get("sandfleet_tree_advantage") or 0.0)
                out[i] = ((raw[i] - mean) / (std + 1e-6) if scale else raw[i] - mean) + tree
    return raw, out
