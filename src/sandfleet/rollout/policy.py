"""The policy seam: what acts in the sandbox between start-up and the verifier.

A policy is anything with a ``name`` and ``async act(ctx) -> str`` (the stop reason). It
runs commands only through :meth:`AgentContext.run`, which records each one as an
``agent_command`` span; model-driven policies record their requests as ``model`` spans.

Shipped policies: :class:`OraclePolicy` (the task's reference solution),
:class:`NoopPolicy`, :class:`ScriptedPolicy` (replays commands; for tests) and
:class:`~sandfleet.rollout.loop.OpenAIPolicy` (the agent loop over a :class:`Model`).

The model is a seam of its own: :class:`Model` is one chat completion per call.
:class:`~sandfleet.rollout.chat.ChatClient` (any OpenAI-compatible server) is one, a
trainer's engine or :class:`~sandfleet.testing.scripted_model.ScriptedModel` another; the
policy is given the model, it does not build the client.
"""

from __future__ import annotations

import stat
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Unpack, runtime_checkable

from sandfleet.agent.client import ExecResult
from sandfleet.errors import RolloutError
from sandfleet.rollout.chat import ChatReply, CompletionOptions
from sandfleet.rollout.trace import SpanRecorder, now
from sandfleet.sandbox.base import Sandbox, Session
from sandfleet.tasks.model import Task, Upload

if TYPE_CHECKING:
    from sandfleet.rollout.record import Tape

DEFAULT_COMMAND_TIMEOUT_S = 180.0


@dataclass
class AgentContext:
    """What a policy sees: the task, the sandbox, the clock, and a budget."""

    task: Task
    sandbox: Sandbox
    recorder: SpanRecorder
    deadline: float
    """Wall-clock time (``trace.now()``) the agent must stop by (the task's agent timeout)."""
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    turns: int = 0
    """Model turns (or command batches) taken so far."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    commands: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form details a policy reports (kept with the rollout)."""
    tape: Tape | None = None
    """Where the rollout's record is taped (every command here, every model request through
    :meth:`~sandfleet.rollout.record.Tape.model`); None when the run records nothing."""
    seed: int | None = None
    """The ``seed`` a model-driven policy sends with each request: set in a tree
    (:mod:`sandfleet.rollout.tree`, one per node), None otherwise (nothing sent)."""
    _session: Session | None = None

    def remaining(self) -> float:
        return max(0.0, self.deadline - now())

    async def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        shell: bool = True,
        **attrs: Any,
    ) -> ExecResult:
        """Run one agent command, as an ``agent_command`` span, within the agent deadline.

        A string runs in a persistent shell session (cwd and variables carry over) when
        ``shell`` is true, else under ``bash -c``; a list runs as argv in the task workdir."""
        limit = min(timeout or self.command_timeout_s, self.remaining())
        if limit <= 0:
            raise TimeoutError("agent timeout")
        label = command if isinstance(command, str) else " ".join(command)
        is_shell = isinstance(command, str) and shell and env is None
        if self.tape is not None:  # replay: a command other than the record's stops here
            self.tape.before_command(label, turn=self.turns, shell=is_shell, env=env)
        self.commands += 1
        with self.recorder.span(
            "agent_command", command=label[:500], turn=self.turns, **attrs
        ) as span:
            if is_shell and isinstance(command, str):
                if self._session is None:
                    self._session = self.sandbox.session(cwd=self.task.workdir)
                res = await self._session.run(command, timeout=limit)
            else:
                res = await self.sandbox.exec(
                    command, cwd=self.task.workdir, env=env, timeout=limit
                )
            span["exit_code"] = res.exit_code
            if res.timed_out:
                span["timed_out"] = True
        if self.tape is not None:
            self.tape.command(label, res, turn=self.turns, shell=is_shell, env=env, timeout=limit,
                              argv=None if isinstance(command, str) else list(command))
        return res

    async def stage(self, uploads: Sequence[Upload], what: str) -> None:
        """Copy files in, as an ``other_sandbox`` span."""
        if uploads:
            with self.recorder.span("other_sandbox", what=what):
                await stage_uploads(self.sandbox, uploads)


