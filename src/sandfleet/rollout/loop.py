"""The agent loop for a model behind any OpenAI-compatible chat server.

Each turn: send the conversation (a ``model`` span, with the server's ``usage`` tokens),
run every command the reply asks for (``agent_command`` spans), send the output back
(truncated to ``max_output_chars``, saying so). Commands come from ``bash`` tool calls, or,
for models without tool calling, from fenced shell blocks in the text. The loop stops when
a reply asks for no command (the model is done), or at ``max_turns``, at ``max_tokens``
generated, or at the task's agent timeout.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from sandfleet.errors import ConfigError, ModelError
from sandfleet.rollout.chat import ChatClient, ChatReply, warm_up
from sandfleet.rollout.policy import AgentContext, Model
from sandfleet.settings import env_var

ToolMode = Literal["auto", "tools", "text"]

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the sandbox; returns its exit code and output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command to run."}},
            "required": ["command"],
        },
    },
}

SYSTEM_PROMPT = """You are an agent working in a Linux sandbox to complete a task.
Run shell commands {how}. You see each command's exit code and output.
The shell keeps its working directory and variables between commands.
When the task is complete, reply with a short summary and no command."""
HOW = {
    "tools": "with the `bash` tool",
    "auto": "with the `bash` tool (or, without tools, in a ```bash fenced block)",
    "text": "by writing each one in a ```bash fenced block",
}

_FENCE = re.compile(r"```([\w+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_SHELL = {"", "bash", "sh", "shell", "console"}


def fenced_commands(text: str) -> list[str]:
    """Shell commands from fenced blocks (```bash, ```sh or bare ```). Blocks in another
    language are passed over whole (the closing fence of a ```python block does not open one)."""
    return [block.strip() for lang, block in _FENCE.findall(text) if lang.lower() in _SHELL and block.strip()]


def truncate(text: str, cap: int) -> str:
    """Keep the head and tail of ``text`` within ``cap`` characters, saying what was cut."""
    if len(text) <= cap:
        return text
    head = cap * 2 // 3
    tail = cap - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters truncated by sandfleet ...]\n{text[-tail:]}"


@dataclass
class AgentConfig:
    """Limits and prompt of the model-driven agent."""

    max_turns: int = 30
    """Most model requests per rollout."""
    max_tokens: int = 16384
    """Most tokens generated over the whole rollout (the server's ``completion_tokens``)."""
    max_tokens_per_turn: int | None = 1024
    """``max_tokens`` sent with each request; None leaves it to the server."""
    max_output_chars: int = 8000
    """Command output shown to the model is cut to this many characters (it says so)."""
    command_timeout_s: float = 180.0
    """Limit of one command (also bounded by the task's agent timeout)."""
    tool_mode: ToolMode = "auto"
    """``tools``: the bash tool only; ``text``: fenced blocks only; ``auto``: offer the tool,
    run fenced blocks if the reply has no tool call, and drop the tool if the server rejects it."""
    temperature: float | None = None
    """Sampling temperature sent with each request; None leaves it to the server."""
    system_prompt: str = SYSTEM_PROMPT
    """System message; ``{how}`` is replaced by how to run commands in the tool mode."""


@dataclass
class Conversation:
    """The state of the agent loop between turns: what a tree copies into each child."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    use_tools: bool = True


class OpenAIPolicy:
    """The agent loop over a :class:`~sandfleet.rollout.policy.Model`.

    ``OpenAIPolicy(base_url, "name")``: a model behind an OpenAI-compatible
    ``/v1/chat/completions`` endpoint; each rollout opens its own
    :class:`~sandfleet.rollout.chat.ChatClient` and closes it (the policy holds only the URL,
    so it pickles: Ray sends it to its nodes). ``OpenAIPolicy(model=m)``: any ``Model``
    passed in (a ``ChatClient`` with its own transport, a trainer's engine, a
    :class:`~sandfleet.testing.scripted_model.ScriptedModel`); its owner closes it."""

    name = "openai"

    def __init__(
        self,
        base_url: str = "",
        model: str | Model = "default",
        *,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        config: AgentConfig | None = None,
        request_timeout_s: float = 120.0,
        extra_body: dict[str, Any] | None = None,
    ):
        self.chat: Model | None = None
        """The model passed in, or None: a ChatClient to ``base_url`` per rollout."""
        if isinstance(model, str):
            if not base_url:
                raise ConfigError("the openai agent needs a model server URL (--model-url) or a Model")
            self.model = model
        else:
            if not callable(getattr(model, "complete", None)):
                raise ConfigError(f"model must be a model name or a Model (an object with an async "
                                  f"complete(messages, tools=...)), not {type(model).__name__}")
            if base_url:
                raise ConfigError("give the openai agent a model server URL or a Model, not both")
            self.chat = model
            self.model = str(getattr(model, "model", None) or type(model).__name__)
        self.base_url = base_url
        self.api_key = api_key if api_key is not None else env_var(api_key_env)
        self.config = config or AgentConfig()
        self.request_timeout_s = request_timeout_s
        self.extra_body = dict(extra_body or {})
        """Fields sent with every request, over ``max_tokens`` and ``temperature`` (a
        trainer's sampling settings)."""
        if self.chat is None:
            warm_up()

    @asynccontextmanager
    async def _model(self) -> AsyncIterator[Model]:
        """The model of one rollout: the one passed in, or a ChatClient closed when it ends."""
        if self.chat is not None:
            yield self.chat
            return
        async with ChatClient(self.base_url, self.model, api_key=self.api_key,
                              timeout_s=self.request_timeout_s) as client:
            yield client

    # -- hooks (a subclass changes how the conversation starts and grows; the loop is one)
    def initial_messages(self, ctx: AgentContext) -> list[dict[str, Any]]:
        """The conversation's first messages: the system prompt and the task's instruction.
        The loop appends to the list returned."""
        system = self.config.system_prompt.format(how=HOW[self.config.tool_mode])
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": ctx.task.instruction},
        ]

    def add_reply(
        self, ctx: AgentContext, messages: list[dict[str, Any]], reply: ChatReply, use_tools: bool
    ) -> None:
        """Append the assistant's reply to the conversation (its role, content and tool calls)."""
        messages.append(reply.raw_message or {"role": "assistant", "content": reply.content})

    async def act(self, ctx: AgentContext) -> str:
        async with self.open_model() as model:
            stop = await self.play(ctx, model, self.begin(ctx), until_turn=None)
        assert stop is not None  # without a turn to stop at, the loop ends only with a reason
        return stop

    # -- the loop in steps (rollout/tree.py splits a rollout at a turn and plays each child on)
    def open_model(self) -> contextlib.AbstractAsyncContextManager[Model]:
        """The model of one rollout (or of one tree of them): closed when it ends."""
        return self._model()

    def begin(self, ctx: AgentContext) -> Conversation:
        """The conversation's state before its first turn (a tree copies it at each split)."""
        ctx.command_timeout_s = self.config.command_timeout_s
        ctx.info.update(model=self.model, tool_mode=self.config.tool_mode)
        return Conversation(self.initial_messages(ctx), self.config.tool_mode != "text")

    async def play(self, ctx: AgentContext, model: Model, state: Conversation, until_turn: int | None) -> str | None:
        """Take turns until the agent stops (its stop reason), or until ``ctx.turns`` reaches
        ``until_turn`` (None: the turn's commands ran, the next model request is not sent)."""
        cfg = self.config
        if ctx.tape is not None:  # the record of the run (rollout/record.py)
            model = ctx.tape.model(model)
        while True:
            if ctx.turns >= cfg.max_turns:
                return "max_turns"
            if ctx.completion_tokens >= cfg.max_tokens:
                return "max_tokens"
            if until_turn is not None and ctx.turns >= until_turn:
                return None
            reply = await self._ask(ctx, model, state.messages, state.use_tools)
            if reply is None:  # the server refused tools: fall back to text
                state.use_tools = False
                continue
            self.add_reply(ctx, state.messages, reply, state.use_tools)
            ctx.turns += 1
            if not await self._run_reply(ctx, reply, state.messages):
                return "done"

    async def _ask(
        self, ctx: AgentContext, model: Model, messages: list[dict[str, Any]], use_tools: bool
    ) -> ChatReply | None:
        with ctx.recorder.span("model", turn=ctx.turns) as span:
            try:
                reply = await model.complete(
                    messages,
                    tools=[BASH_TOOL] if use_tools else None,
                    max_tokens=self.config.max_tokens_per_turn,
                    temperature=self.config.temperature,
                    extra=self._extra(ctx),
                )
            except ModelError as e:
                span["error"] = e.reason
                if use_tools and self.config.tool_mode == "auto" and e.reason == "model_http_400":
                    ctx.info["tools_rejected"] = True
                    return None
                raise
            span["prompt_tokens"] = reply.prompt_tokens
            span["completion_tokens"] = reply.completion_tokens
            span["finish_reason"] = reply.finish_reason
        ctx.prompt_tokens += reply.prompt_tokens or 0
        ctx.completion_tokens += reply.completion_tokens or 0
        return reply

    def _extra(self, ctx: AgentContext) -> dict[str, Any]:
        """The fields sent with each request: the trainer's, and in a tree (``--branch``) the
        node's ``seed`` (added to the trainer's own), so that siblings sample independently."""
        if ctx.seed is None:
            return self.extra_body
        base = self.extra_body.get("seed")
        return {**self.extra_body, "seed": ctx.seed + (base if isinstance(base, int) else 0)}

    async def _run_reply(
        self, ctx: AgentContext, reply: ChatReply, messages: list[dict[str, Any]]
    ) -> bool:
        """Run what the reply asks for; False when it asked for nothing (done)."""
        cap = self.config.max_output_chars
        if reply.tool_calls:
            for call in reply.tool_calls:
                command = _command_of(call.name, call.arguments)
                if command is None:
                    text = (
                        f"error: unknown tool or bad arguments for {call.name!r}; use bash(command)"
                    )
                else:
                    text = await self._execute(ctx, command, cap)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
            return True
        if self.config.tool_mode == "tools":
            return False
        commands = fenced_commands(reply.content)
        if not commands:
            return False
        outputs = [await self._execute(ctx, command, cap) for command in commands]
        messages.append({"role": "user", "content": "\n\n".join(outputs)})
        return True

    async def _execute(self, ctx: AgentContext, command: str, cap: int) -> str:
        res = await ctx.run(command)
        note = " (timed out)" if res.timed_out else ""
        return f"exit code: {res.exit_code}{note}\n{truncate(res.output, cap)}"


def _command_of(name: str, arguments: str) -> str | None:
    if name != "bash":
        return None
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return arguments.strip() or None  # some small models send the bare command
    command = args.get("command") if isinstance(args, dict) else None
    return command if isinstance(command, str) and command.strip() else None
