"""One rollout: a fresh sandbox, the policy acting in it, the verifier, a trace.

:func:`run_rollout` never raises for a failed rollout: the result says ``failed`` with a
``reason``, and its sandbox is closed whatever happened. Cancellation is recorded
(``cancelled``) through ``on_result`` and then re-raised. :func:`run_with_retries` repeats
failed attempts whose reason the :class:`RetryPolicy` names, each in a fresh sandbox.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from sandfleet.errors import SandboxTimeoutError, SandfleetError, reason_code
from sandfleet.rollout.envrecord import record_envs
from sandfleet.rollout.policy import AgentContext, Policy
from sandfleet.rollout.prepare import close_logged as close_sandbox
from sandfleet.rollout.prepare import run_prepare, start_sandbox
from sandfleet.rollout.record import Tape, build_record, make_tape
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.trace import SpanRecorder, now
from sandfleet.rollout.verdict import INFRA, settle, verdict_of
from sandfleet.rollout.verifier import TASK_DIRS, protect_task_dirs, run_verifier, run_verifier_separately
from sandfleet.sandbox import create_sandbox, get_backend, make_spec
from sandfleet.sandbox.base import Sandbox, Snapshot
from sandfleet.sandbox.contention import Probe, start_probe
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.tasks.model import Task, declared_agent_user

log = logging.getLogger(__name__)

TTL_MARGIN_S = 300.0


@dataclass(frozen=True)
class RetryPolicy:
    """Which attempts are run again (in a fresh sandbox, same task, group, sample and
    sampling settings: a refill in place), and how often: an ``infra_fault`` (the agent can't
    have caused it: :mod:`sandfleet.rollout.verdict`), never a policy fault, which would let a
    policy redraw its own failures."""

    max_attempts: int = 2
    """Attempts per rollout, the first included."""
    never: frozenset[str] = frozenset({"image_build", "prepare_failed", "prepare_timeout", "cancelled"})
    """Failure reasons not worth another attempt even though masked: the task is broken, not
    the host (the same build or prepare step fails again)."""
    backoff_s: float = 1.0
    """Wait before attempt k+1: ``backoff_s * 2**(k-1)``."""

    def should_retry(self, result: RolloutResult) -> bool:
        if result.status == "cancelled" or result.attempt >= self.max_attempts:
            return False  # a completed rollout is masked only as host_contention: refilled too
        return verdict_of(result) == INFRA and (result.reason or "") not in self.never


def task_spec(
    task: Task, image: str, backend: str = "auto", *, network: bool = False, agent_user: str | None = None,
    seccomp_allow: tuple[str, ...] = (),
) -> SandboxSpec:
    """The sandbox a task asks for: its image, workdir, env and limits; its user is the
    agent's (``agent_user``, e.g. ``root`` for Docker's behaviour, else the task's declared
    user: :func:`~sandfleet.tasks.model.declared_agent_user`); its seccomp opt-outs are the
    task's and the run's (``seccomp_allow``)."""
    user = agent_user or declared_agent_user(task, image_user(image))
    return make_spec(
        image=image, backend=backend, workdir=task.workdir, env=task.env, cpus=task.cpus,
        memory_mib=task.memory_mib, disk_mib=task.storage_mib, network=network,
        allow=task.allowed_hosts if network else None,
        ttl_s=task.agent_timeout_s + task.verifier_timeout_s + TTL_MARGIN_S,
        labels={"task": task.name}, user=user, seccomp_allow=(*task.seccomp_allow, *seccomp_allow),
        root_dirs=tuple(d for d in TASK_DIRS if d in SandboxSpec.model_fields["writable_dirs"].default),
    )  # fmt: skip


def image_user(image: str) -> str | None:
    """The Dockerfile ``USER`` recorded in a built image's metadata (None for ``host``)."""
    if image == "host":
        return None
    from sandfleet.imagestore import resolve_image

    try:
        user = resolve_image(image).meta.get("user")
    except Exception:  # an unknown image fails at create, with its own message
        return None
    return str(user) if user else None


def failure_reason(error: BaseException) -> str:
    """A short machine-readable cause for an exception: a sandfleet error's ``reason``
    (:mod:`sandfleet.errors`), ``internal_<its class>`` for any other (a bug of ours)."""
    if isinstance(error, SandfleetError):
        return reason_code(error)
    return f"internal_{type(error).__name__}"


