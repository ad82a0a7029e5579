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


# -- trees (``--branch``, issue 44): a Miles generate function whose call is one branched
#    rollout, and the reward post-process that adds each leaf's tree advantage
BRANCH_KEY = "sandfleet_branch"
"""The sample-metadata key (or ``args.sandfleet_branch``, or ``$SANDFLEET_BRANCH``) giving the
tree's ``TURN:WIDTH[,...]``."""


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

    samples: list[Any]


async def generate_tree(input: Any) -> Any:
    """``--custom-generate-function-path``: one branched rollout of the sample's task per call
    (Miles' generate contract: ``input.args``, ``input.sample``, ``input.sampling_params``;
    returns ``GenerateFnOutput(samples=[...])``, one sample per leaf, in node order).

    The agent plays against Miles' rollout router (``http://{sglang_router_ip}:
    {sglang_router_port}/v1``; no session server: a tree's branches are not one session), the
    sandbox and conversation split at the plan's turns, every leaf is verified. Each leaf is a
    copy of the sample filled as slime's generate fills one (:func:`sandfleet.integrations.slime.generate`:
    ``tokens``, ``response``, ``loss_mask``, ``rollout_log_probs``, ``reward``, ``status``) and
    ``metadata["sandfleet"]`` with ``tree`` (lineage) and ``tree_advantages`` (per turn), and
    ``metadata["sandfleet_tree_advantage"]``: its own node's step advantage (its value minus its
    parent's), which :func:`post_process_rewards` adds to the group advantage. Options as slime's
    generate (``args.sandfleet_max_turns``, ``sandfleet_tool_mode``, ``sandfleet_tokenizer``,
    ``sandfleet_model``) and the plan (:func:`branch_of`)."""
    import copy

    from sandfleet.integrations._common import run_tree_task
    from sandfleet.integrations._tokens import leaf_order
    from sandfleet.integrations.slime import (
        TokenizationError,
        _masked,
        request_kwargs,
        router_url,
        tokenizer_for,
        trajectory,
    )
    from sandfleet.rollout.tree import tree_advantages

    args, sample = input.args, input.sample
    status = type(sample).Status
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    if TASK_KEY not in metadata:
        raise KeyError(f"the sample's metadata has no {TASK_KEY!r} (a task folder or a name under $SANDFLEET_TASKS)")
    plan = branch_of(args, metadata)
    task = resolve_task(str(metadata[TASK_KEY]))
    config = AgentConfig(max_turns=int(getattr(args, "sandfleet_max_turns", None) or 30),
                         tool_mode=getattr(args, "sandfleet_tool_mode", None) or "auto")
    policy = _TreeSession(router_url(args), sample.prompt, model=str(getattr(args, "sandfleet_model", None) or
                                                                     "default"),
                          request_kwargs=request_kwargs(input.sampling_params or {}), config=config)  # fmt: skip
    seed = int(getattr(sample, "index", None) or 0)
    try:
        leaves = await run_tree_task(task, policy, plan, Settings.from_env(), sample=seed)
    except Aborted:
        out = copy.deepcopy(sample)
        out.metadata = {**metadata, "sandfleet": {"verdict": INFRA, "fault": {"cause": "cancelled",
                                                                               "reason": "aborted"}}}
        return _output([_masked(out, status)])
    tree_advantages(leaves, plan)
    tokenizer = await tokenizer_for(args)
    samples = []
    for leaf in sorted(leaves, key=leaf_order):
        out = copy.deepcopy(sample)
        out.metadata = dict(metadata)
        verdict = verdict_of(leaf)
        own = [a for a in (leaf.tree_advantages or []) if a is not None]
        metrics = agent_metrics(leaf)
        info: dict[str, Any] = {"status": leaf.status, "verdict": verdict, "fault": leaf.fault, "reason": leaf.reason,
                "error": leaf.error, "stop_reason": leaf.stop_reason, "reward_details": leaf.reward_details,
                "agent_metrics": metrics, "rollout_id": leaf.rollout_id, "tree": leaf.tree,
                "tree_advantages": leaf.tree_advantages}  # fmt: skip
        out.metadata["sandfleet"] = info
        out.metadata["sandfleet_tree_advantage"] = own[-1] if own and verdict != INFRA else 0.0
        messages = policy.conversations.get(str(leaf.info.get("sandfleet_conversation")))
        try:
            traj = trajectory(tokenizer, messages or [], policy.turns_of(messages or []))
        except TokenizationError as e:
            info.update(verdict=INFRA, fault={"cause": "tokenization", "error": str(e)})
            samples.append(_masked(out, status))
            continue
        out.tokens = traj.prompt_ids + traj.response_ids
        out.response = tokenizer.decode(traj.response_ids)
        out.response_length = len(traj.response_ids)
        out.loss_mask = traj.loss_mask
        out.rollout_log_probs = traj.log_probs
        if hasattr(out, "non_generation_time"):
            out.non_generation_time = metrics["total_tool_time"]
        if verdict == INFRA or messages is None:
            samples.append(_masked(out, status))
            continue
        out.reward = float(leaf.reward or 0.0)
        out.status = status.TRUNCATED if leaf.stop_reason == "max_tokens" else status.COMPLETED
        samples.append(out)
    return _output(samples)


def _output(samples: list[Any]) -> Any:
    try:
        from miles.rollout.base_types import GenerateFnOutput  # Miles' own type, where installed
    except ImportError:
        return GenerateOutput(samples)
    return GenerateFnOutput(samples=samples)


def post_process_rewards(args: Any, samples: list[Any], **kwargs: Any) -> tuple[list[float], list[float]]:
    """``--custom-reward-post-process-path``: ``(raw_rewards, rewards)``, the rewards Miles takes
    its advantages from: per group (``group_index``), GRPO's ``(r - mean) / (std + 1e-6)`` (``r -
    mean`` when ``args.grpo_std_normalization`` is false) over the group's samples that are not
    ``ABORTED``, plus each sample's ``sandfleet_tree_advantage`` (:func:`generate_tree`; 0 for a
    straight rollout). An aborted (masked) sample gets 0."""
    raw = [float(s.reward) if isinstance(getattr(s, "reward", None), (int, float)) else 0.0 for s in samples]
    scale = getattr(args, "grpo_std_normalization", True) is not False
    groups: dict[Any, list[int]] = {}
    for i, s in enumerate(samples):
        if getattr(getattr(s, "status", None), "name", "") != "ABORTED":
            groups.setdefault(getattr(s, "group_index", None), []).append(i)
    out = [0.0] * len(samples)
    for members in groups.values():
        values = [raw[i] for i in members]
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
        for i in members:
            tree = float((getattr(samples[i], "metadata", None) or {}).get("sandfleet_tree_advantage") or 0.0)
            out[i] = ((raw[i] - mean) / (std + 1e-6) if scale else raw[i] - mean) + tree
    return raw, out
