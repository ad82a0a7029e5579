"""A :class:`~sandfleet.rollout.policy.Model` that plays a script in-process: no HTTP server.

The script is :class:`~sandfleet.testing.fake_server.FakeModelServer`'s (``{"bash": ...}``,
``{"tool_calls": [...]}``, ``{"text": ...}``, plain text, ``{"choices": [...]}`` picked by the
request's ``seed``), played by the same rule: the reply
to a request is the entry at its turn, the number of assistant messages already in the
conversation, so concurrent rollouts sharing one model each get the whole script; after the
script's end the task is done. HTTP faults are the server's to play, not this one's.

    policy = OpenAIPolicy(model=ScriptedModel([{"bash": "echo hi"}, "Done."]))

It is what a trainer's in-process engine looks like to the agent loop.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Unpack

from sandfleet.errors import ConfigError
from sandfleet.rollout.chat import ChatReply, CompletionOptions, parse_completion
from sandfleet.testing.fake_server import DONE_TEXT, completion_for, pick


class ScriptedModel:
    """Scripted chat replies, in-process; every request is kept in :attr:`requests`."""

    def __init__(self, script: Sequence[Any] = (), *, model: str = "scripted-model"):
        for entry in script:
            if isinstance(entry, dict) and "fault" in entry:
                raise ConfigError(f"ScriptedModel plays replies, not HTTP faults ({entry!r}): use FakeModelServer")
            if not isinstance(entry, str) and not (isinstance(entry, dict) and entry.keys() & {"bash", "tool_calls",
                                                                                              "text", "choices"}):
                raise ConfigError(f"not a script entry: {entry!r} (a string, or bash, tool_calls or text)")
        self.script = list(script)
        self.model = model
        self.requests: list[dict[str, Any]] = []
        """Every request, in order: ``messages`` (a copy, as sent), ``tools``, ``max_tokens``,
        ``temperature`` and the ``extra`` fields."""

    async def complete(self, messages: list[dict[str, Any]], **opts: Unpack[CompletionOptions]) -> ChatReply:
        tools, max_tokens, temperature, extra = (opts.get("tools"), opts.get("max_tokens"), opts.get("temperature"),
                                                 opts.get("extra"))
        self.requests.append({"messages": copy.deepcopy(messages), "tools": tools, "max_tokens": max_tokens,
                              "temperature": temperature, **(extra or {})})
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        entry = pick(self.script[turn] if turn < len(self.script) else DONE_TEXT, (extra or {}).get("seed"))
        return parse_completion(completion_for(entry, messages, turn, self.model))