async def stage_uploads(sandbox: Sandbox, uploads: Sequence[Upload], *, user: str | None = "root") -> None:
    """A file lands at exactly its target; a folder's contents land under its target. Files
    are written as ``user``: root by default, so that a non-root agent can't change the
    tests or the reference solution it is given."""
    for up in uploads:
        if up.source.is_dir():
            await sandbox.upload(up.source, up.target, user=user)
        else:
            mode = 0o755 if up.source.stat().st_mode & stat.S_IXUSR else 0o644
            await sandbox.write_file(up.target, up.source.read_bytes(), mode=mode, user=user)


class Model(Protocol):
    """One chat completion per call: the conversation and the tools offered in, a parsed reply out.

    ``messages`` and ``tools`` are in OpenAI's chat format; ``max_tokens`` and
    ``temperature`` are None when the policy leaves them to the model; ``extra`` holds a
    trainer's sampling settings, which win over both. Failures raise
    :class:`~sandfleet.errors.ModelError` with a ``reason`` (``model_http_400`` for a
    refused request: the policy then drops the tools). Concurrent rollouts may share one
    model; whoever made it closes it."""

    async def complete(self, messages: list[dict[str, Any]], **opts: Unpack[CompletionOptions]) -> ChatReply: ...


@runtime_checkable
class Policy(Protocol):
    """Acts in a sandbox; returns why it stopped (``done``, ``max_turns``, ...)."""

    name: str

    async def act(self, ctx: AgentContext) -> str: ...


class NoopPolicy:
    """Does nothing: a valid task must score 0 with it."""

    name = "noop"

    async def act(self, ctx: AgentContext) -> str:
        return "done"


class OraclePolicy:
    """Runs the task's reference solution; its time is ``agent_command``."""

    name = "oracle"

    async def act(self, ctx: AgentContext) -> str:
        plan = ctx.task.solution
        if plan is None:
            raise RolloutError(
                f"task {ctx.task.name} has no reference solution", reason="no_solution"
            )
        await ctx.stage(plan.uploads, "upload solution")
        env = plan.env or None
        if plan.command is not None:
            ctx.turns = 1
            res = await ctx.run(list(plan.command), env=env, timeout=ctx.remaining())
            ctx.info["solution_exit_code"] = res.exit_code
            # the solution's own limit is what is left of the agent's time: when the guest's kill at
            # that limit answers before the runner's clock runs out, the agent's time ran out all the
            # same (it was a race: done or agent_timeout, 2 in 9 runs of test_verdicts_of_real_rollouts)
            return "agent_timeout" if res.timed_out else "done"
        for i, step in enumerate(plan.commands):  # TB1 keystrokes, one shell session
            ctx.turns = i + 1
            text = step.command.rstrip("\n")
            if text.strip():
                await ctx.run(text, timeout=step.max_timeout_sec)
        return "done"


class ScriptedPolicy:
    """Replays fixed shell commands in one session (tests, demos); one command a turn. It
    takes turns, so a tree can split it (every child then plays the same rest)."""

    name = "scripted"

    def __init__(self, commands: Sequence[str]):
        self.commands = list(commands)

    async def act(self, ctx: AgentContext) -> str:
        return await self.play(ctx, None, self.begin(ctx), until_turn=None) or "done"

    def open_model(self) -> AbstractAsyncContextManager[None]:
        return nullcontext()

    def begin(self, ctx: AgentContext) -> list[int]:
        return [0]  # the next command's index, in a list a tree copies

    async def play(self, ctx: AgentContext, model: object, state: list[int], until_turn: int | None) -> str | None:
        while state[0] < len(self.commands):
            if until_turn is not None and ctx.turns >= until_turn:
                return None
            ctx.turns += 1
            state[0] += 1
            await ctx.run(self.commands[state[0] - 1])
        return "done"


@runtime_checkable
class TurnTaker(Protocol):
    """A policy that takes turns and can stop between them: a tree (``--branch``) plays it
    to a turn, copies its state into each child and plays each on (:mod:`sandfleet.rollout.tree`).
    ``act(ctx)`` is ``play(ctx, model, begin(ctx), None)`` within ``open_model()``."""

    name: str

    def open_model(self) -> AbstractAsyncContextManager[Any]: ...

    def begin(self, ctx: AgentContext) -> Any: ...

    async def play(self, ctx: AgentContext, model: Any, state: Any, until_turn: int | None) -> str | None: ...
