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

from dataclasses import replace
from typing import Any

from sandfleet.errors import ConfigError
from sandfleet.integrations._common import LIVE, Aborted, Settings, agent_metrics, resolve_task, run_task
from sandfleet.integrations._session import SessionPolicy
from sandfleet.rollout.agent import AgentConfig
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
