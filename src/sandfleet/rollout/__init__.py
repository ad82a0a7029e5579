"""Rollouts: the agent loop, policies, verifier, rewards, GRPO groups and span traces.

    report = await run_suite(tasks, OraclePolicy(), RunConfig(n=4, concurrency=8), out_dir=out)

One rollout (:func:`run_rollout`) is a fresh sandbox, a :class:`Policy` acting in it, the
verifier scoring it, and spans that tile its wall time (``trace.jsonl``).
"""

from sandfleet.rollout.loop import AgentConfig, OpenAIPolicy
from sandfleet.rollout.policy import AgentContext, Model, NoopPolicy, OraclePolicy, Policy, ScriptedPolicy
from sandfleet.rollout.result import RolloutResult, group_advantages
from sandfleet.rollout.runner import RetryPolicy, RolloutRequest, run_rollout, run_with_retries
from sandfleet.rollout.suite import RunConfig, RunReport, run_suite

__all__ = [
    "AgentConfig", "AgentContext", "Model", "NoopPolicy", "OpenAIPolicy", "OraclePolicy", "Policy",
    "RetryPolicy", "RolloutRequest", "RolloutResult", "RunConfig", "RunReport", "ScriptedPolicy",
    "group_advantages", "run_rollout", "run_suite", "run_with_retries",
]  # fmt: skip
