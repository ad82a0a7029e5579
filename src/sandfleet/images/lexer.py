"""Docker's word lexer: quotes, backslash escapes and ``$VAR`` substitution.

Substitution follows Docker: ``$NAME``, ``${NAME}``, ``${NAME:-default}``, ``${NAME:+alt}``;
an unset name expands to nothing; nothing is substituted inside single quotes; ``\\$`` is a
literal dollar.
"""

from __future__ import annotations

import re

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _lex(text: str, scope: dict[str, str], split: bool) -> list[str]:
    words: list[str] = []
    current: list[str] = []
    started = False
    quote: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote == "'":
            if ch == "'":
                quote = None
            else:
                current.append(ch)
            i += 1
            continue
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if quote == '"' and nxt not in '"\\$':
                current.append(ch)
            else:
                current.append(nxt)
            started = True
            i += 2
            continue
        if ch == "$":
            match = _VAR.match(text, i)
            if match:
                name = match.group(1) or match.group(4)
                value = scope.get(name, "")
                if match.group(2) == "-" and not value:
                    value = _lex(match.group(3), scope, False)[0] if match.group(3) else ""
                elif match.group(2) == "+":
                    value = _lex(match.group(3), scope, False)[0] if value else ""
                current.append(value)
                started = True
                i = match.end()
                continue
        if quote is None and ch in "'\"":
            quote, started = ch, True
        elif quote == '"' and ch == '"':
            quote = None
        elif quote is None and split and ch.isspace():
            if started:
                words.append("".join(current))
                current, started = [], False
        else:
            current.append(ch)
            started = True
        i += 1
    if started or not split:
        words.append("".join(current))
    return words


def expand(text: str, scope: dict[str, str]) -> str:
    """``text`` with quotes removed and variables substituted, whitespace kept."""
    return _lex(text.strip(), scope, split=False)[0]


def split_words(text: str, scope: dict[str, str]) -> list[str]:
    """``text`` split on unquoted whitespace, quotes removed, variables substituted."""
    return _lex(text, scope, split=True)
