"""The verdict of a rollout: ``scored``, ``policy_fault`` or ``infra_fault`` (docs/rollouts.md).

Every rollout ends with exactly one verdict, decided here and nowhere else:

- ``scored``: the verifier ran and gave its reward;
- ``policy_fault``: reward 0, for something the agent or its commands could have caused;
- ``infra_fault``: masked (reward None, never 0), for something the agent can't cause.

The rule is one table, :data:`RULES` (cause -> verdict), and :func:`cause_of`, which maps
what a rollout ended with (status, the error it failed with, its reason code, the phase it
failed in) to a cause of the table. An error names its own cause (``cause`` of
:mod:`sandfleet.errors`' classes; a :class:`~sandfleet.errors.SandboxDiedError` from how its
sandbox ended, :class:`~sandfleet.errors.SandboxEnd`); reason codes without an error (the
verifier's outcomes, a lost node) are looked up in :data:`REASON_CAUSES`. Nothing here reads an
exception's name or message (tests/test_verdicts.py checks it). When in doubt it is a
``policy_fault``: an agent must never be able to turn its own failure into a mask. A rollout
that fails before its agent ran (the sandbox could not be made or prepared) is an
``infra_fault`` whatever the cause: the agent had not acted yet.

A faulted rollout carries the evidence, ``fault``: the ``cause``, how its sandbox ended
(``sandbox_end``: exit status, signal, OOM kills in its memory cgroup, its state directory
gone, from :class:`~sandfleet.errors.SandboxDiedError`'s ``end``) and the ``log_tail``.

The runner settles each rollout once, when it ends, with the error in hand (:func:`settle`);
the property, the serializers, the counters and the integrations read the verdict
(:func:`verdict_of`). A result made by hand (a test, a caller's own) is settled from its
recorded fields the first time it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from sandfleet.errors import SandboxDiedError, SandfleetError, reason_code

if TYPE_CHECKING:
    from sandfleet.rollout.result import RolloutResult

Verdict = Literal["scored", "policy_fault", "infra_fault"]
SCORED: Final = "scored"
POLICY: Final = "policy_fault"
INFRA: Final = "infra_fault"
VERDICTS: tuple[Verdict, ...] = (SCORED, POLICY, INFRA)

Phase = Literal["start", "agent", "verifier"]
"""Where a rollout was when it failed: making its sandbox (nothing of the agent's ran yet),
the agent acting, or the verifier."""


@dataclass(frozen=True)
class Rule:
    """One row of the table: a cause, its verdict, and why."""

    cause: str
    verdict: Verdict
    why: str


RULES: tuple[Rule, ...] = (
    Rule("scored", SCORED, "the verifier ran and gave its reward (max turns and agent timeouts included)"),
    # -- policy faults: reward 0
    Rule("verifier_timeout", POLICY, "the tests outlived their limit (the agent can leave work that hangs them)"),
    Rule("no_reward_file", POLICY, "the tests wrote no reward (the agent can delete or break them)"),
    Rule("bad_reward_file", POLICY, "the reward file is a link, a device, a folder, too large or unreadable"),
    Rule("bad_reward_value", POLICY, "the reward is not a finite number, or the reward output can't be parsed"),
    Rule("reward_conflict", POLICY, "reward.txt and reward.json disagree"),
    Rule("verifier_setup_failed", POLICY, "the tests could not be set up (e.g. a disk the agent filled)"),
    Rule("tests_killed", POLICY, "the tests' processes were killed (the agent's processes can do it)"),
    Rule("tests_detached", POLICY, "a process of the tests outlived the program that started it while they ran "
         "(a daemon of the code under test), in a task that does not declare allow_detached"),
    Rule("tests_status", POLICY, "a reward read from the tests' output (TB1, SWE-bench) that the tests' own signals "
         "do not confirm: the test command's exit status, pytest's outcomes to the witness, one status a test"),
    Rule("transfer_too_large", POLICY, "the workdir could not be carried to the separate verifier (over its cap, "
         "malformed, refused)"),
    Rule("model_content", POLICY, "the model server refused the conversation the policy built (HTTP 400, "
         "413, 422: too long, malformed tool calls), or model content that can't be parsed into an action"),
    Rule("sandbox_oom", POLICY, "the sandbox died with OOM kills its own memory limit caused (the agent's memory)"),
    Rule("sandbox_pids", POLICY, "the sandbox died after its own processes hit its pids limit (a fork bomb: "
         "gVisor's Sentry can't start the processes it needs, and exits)"),
    Rule("agent_unresponsive", POLICY, "the guest agent stopped answering (the agent's processes can starve it)"),
    Rule("sandbox_timeout", POLICY, "a sandbox operation outlived its deadline after the agent started"),
    Rule("no_solution", POLICY, "the oracle agent has no reference solution"),
    Rule("unlisted", POLICY, "anything not in this table, our own bugs included: when in doubt, policy"),
    # -- infra faults: masked
    Rule("sandbox_start", INFRA, "the sandbox could not be made or prepared: the agent had not acted yet"),
    Rule("image_build", INFRA, "the task's image could not be built"),
    Rule("sandbox_died", INFRA, "the sandbox or its host died, killed from outside (a signal or exit with no "
         "OOM kill its own memory limit caused: a kill, the host's or a parent cgroup's OOM killer, a lost state "
         "directory, a TTL, a service that lost it)"),
    Rule("node_lost", INFRA, "the node or service host running it was lost"),
    Rule("no_node", INFRA, "no node of the task's arch was left to run it"),
    Rule("model_unreachable", INFRA, "the model server refused or dropped connections, after retries"),
    Rule("model_timeout", INFRA, "the model server did not answer in time"),
    Rule("model_overloaded", INFRA, "the model server answered 5xx, 429 or 408, after retries"),
    Rule("model_refused_auth", INFRA, "the model server refused the client (401, 403, 404: key, model name, URL)"),
    Rule("model_malformed", INFRA, "the model server's answer was not a chat completion, after retries"),
    Rule("service_unreachable", INFRA, "the sandbox service failed, was busy past retries, or can't be reached"),
    Rule("task_grader", INFRA, "the task's grader is missing on this host, or names a parser that does not exist"),
    Rule("cancelled", INFRA, "the run was stopped (Ctrl-C, SIGTERM) before the rollout ended"),
    Rule("host_contention", INFRA, "the tests of a task that declares itself load_sensitive failed (reward below 1, "
         "or their time limit) while work outside the sandbox took at least CONTENTION_THRESHOLD of the CPU its "
         "verifier phase wanted (its own threads and its own CPU limit never count)"),
)
"""The whole rule, cause -> verdict. docs/rollouts.md lists it; tests cover each row."""

CAUSES: dict[str, Rule] = {r.cause: r for r in RULES}

CONTENTION_THRESHOLD: Final = 0.5
"""A failing verifier phase whose ``outside_share`` (:mod:`sandfleet.sandbox.contention`:
the share of the CPU time it wanted that work outside the sandbox took) is at least this is
masked as ``host_contention`` (docs/rollouts.md, "Contention"): outside work left one thread
of it at most half a CPU (a twofold slowdown or more). Its own threads and its own CPU limit never raise the share."""

CONTENDED_CAUSES: Final = frozenset({"scored", "verifier_timeout"})
"""What a failing verifier phase may end with and still be masked under outside contention:
the tests ran and failed, or outlived their limit. Other policy causes (a broken reward
file, killed tests ...) are not what a slow CPU makes."""

REASON_CAUSES: dict[str, str] = {
    # the verifier's outcome reasons (rollout completed, reward 0) and the errors it raises
    "verifier_timeout": "verifier_timeout", "no_reward_file": "no_reward_file", "reward_missing": "no_reward_file",
    "bad_reward_file": "bad_reward_file", "bad_reward_value": "bad_reward_value",
    "reward_malformed": "bad_reward_value", "reward_key_missing": "bad_reward_value",
    "reward_conflict": "reward_conflict", "verifier_setup_failed": "verifier_setup_failed",
    "verifier_setup": "verifier_setup_failed", "tests_killed": "tests_killed", "tests_detached": "tests_detached",
    "tests_status": "tests_status", "transfer_too_large": "transfer_too_large",
    "verifier_transfer": "transfer_too_large", "transfer_failed": "transfer_too_large",
    "transfer_refused": "transfer_too_large",
    "model_content": "model_content", "agent_unresponsive": "agent_unresponsive",
    "sandbox_timeout": "sandbox_timeout", "no_solution": "no_solution",
    # infra
    "image_build": "image_build", "node_lost": "node_lost", "no_node": "no_node",
    "model_unreachable": "model_unreachable", "model_timeout": "model_timeout",
    "model_malformed": "model_malformed", "sandbox_start": "sandbox_start",
    "prepare_failed": "sandbox_start", "prepare_timeout": "sandbox_start", "sandbox_setup": "sandbox_start",
    "grader_missing": "task_grader", "parser": "task_grader", "cancelled": "cancelled",
}  # fmt: skip
"""Reason codes (``RolloutResult.reason``: a :class:`~sandfleet.errors.RolloutError`'s, the
verifier's outcomes, the cluster's ``node_lost``/``no_node``) -> cause, for an ending whose
error names no cause of its own; ``model_http_N`` by :func:`model_http_cause`. Codes absent
here are ``unlisted`` (policy), unless the rollout failed before its agent started."""

LOG_TAIL_CHARS = 600


def model_http_cause(status: int) -> str:
    """A model server's HTTP error status as a cause."""
    if status >= 500 or status in (408, 429):
        return "model_overloaded"
    if status in (401, 403, 404):
        return "model_refused_auth"
    return "model_content"  # 400, 413, 422 ...: the request the policy's conversation made


def cause_of(status: str, reason: str | None, error: BaseException | None = None, phase: str | None = None, *,
             reward: float | None = None, outside_share: float | None = None, load_sensitive: bool = False) -> str:
    """The cause, a key of :data:`CAUSES`, of a rollout that ended with ``status``
    (completed, failed, cancelled), ``reason``, the ``error`` it failed with (its own ``cause``,
    else its reason code's) and the ``phase`` it failed in;
    ``reward``, the verifier phase's ``outside_share`` and whether the task declares itself
    ``load_sensitive`` decide ``host_contention``.

    Only a declared task's failures are masked. Masking every failure under contention would
    drop a busy host's 0s -- and an RL host is always busy -- so the policy would train on its
    successes alone; and an agent could turn its 0 into a mask (a test made to hang or loop
    while the host is loaded). A task's own tests are robust to load, or the task says they are
    not (``tasks validate --under-load`` finds them)."""
    cause = _cause_of(status, reason, error, phase)
    if (load_sensitive and status == "completed" and cause in CONTENDED_CAUSES and outside_share is not None
            and outside_share >= CONTENTION_THRESHOLD and not (reward is not None and reward >= 1.0 - 1e-9)):
        return "host_contention"
    return cause


def reason_cause(reason: str | None) -> str:
    """The cause of a reason code (:data:`REASON_CAUSES`, ``model_http_N``); ``unlisted`` if none."""
    r = reason or ""
    if r.startswith("model_http_"):
        try:
            return model_http_cause(int(r.removeprefix("model_http_")))
        except ValueError:
            return "unlisted"
    return REASON_CAUSES.get(r, "unlisted")


def error_cause(error: BaseException | None, reason: str | None = None) -> str:
    """The cause ``error`` carries (:mod:`sandfleet.errors`: a class's ``cause``, a dead
    sandbox's OOM kills), else that of its reason code (``reason``, or the error's own)."""
    own = error.cause if isinstance(error, SandfleetError) else None
    if own:
        return own
    if reason is None and isinstance(error, SandfleetError):
        reason = reason_code(error)
    return reason_cause(reason)


def _cause_of(status: str, reason: str | None, error: BaseException | None, phase: str | None) -> str:
    if status == "cancelled":
        return "cancelled"
    cause = error_cause(error, reason)
    if cause not in CAUSES:  # an error class naming a cause the table lacks: our bug, the policy's
        cause = "unlisted"
    if status == "completed":  # the verifier ran: scored, or 0 for a reason the agent could cause
        if reason is None:
            return "scored"
        return cause if CAUSES[cause].verdict == POLICY else "unlisted"
    if phase == "start":  # nothing of the agent's had run
        return cause if CAUSES[cause].verdict == INFRA else "sandbox_start"
    return cause  # sandbox_oom: OOM kills its own limit caused (SandboxEnd.oom_own), the agent's memory


def verifier_outside_share(result: RolloutResult) -> float | None:
    """The verifier phase's ``outside_share``, None where it was not measured."""
    fig = (getattr(result, "contention", None) or {}).get("verifier")
    value = fig.get("outside_share") if isinstance(fig, dict) else None
    return float(value) if isinstance(value, int | float) else None


def verdict_of_cause(cause: str) -> Verdict:
    return CAUSES[cause].verdict


def sandbox_end(error: BaseException | None) -> dict[str, Any] | None:
    """How a sandbox ended, from a :class:`~sandfleet.errors.SandboxDiedError`'s ``end`` (its
    owner saw it: fields None or 0 where it did not): ``exit_status``, ``signal``,
    ``oom_kills``, ``own_limit_reached``, ``state_dir_gone``, ``text`` (the error without its
    log's tail). None for any other error."""
    if not isinstance(error, SandboxDiedError):
        return None
    end = error.end
    return {
        "exit_status": end.exit_status if end else None,
        "signal": end.signal if end else None,
        "oom_kills": end.oom_kills if end else 0,
        "own_limit_reached": end.own_limit_reached if end and end.oom_kills else None,
        "state_dir_gone": end.state_dir_gone if end else False,
        "text": error.head.rstrip("; ")[:LOG_TAIL_CHARS],
    }


def log_tail(error: BaseException | None, text: str | None, output: str = "") -> str:
    """The sandbox log's tail a dead sandbox's ``error`` carries, else the tail of the recorded
    error ``text`` or of ``output``."""
    end = error.end if isinstance(error, SandboxDiedError) else None
    if end is not None and end.log_tail:
        return end.log_tail[-LOG_TAIL_CHARS:]
    return (text or output)[-LOG_TAIL_CHARS:]


@dataclass(frozen=True)
class Ruling:
    """A rollout's verdict, decided once (:func:`rule`): the ``verdict``, its ``cause``, the
    evidence (``fault``, None when scored) and the ``reward`` it leaves (None: masked)."""

    verdict: Verdict
    cause: str
    fault: dict[str, Any] | None
    reward: float | None


def rule(result: RolloutResult, error: BaseException | None = None) -> Ruling:
    """The ruling on ``result``, ended with ``error`` (None: from its recorded reason code)."""
    phase = result.info.get("phase")
    cause = cause_of(result.status, result.reason, error, phase, reward=result.reward,
                     outside_share=verifier_outside_share(result),
                     load_sensitive=bool(result.info.get("load_sensitive")))
    verdict = verdict_of_cause(cause)
    if verdict == SCORED:
        return Ruling(verdict, cause, None, result.reward)
    if cause == "host_contention":
        phase = "verifier"
    fault = {
        "cause": cause, "phase": phase, "reason": result.reason,
        "sandbox_end": sandbox_end(error),
        "log_tail": log_tail(error, result.error or result.info.get("reward_error"), result.verifier_output),
        **({"contention": result.contention.get("verifier"), "tests_reward": result.reward}
           if cause == "host_contention" else {}),
    }  # fmt: skip
    reward = None if verdict == INFRA else (0.0 if result.reward is None else result.reward)
    return Ruling(verdict, cause, fault, reward)


def settle(result: RolloutResult, error: BaseException | None = None) -> Verdict:
    """Give ``result`` its verdict, once (a settled result keeps its own): ``verdict``,
    ``fault`` (the evidence, on a fault) and the reward (0.0 for a policy fault, None for an
    infra fault). ``error`` is what it failed with, where the caller has it."""
    if result.verdict is not None:
        return result.verdict
    ruling = rule(result, error)
    result.verdict, result.fault, result.reward = ruling.verdict, ruling.fault, ruling.reward
    if ruling.verdict == INFRA:
        result.reward_details, result.advantage = {}, None
    return ruling.verdict


def verdict_of(result: RolloutResult) -> Verdict:
    """The verdict ``result`` was settled to (one made by hand, never settled: settled now
    from its recorded fields)."""
    return result.verdict if result.verdict is not None else settle(result)


def counted(results: Any) -> list[RolloutResult]:
    """The results that train (scored and policy-fault ones): what pass rates and GRPO
    statistics are computed over."""
    return [r for r in results if verdict_of(r) != INFRA]


def verdict_counts(results: Any) -> dict[str, int]:
    """How many results got each verdict (every verdict present, 0 included)."""
    out: dict[str, int] = dict.fromkeys(VERDICTS, 0)
    for r in results:
        out[verdict_of(r)] += 1
    return out
