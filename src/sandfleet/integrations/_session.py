"""sandfleet's agent loop under session-server rules (Miles ``--use-session-server``, slime's
router, any server that records a conversation's tokens itself).

It is :class:`~sandfleet.rollout.loop.OpenAIPolicy`'s loop itself -- the same tool, fenced-block
fallback, output truncation, stop reasons and spans -- through its hooks, with three
differences a token-in, token-out server needs:

- it starts from the trainer's prompt (a messages list kept as it is), not from sandfleet's
  system prompt and the task's instruction (which it uses only when there is no prompt);
- every request carries the whole history, and each assistant message is echoed back
  exactly as the server sent it (``None`` fields dropped, as ``model_dump(exclude_none=True)``
  does), so the server sees an exact extension of the previous turn;
- the trainer's sampling settings (``request_kwargs``) go into every request, and each
  turn's raw choice (logprobs, token ids) is kept in :attr:`SessionPolicy.turns`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sandfleet.rollout.chat import ChatReply
from sandfleet.rollout.loop import AgentConfig, OpenAIPolicy
from sandfleet.rollout.policy import AgentContext, Model
from sandfleet.rollout.replay import register_rebuilder


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


class SessionPolicy(OpenAIPolicy):
    """A model behind an OpenAI-compatible server that keeps the session, or a
    :class:`~sandfleet.rollout.policy.Model` passed in (``base_url`` empty); one per rollout."""

    name = "openai-session"

    def __init__(self, base_url: str, prompt: Any = None, *, model: str | Model = "default",
                 request_kwargs: dict[str, Any] | None = None, config: AgentConfig | None = None,
                 api_key: str | None = None, request_timeout_s: float = 600.0):
        # no key unless given (not $OPENAI_API_KEY: the trainer's server is not OpenAI's)
        super().__init__(base_url, model, api_key=api_key or "", config=config,
                         request_timeout_s=request_timeout_s, extra_body=request_kwargs)
        self.prompt = prompt
        self.messages: list[dict[str, Any]] = []
        """The conversation so far (the prompt, replies, command outputs)."""
        self.turns: list[Turn] = []

    def replay_args(self) -> dict[str, Any]:
        """What its record keeps to make it again (docs/replay.md): the prompt it was given."""
        return {"prompt": self.prompt}

    def initial_messages(self, ctx: AgentContext) -> list[dict[str, Any]]:
        """The prompt as given when it is a messages list; else sandfleet's system prompt and
        the prompt text (or the task's instruction)."""
        if isinstance(self.prompt, list) and self.prompt:
            self.messages = [dict(m) for m in self.prompt]
        else:
            self.messages = super().initial_messages(ctx)
            if isinstance(self.prompt, str) and self.prompt.strip():
                self.messages[-1]["content"] = self.prompt  # in place of the task's instruction
        return self.messages

    def add_reply(self, ctx: AgentContext, messages: list[dict[str, Any]], reply: ChatReply, use_tools: bool) -> None:
        """The assistant message echoed exactly as the server sent it; the turn recorded."""
        message = echoed(reply.raw_choice["message"])
        self.turns.append(Turn(len(messages), message, reply.raw_choice, use_tools))
        messages.append(message)


def _rebuild(desc: dict[str, Any], model: Model, config: AgentConfig) -> SessionPolicy:
    """A recorded session policy, made again over ``model`` (replay's, answering from the record)."""
    policy = SessionPolicy("", (desc.get("args") or {}).get("prompt"), model=model,
                           request_kwargs=desc.get("extra_body"), config=config)
    policy.name = str(desc.get("name") or policy.name)
    return policy


register_rebuilder(SessionPolicy.__name__, _rebuild)
