"""Span recording: one monotonic clock mapped to wall time, spans that tile a rollout.

A :class:`SpanRecorder` belongs to one rollout and is used sequentially. Each
``with rec.span("model") as attrs:`` closes any gap since the previous span as an
``overhead`` span, so the spans tile ``[start, end]`` exactly (adjacent spans share the
same float boundary) and their durations add up to the rollout's wall time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sandfleet.traceschema import SPAN_NAMES


class Clock:
    """Monotonic time (``perf_counter``) mapped once to wall-clock unix seconds."""

    def __init__(self) -> None:
        self._wall0 = time.time()
        self._mono0 = time.perf_counter()

    def now(self) -> float:
        """Wall-clock seconds, advancing monotonically."""
        return self._wall0 + (time.perf_counter() - self._mono0)


_CLOCK = Clock()


def now() -> float:
    """The process-wide clock every rollout of a run shares (one timeline)."""
    return _CLOCK.now()


class SpanRecorder:
    """Records the spans of one rollout."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._now = (clock or _CLOCK).now
        self.start = self._now()
        self.end: float | None = None
        self._cursor = self.start
        self.spans: list[dict[str, Any]] = []
        self.tags: dict[str, Any] = {}
        """Keys every span recorded from now on carries (a tree's ``node``: rollout/tree.py)."""

    def _fill(self, until: float) -> None:
        if until > self._cursor:
            self.spans.append({"name": "overhead", "start": self._cursor, "end": until, **self.tags})
            self._cursor = until

    @contextmanager
    def span(self, name: str, **attrs: Any) -> Iterator[dict[str, Any]]:
        """Time a span; the yielded dict takes extra keys (tokens, exit codes) before it ends.

        The span is recorded even when the body raises (a failed command still took time).
        """
        if name not in SPAN_NAMES:
            raise ValueError(f"unknown span name {name!r}")
        start = self._now()
        self._fill(start)
        extra: dict[str, Any] = {**self.tags, **attrs}
        try:
            yield extra
        finally:
            end = self._now()
            self.spans.append({"name": name, "start": self._cursor, "end": end, **extra})
            self._cursor = end

    def split(self) -> SpanRecorder:
        """A recorder that starts now, on the same clock, with no spans (a tree's other
        children: their lines begin where they split off; rollout/tree.py)."""
        self._fill(self._now())
        other = SpanRecorder.__new__(SpanRecorder)
        other._now, other.start, other.end, other._cursor = self._now, self._cursor, None, self._cursor
        other.spans, other.tags = [], dict(self.tags)
        return other

    def finish(self) -> float:
        """End the rollout now; the time since the last span becomes ``overhead``."""
        if self.end is None:
            end = self._now()
            self._fill(end)
            self.end = self._cursor
        return self.end

    def seconds(self) -> dict[str, float]:
        """Seconds per span name (every name present)."""
        out = dict.fromkeys(SPAN_NAMES, 0.0)
        for s in self.spans:
            out[s["name"]] += s["end"] - s["start"]
        return out