@dataclass
class RolloutRequest:
    """Everything one rollout needs; ``snapshot`` forks it from a prepared state."""

    task: Task
    policy: Policy
    spec: SandboxSpec
    sample: int = 0
    group: str | None = None
    run_id: str = ""
    snapshot: Snapshot | None = None
    attempt: int = 1
    rollout_id: str | None = None
    verify: str = "shared"
    """``shared``: the tests run in the agent's sandbox; ``separate``: in a fresh sandbox of the
    same image that gets only the workdir and declared artifacts (docs/security.md)."""
    record: str = "none"
    """``none``, ``commands`` or ``full``: what the rollout's record keeps (docs/replay.md);
    the record is ``result.record``."""


async def _create(req: RolloutRequest) -> Sandbox:
    if req.snapshot is not None:
        return (await get_backend(req.snapshot.backend).fork(req.snapshot, 1))[0]
    return await create_sandbox(req.spec)


async def _start(req: RolloutRequest) -> Sandbox:
    """Create the sandbox; if cancelled meanwhile, let the creation finish and close it."""
    return await start_sandbox(lambda: _create(req))


async def run_rollout(
    req: RolloutRequest, on_result: Callable[[RolloutResult], None] | None = None
) -> RolloutResult:
    """Run one attempt; returns its result (``completed`` or ``failed``), never raises for a
    failure. On cancellation the ``cancelled`` result goes to ``on_result`` and the
    cancellation propagates."""
    task = req.task
    rec = SpanRecorder()
    rid = req.rollout_id or f"{task.name}#{req.sample}"
    if req.attempt > 1:
        rid += f"~{req.attempt}"
    result = RolloutResult(
        rollout_id=rid, task=task.name, group=req.group or task.name, sample=req.sample,
        agent=req.policy.name, backend=req.spec.backend, start=rec.start, end=rec.start,
        status="failed", spans=rec.spans, run_id=req.run_id, attempt=req.attempt,
    )  # fmt: skip
    sandbox: Sandbox | None = None
    probe: Probe | None = None
    phase = "start"  # nothing of the agent's has run: a failure now is infra (rollout/verdict.py)
    failed_with: BaseException | None = None  # its type carries its cause (rollout/verdict.py)
    tape = make_tape(req.record)
    try:
        with rec.span("sandbox_start"):
            sandbox = await _start(req)
        await ready_sandbox(req, sandbox, rec, result)
        ctx = AgentContext(
            task=task, sandbox=sandbox, recorder=rec, deadline=now() + task.agent_timeout_s, tape=tape
        )
        phase = "agent"
        probe = _probe(sandbox, result, "agent")
        try:
            async with asyncio.timeout(task.agent_timeout_s):
                result.stop_reason = await req.policy.act(ctx)
        except SandboxTimeoutError:
            raise
        except TimeoutError:
            result.stop_reason = "agent_timeout"
        finally:
            result.turns, result.commands = ctx.turns, ctx.commands
            result.prompt_tokens, result.completion_tokens = (
                ctx.prompt_tokens,
                ctx.completion_tokens,
            )
            result.info.update(ctx.info)
            _stop_probe(probe, result, "agent")
            probe = None
        phase = "verifier"
        # separate mode runs the tests in another sandbox, made inside run_verifier_separately:
        # not measured (null)
        probe = _probe(sandbox, result, "verifier") if req.verify != "separate" else None
        await score(req, sandbox, rec, result)
        _stop_probe(probe, result, "verifier")
        probe = None
        result.status = "completed"
    except asyncio.CancelledError:
        result.status, result.reason, result.error = "cancelled", "cancelled", "rollout cancelled"
        raise
    except Exception as e:  # a failed rollout is a result, never a crash of the run
        result.reason, result.error = failure_reason(e), str(e) or type(e).__name__
        result.info["phase"] = phase
        failed_with = e
    finally:
        _stop_probe(probe, result, phase)
        if sandbox is not None:
            with rec.span("other_sandbox", what="close"):
                await asyncio.shield(_close(sandbox, result))
        result.end = rec.finish()
        settle(result, failed_with)  # once: everything after reads result.verdict
        if tape is not None:
            record_of(tape, req, result)
        if on_result is not None:
            on_result(result)
    return result


