"""Normalizers: what replay overlooks when it compares a command's output with the record.

Each one replaces a kind of text that changes from run to run whatever the agent did with a
placeholder; they are applied in the order of :data:`NORMALIZERS` (dates before durations, so
that ``21:44:54`` is a time of day, not three durations). Each can be turned off
(``sandfleet replay --no-normalize NAME``); docs/replay.md lists them with examples.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"

NORMALIZERS: dict[str, list[tuple[re.Pattern[str], str]]] = {
    "dates": [
        # 2026-12-03, 2026-12-03T21:44:54.123Z, 2026-12-03 21:44:54+00:00
        (re.compile(r"\b\d{4}-\d{2}-\d{2}"
                    r"(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b"), "<date>"),
        # Thu Dec  3 21:44:54 UTC 2026 (date(1)), Dec  3 21:44 (ls -l)
        (re.compile(rf"\b(?:{_DAY},? +)?{_MONTH} +\d{{1,2}}"
                    r"(?: +\d{2}:\d{2}(?::\d{2})?)?(?: +[A-Z]{2,5})?(?: +\d{4})?\b"), "<date>"),
        (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
        (re.compile(r"\b1[6-9]\d{8}(?:\.\d+)?\b"), "<epoch>"),  # Unix time 2020..2033
    ],
    "durations": [
        (re.compile(r"\b\d+m\d+(?:\.\d+)?s\b"), "<duration>"),  # time(1): 0m0.003s
        (re.compile(r"\b\d+(?:\.\d+)?\s?(?:ns|us|µs|ms|s|sec|secs|seconds?|min|mins|minutes?)\b"), "<duration>"),
    ],
    "temp_names": [
        (re.compile(r"/tmp/[\w.@+-]+"), "/tmp/<temp>"),
        (re.compile(r"\btmp[._]?[A-Za-z0-9_]{6,}\b"), "<temp>"),  # mktemp, Python's tempfile
    ],
    "git_hashes": [  # a commit's hash changes with its time: [main 95e5288], * 0fd46ac Merge
        # where git prints one, a hash of digits alone too (one in about 27 short hashes: a
        # `git log --oneline --graph` line "*   9697678 Merge ..." drifted against its replay)
        (re.compile(r"^([*|/\\ ]*)[0-9a-f]{7,12}(?= )", re.MULTILINE), r"\1<hash>"),
        (re.compile(r"(\[[\w./-]+(?: \(root-commit\))? )[0-9a-f]{7,12}\]"), r"\1<hash>]"),
        (re.compile(r"\b(HEAD is now at |Merge: |commit )[0-9a-f]{7,40}\b"), r"\1<hash>"),
        (re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b|\b[0-9a-f]{40}\b"), "<hash>"),
    ],
    "addresses": [  # Python's <... object at 0x7f3a2c1b5e80>, a core dump's pointers
        (re.compile(r"\b0x[0-9a-fA-F]{6,16}\b"), "0x<addr>"),
    ],
    "padding": [  # rules padded to a width: pytest's "=== 3 passed in 0.27s ===" is as long as its duration allows
        (re.compile(r"([=\-_*#~])\1{2,}"), r"\1\1\1"),
        (re.compile(r"[ \t]+$", re.MULTILINE), ""),
    ],
    "pids": [
        (re.compile(r"\b(pid|PID|process|Process)([ =:#]+)\d+\b"), r"\1\2<pid>"),
        (re.compile(r"\[\d{2,7}\]"), "[<pid>]"),  # bash's job table, syslog-style tags
    ],
}
"""name -> (pattern, replacement), applied in this order."""

DEFAULT = tuple(NORMALIZERS)


def check_names(names: Iterable[str]) -> tuple[str, ...]:
    """The names given, each a known normalizer; ValueError naming the unknown ones."""
    names = tuple(names)
    unknown = [n for n in names if n not in NORMALIZERS]
    if unknown:
        raise ValueError(f"unknown normalizer {', '.join(unknown)}; known: {', '.join(NORMALIZERS)}")
    return names


def normalize(text: str, names: Iterable[str] = DEFAULT) -> str:
    """``text`` with every normalizer in ``names`` applied (in :data:`NORMALIZERS`' order)."""
    chosen = set(names)
    for name, rules in NORMALIZERS.items():
        if name in chosen:
            for pattern, repl in rules:
                text = pattern.sub(repl, text)
    return text


def first_difference(recorded: str, replayed: str) -> dict[str, object] | None:
    """The first line where two texts differ: ``{"line": n (1-based), "recorded": ..., "replayed": ...}``
    (a missing line is None), or None when they are the same."""
    a, b = recorded.splitlines(), replayed.splitlines()
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x != y:
            return {"line": i + 1, "recorded": x, "replayed": y}
    return None
