"""A token engine that plays a script: what a trainer's model looks like to
:class:`sandfleet.integrations.trl.TokenModel`, without torch (tests, demos).

Tokens are characters (id = code point + 1; 0 is the end-of-turn token, written
``<|end|>``), the template is ``<role>content<|end|>`` per message then ``<assistant>``, and
the reply at a turn is the script's entry there (FakeModelServer's script: ``{"bash": ...}``
as a fenced block, ``{"text": ...}``, plain text, ``{"choices": [...]}`` picked by the
request's seed), then the end-of-turn token; after the script's end it says it is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sandfleet.testing.fake_server import DONE_TEXT, pick

END = "<|end|>"


class CharEngine:
    """Scripted sampling over character tokens; every request's ``(ids, seed)`` is kept in
    :attr:`requests`."""

    eos_id = 0

    def __init__(self, script: Sequence[Any]):
        self.script = list(script)
        self.requests: list[tuple[list[int], int | None]] = []

    def render(self, messages: list[dict[str, Any]]) -> str:
        return "".join(f"<{m['role']}>{m.get('content') or ''}{END}\n" for m in messages) + "<assistant>"

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 1 for c in text]

    def decode(self, ids: list[int], *, skip_special: bool) -> str:
        return "".join(("" if skip_special else END) if i == self.eos_id else chr(i - 1) for i in ids)

    async def generate(self, ids: list[int], *, seed: int | None, max_tokens: int | None,
                       temperature: float | None) -> list[int]:
        self.requests.append((list(ids), seed))
        turn = self.decode(ids, skip_special=False).count("<assistant>") - 1
        entry = pick(self.script[turn] if turn < len(self.script) else DONE_TEXT, seed)
        if isinstance(entry, dict):
            entry = f"```bash\n{entry['bash']}\n```" if "bash" in entry else str(entry.get("text", ""))
        out = [*self.encode(str(entry)), self.eos_id]
        return out[:max_tokens] if max_tokens else out
