"""What one rollout produced: its reward, why it stopped or failed, and its spans."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from sandfleet.rollout.verdict import Verdict, counted, verdict_of
from sandfleet.traceschema import SCHEMA

Status = Literal["completed", "failed", "cancelled"]


@dataclass
class RolloutResult:
    """One attempt of one rollout. ``to_trace()`` is its ``trace.jsonl`` line (the schema in
    docs/trace-schema.md); ``to_record()`` its ``rollouts.jsonl`` line (outputs included)."""

    rollout_id: str
    task: str
    group: str
    sample: int
    agent: str
    backend: str
    start: float
    end: float
    status: Status
    spans: list[dict[str, Any]]
    run_id: str = ""
    attempt: int = 1
    final: bool = True
    """The rollout's last attempt (False: a failed attempt that was retried)."""
    sandbox_id: str | None = None
    error: str | None = None
    reason: str | None = None
    """Short cause of a failure (``model_unreachable``, ``image_build``, ``cancelled`` ...)."""
    reward: float | None = None
    reward_details: dict[str, float] = field(default_factory=dict)
    advantage: float | None = None
    """GRPO advantage within the group, set when the group is complete."""
    stop_reason: str | None = None
    """Why the agent stopped: ``done``, ``max_turns``, ``max_tokens``, ``agent_timeout``."""
    turns: int = 0
    commands: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    verifier_exit_code: int | None = None
    verifier_output: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    verdict: Verdict | None = None
    """``scored``, ``policy_fault`` (reward 0) or ``infra_fault`` (masked: reward None), given
    by :func:`sandfleet.rollout.verdict.settle` when the attempt ends (docs/rollouts.md), once;
    everything else reads it."""
    contention: dict[str, Any] = field(default_factory=dict)
    """Per phase (``agent``, ``verifier``): how much the sandbox's runnable threads waited for
    a CPU because of work outside it, and its own throttling
    (:mod:`sandfleet.sandbox.contention`); a phase's value is None where the backend can't
    measure it, and absent where the phase never began."""
    fault: dict[str, Any] | None = None
    """A fault's evidence: ``cause``, ``phase``, ``reason``, ``sandbox_end``, ``log_tail``."""
    tree: dict[str, Any] | None = None
    """A leaf of a branched rollout (``--branch``, :mod:`sandfleet.rollout.tree`): its
    ``tree_id``, ``node_id``, ``parent_node`` and ``branch_turn``; None for a straight one."""
    tree_advantages: list[float | None] | None = None
    """Per turn of a leaf's trajectory, its node's value minus its parent's (Tree-GRPO's
    intra-tree advantage; docs/figures.md), set when the group is complete."""
    record: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    """What replay needs to run it again (:mod:`sandfleet.rollout.record`), when the run
    records: its ``records.jsonl`` line, kept out of the trace and ``rollouts.jsonl``."""

    @property
    def masked(self) -> bool:
        """An infra fault: left out of pass rates and GRPO statistics, reward None."""
        return verdict_of(self) == "infra_fault"

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def passed(self) -> bool:
        return self.status == "completed" and self.reward is not None and self.reward >= 1.0 - 1e-9

    def span_seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.spans:
            out[s["name"]] = out.get(s["name"], 0.0) + s["end"] - s["start"]
        return out

    def to_trace(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "run_id": self.run_id, "rollout_id": self.rollout_id,
            "task": self.task, "group": self.group, "sample": self.sample,
            "attempt": self.attempt, "final": self.final, "sandbox_id": self.sandbox_id, "backend": self.backend,
            "agent": self.agent, "start": self.start, "end": self.end, "status": self.status,
            "error": self.error, "reason": self.reason, "verdict": verdict_of(self), "reward": self.reward,
            **(self.tree or {}),
            **({"fault": self.fault} if self.fault else {}),
            **({"contention": self.contention} if self.contention else {}), "spans": self.spans,
        }  # fmt: skip

    def to_record(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id, "task": self.task, "group": self.group,
            "sample": self.sample, "attempt": self.attempt, "final": self.final, "agent": self.agent,
            "status": self.status, "verdict": verdict_of(self), "reason": self.reason, "error": self.error,
            **({"fault": self.fault} if self.fault else {}), "reward": self.reward,
            "reward_details": self.reward_details,
            "advantage": self.advantage, "passed": self.passed, "stop_reason": self.stop_reason,
            "turns": self.turns, "commands": self.commands, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "duration_s": self.duration,
            "spans_s": self.span_seconds(), "sandbox_id": self.sandbox_id,
            "verifier_exit_code": self.verifier_exit_code, "verifier_output": self.verifier_output,
            "contention": self.contention, "info": self.info,
            **({**self.tree, "tree_advantages": self.tree_advantages} if self.tree else {}),
        }  # fmt: skip


def group_advantages(results: list[RolloutResult], eps: float = 1e-6) -> dict[str, Any]:
    """GRPO statistics of one group: (r - mean) / (std + eps) over its scored and policy-fault
    rollouts (a policy fault counts as reward 0); masked ones (infra faults) are left out and
    get no advantage.

    Sets ``advantage`` on each counted result; returns ``{"n", "mean", "std", "masked",
    "complete"}`` (``complete``: no member masked)."""
    kept = [r for r in counted(results) if r.reward is not None]
    masked = len(results) - len(kept)
    if not kept:
        return {"n": 0, "mean": None, "std": None, "masked": masked, "complete": masked == 0}
    rewards = [float(r.reward) for r in kept if r.reward is not None]
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
    for r, x in zip(kept, rewards, strict=True):
        r.advantage = (x - mean) / (std + eps)
    return {"n": len(rewards), "mean": mean, "std": std, "masked": masked, "complete": masked == 0}
