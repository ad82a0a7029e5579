"""sandfleet's agent loop under session-server rules (Miles ``--use-session-server``, slime's
router, any server that records a conversation's tokens itself).

It is :class:`~sandfleet.rollout.agent.OpenAIPolicy`'s loop -- the same tool, fenced-block
fallback, output truncation, stop reasons and spans -- with three differences a token-in,
token-out server needs:

- it starts from the trainer's prompt (a messages list kept as it is), not from sandfleet's
  system prompt and the task's instruction (which it uses only when there is no prompt);
- every request carries the whole history, and each assistant message is echoed back
  exactly as the server sent it (``None`` fields dropped, as ``model_dump(exclude_none=True)``
  does), so the server sees an exact extension of the previous turn;
- the trainer's sampling settings (``request_kwargs``) go into every request, and each
  turn's raw choice (logprobs, token ids) is kept in :attr:`SessionPolicy.turns`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from sandfleet.errors import ModelError
from sandfleet.rollout.agent import BASH_TOOL, HOW, AgentConfig, fenced_commands, truncate
from sandfleet.rollout.chat import ChatReply, parse_completion
from sandfleet.rollout.policy import AgentContext
from sandfleet.tasks import Task


@dataclass
class Turn:
    """One model request and its reply."""

    sent: int
    """How many messages the request carried (the history is :attr:`SessionPolicy.messages`)."""
    message: dict[str, Any]
    """The assistant message, as echoed back."""
    choice: dict[str, Any] = field(default_factory=dict)
    """The raw choice: ``finish_reason``, ``logprobs``, any token ids the server sent."""
    tools: bool = False
    """Whether the request offered the bash tool."""


def echoed(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as it goes back to the server: ``None`` fields dropped."""
    return {k: v for k, v in message.items() if v is not None}


class SessionPolicy:
    """A model behind an OpenAI-compatible server that keeps the session; one per rollout."""

    name = "openai-session"

    def __init__(self, base_url: str, prompt: Any = None, *, model: str = "default",
                 request_kwargs: dict[str, Any] | None = None, config: AgentConfig | None = None,
                 api_key: str | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 request_timeout_s: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self.prompt = prompt
        self.model = model
        self.request_kwargs = dict(request_kwargs or {})
        self.config = config or AgentConfig()
        self.api_key = api_key
        self.transport = transport
        self.request_timeout_s = request_timeout_s
        self.messages: list[dict[str, Any]] = []
        """The conversation so far (the prompt, replies, command outputs)."""
        self.turns: list[Turn] = []

    def initial_messages(self, task: Task) -> list[dict[str, Any]]:
        """The prompt as given when it is a messages list; else sandfleet's system prompt and
        the prompt text (or the task's instruction)."""
        if isinstance(self.prompt, list) and self.prompt:
            return [dict(m) for m in self.prompt]
        system = self.config.system_prompt.format(how=HOW[self.config.tool_mode])
        text = self.prompt if isinstance(self.prompt, str) and self.prompt.strip() else task.instruction
        return [{"role": "system", "content": system}, {"role": "user", "content": text}]

    async def act(self, ctx: AgentContext) -> str:
        cfg = self.config
        ctx.command_timeout_s = cfg.command_timeout_s
        ctx.info.update(model=self.model, tool_mode=cfg.tool_mode)
        self.messages = messages = self.initial_messages(ctx.task)
        use_tools = cfg.tool_mode != "text"
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx.AsyncClient(base_url=self.base_url, headers=headers, transport=self.transport,
                                     timeout=httpx.Timeout(self.request_timeout_s, connect=10.0)) as http:
            while True:
                if ctx.turns >= cfg.max_turns:
                    return "max_turns"
                if ctx.completion_tokens >= cfg.max_tokens:
                    return "max_tokens"
                asked = await self._ask(ctx, http, use_tools)
                if asked is None:  # the server refused the tool: text from now on
                    use_tools = False
                    continue
                choice, reply = asked
                message = echoed(choice["message"])
                self.turns.append(Turn(len(messages), message, choice, use_tools))
                ctx.turns += 1
                messages.append(message)
                if not await self._run_reply(ctx, reply):
                    return "done"

    async def _ask(self, ctx: AgentContext, http: httpx.AsyncClient,
                   use_tools: bool) -> tuple[dict[str, Any], ChatReply] | None:
        """One request: the raw choice and its parsed reply; None if the server refused the tool."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages}
        if self.config.max_tokens_per_turn is not None:
            body["max_tokens"] = self.config.max_tokens_per_turn
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        body.update(self.request_kwargs)
        if use_tools:
            body["tools"] = [BASH_TOOL]
        with ctx.recorder.span("model", turn=ctx.turns) as span:
            try:
                data = await post_chat(http, body)
                reply = parse_completion(data)
            except ModelError as e:
                span["error"] = e.reason
                if use_tools and self.config.tool_mode == "auto" and e.reason == "model_http_400":
                    ctx.info["tools_rejected"] = True
                    return None
                raise
            span.update(prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
                        finish_reason=reply.finish_reason)
        ctx.prompt_tokens += reply.prompt_tokens or 0
        ctx.completion_tokens += reply.completion_tokens or 0
        return data["choices"][0], reply

    async def _run_reply(self, ctx: AgentContext, reply: ChatReply) -> bool:
        """Run what the reply asks for; False when it asked for nothing (done)."""
        cap = self.config.max_output_chars
        if reply.tool_calls:
            for call in reply.tool_calls:
                command = bash_command(call.name, call.arguments)
                if command is None:
                    text = f"error: unknown tool or bad arguments for {call.name!r}; use bash(command)"
                else:
                    text = await _execute(ctx, command, cap)
                self.messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
            return True
        if self.config.tool_mode == "tools":
            return False
        commands = fenced_commands(reply.content)
        if not commands:
            return False
        outputs = [await _execute(ctx, command, cap) for command in commands]
        self.messages.append({"role": "user", "content": "\n\n".join(outputs)})
        return True


async def _execute(ctx: AgentContext, command: str, cap: int) -> str:
    res = await ctx.run(command)
    note = " (timed out)" if res.timed_out else ""
    return f"exit code: {res.exit_code}{note}\n{truncate(res.output, cap)}"


def bash_command(name: str, arguments: str) -> str | None:
    """The command of a ``bash`` tool call (JSON ``{"command": ...}``, or a bare string)."""
    if name != "bash":
        return None
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return arguments.strip() or None
    command = args.get("command") if isinstance(args, dict) else None
    return command if isinstance(command, str) and command.strip() else None


async def post_chat(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /chat/completions``; every failure as :class:`ModelError` (the reasons of
    :mod:`sandfleet.rollout.chat`)."""
    try:
        resp = await http.post("/chat/completions", json=body)
    except httpx.TimeoutException as e:
        raise ModelError(f"model server timed out: {e!r}", reason="model_timeout") from None
    except httpx.HTTPError as e:
        raise ModelError(f"model server unreachable: {e!r}", reason="model_unreachable") from None
    if resp.status_code >= 400:
        raise ModelError(f"model server answered HTTP {resp.status_code}: {resp.text[:300]}",
                         reason=f"model_http_{resp.status_code}")
    try:
        data = resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"model server sent invalid JSON: {e}", reason="model_malformed") from None
    if not isinstance(data, dict):
        raise ModelError("model server sent JSON that is not an object", reason="model_malformed")
    return data