async def ready_sandbox(req: RolloutRequest, sandbox: Sandbox, rec: SpanRecorder, result: RolloutResult) -> None:
    """A started sandbox made ready for the agent: the task's prepare step (unless forked
    from a prepared state), the task folders given to root, the image's venvs in the workdir
    recorded (rollout/envrecord.py)."""
    task = req.task
    result.sandbox_id, result.backend = sandbox.id, sandbox.backend
    if req.snapshot is not None:
        result.info["prepared_from"] = req.snapshot.id
    elif task.prepare is not None:  # a fresh sandbox runs the prepare step itself
        with rec.span("sandbox_start", what="prepare"):
            await run_prepare(task, sandbox)
        result.info["prepare"] = "ran"
    result.info["agent_user"] = req.spec.user
    if task.verifier.load_sensitive:  # its failures under outside contention are masked
        result.info["load_sensitive"] = True
    with rec.span("sandbox_start", what="task folders to root"):  # (a fork's start made them root's again)
        await protect_task_dirs(sandbox, root_ran=result.info.get("prepare") == "ran")
    # the last step before the agent's first command: what the image put in the workdir's venvs, and when
    with rec.span("sandbox_start", what="record the image's venvs"):
        await record_envs(task, sandbox, programs=req.verify != "separate")


async def score(req: RolloutRequest, sandbox: Sandbox, rec: SpanRecorder, result: RolloutResult) -> None:
    """The verifier phase: the tests run (in ``sandbox``, or in a fresh one with ``verify:
    separate``) and their reward, reasons and output set on ``result``."""
    task = req.task
    result.contention.setdefault("verifier", None)
    if req.verify == "separate":
        outcome = await run_verifier_separately(task, sandbox, rec, lambda: _start(req))
    else:
        outcome = await run_verifier(task, sandbox, rec)
    if outcome.reason is None and outcome.timed_out and outcome.reward == 0.0 and not outcome.details:
        outcome.reason = "verifier_timeout"  # no reward came before the limit: a policy fault
        outcome.error = f"the tests outlived their {task.verifier.timeout_s:g} s limit"
    if outcome.reason is not None:  # scored 0 whatever the tests said (bad_reward_file)
        result.reason, result.info["reward_error"] = outcome.reason, outcome.error
    result.reward, result.reward_details = outcome.reward, outcome.details
    result.verifier_exit_code, result.verifier_output = outcome.exit_code, outcome.output
    if outcome.timed_out:
        result.info["verifier_timed_out"] = True
    if outcome.risks:
        result.info["verifier_risks"] = outcome.risks


def record_of(tape: Tape, req: RolloutRequest, result: RolloutResult) -> None:
    """Attach the rollout's record (docs/replay.md); recording never fails a rollout."""
    try:
        result.record = build_record(tape, task=req.task, spec=req.spec, policy=req.policy, result=result,
                                     verify=req.verify)
    except Exception as e:
        log.warning("no record of %s: %s", result.rollout_id, e)


def _probe(sandbox: Sandbox, result: RolloutResult, phase: str) -> Probe | None:
    """Start measuring ``phase``'s contention (docs/rollouts.md, "Contention"); null figures
    where the backend's tasks are not in a host cgroup (microvm, remote)."""
    result.contention[phase] = None
    try:
        return start_probe(sandbox)
    except Exception as e:  # measuring must never fail a rollout
        log.debug("no contention probe for %s: %s", sandbox.id, e)
        return None


def _stop_probe(probe: Probe | None, result: RolloutResult, phase: str) -> None:
    if probe is None:
        return
    try:
        result.contention[phase] = probe.stop()
    except Exception as e:
        log.debug("contention probe of %s failed: %s", result.rollout_id, e)


async def _close(sandbox: Sandbox, result: RolloutResult | None = None) -> None:
    error = await close_sandbox(sandbox)
    if error is not None and result is not None:
        result.info["close_error"] = error  # counted in the run's summary (close_failures)


async def run_with_retries(
    req: RolloutRequest,
    retry: RetryPolicy,
    on_result: Callable[[RolloutResult], None] | None = None,
) -> RolloutResult:
    """Run attempts until one is not retried; every attempt goes to ``on_result``, marked
    ``final`` (the rollout's last attempt) or not (another attempt follows)."""

    def record(result: RolloutResult) -> None:
        result.final = not retry.should_retry(result)
        if on_result is not None:
            on_result(result)

    attempt = 1
    while True:
        req.attempt = attempt
        result = await run_rollout(req, record)
        if result.final:
            return result
        await asyncio.sleep(retry.backoff_s * 2 ** (attempt - 1))
        attempt += 1
