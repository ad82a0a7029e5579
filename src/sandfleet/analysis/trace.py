"""Reading and writing ``sandfleet.trace/1`` files (see ``docs/trace-schema.md``).

A run directory holds ``trace.jsonl``, one rollout per line. :func:`load_run` reads and
validates it: every problem is a :class:`TraceError` that names the file and the line.
Spans must tile the rollout (sorted, no overlap, no gap beyond :data:`TILE_TOLERANCE_S`),
so the durations of a rollout's spans add up to its wall time.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.errors import ConfigError
from sandfleet.traceschema import LINEAGE, SCHEMA, SPAN_NAMES

STATUSES = ("completed", "failed", "cancelled")
VERDICTS = ("scored", "policy_fault", "infra_fault")
_ATTEMPT_SUFFIX = re.compile(r"~\d+$")
TILE_TOLERANCE_S = 1e-3
"""Largest gap or overlap between consecutive spans that is still read as tiling."""


class TraceError(ConfigError):
    """A trace file is missing or malformed; the message names the file and the line."""

    def __init__(self, message: str, *, file: str | Path | None = None, line: int | None = None):
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else "")
        super().__init__(where + message)
        self.file = str(file) if file else None
        self.line = line


@dataclass(frozen=True)
class Span:
    """One named interval of a rollout; ``attrs`` keeps the other keys (tokens, command)."""

    name: str
    start: float
    end: float
    attrs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Rollout:
    """One rollout: a task attempt in one sandbox, with its spans in time order."""

    rollout_id: str
    task: str
    group: str
    sandbox_id: str
    start: float
    end: float
    status: str
    spans: tuple[Span, ...]
    reward: float | None = None
    model_time_known: bool = True
    sample: int | None = None
    """Index inside the group (``None`` when the trace does not say)."""
    attempt: int = 1
    """Which attempt of the rollout this is (a retried rollout has attempts 1, 2, ...)."""
    verdict: str = "scored"
    """``scored``, ``policy_fault`` or ``infra_fault`` (masked); a trace without the key is
    read as ``scored`` when completed, else ``policy_fault``."""
    cause: str | None = None
    """A faulted rollout's ``fault.cause`` (``host_contention`` ...), None otherwise."""
    contention: Mapping[str, Any] | None = None
    """Per phase (``agent``, ``verifier``) the sandbox's contention figures, or None
    (docs/rollouts.md, "Contention"); None where the trace has none."""
    lineage: Mapping[str, Any] | None = None
    """A leaf of a branched rollout: ``tree_id``, ``node_id``, ``parent_node``,
    ``branch_turn`` (docs/trace-schema.md); None for a straight rollout."""

    @property
    def masked(self) -> bool:
        return self.verdict == "infra_fault"

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the rollout across its attempts: its group and sample, or, when
        the trace has no sample, its ``rollout_id`` without the ``~N`` attempt suffix."""
        if self.sample is not None:  # a tree's leaves share their tree's sample: the node tells them apart
            node = f" node {self.lineage['node_id']}" if self.lineage else ""
            return self.group, f"sample {self.sample}{node}"
        return self.group, _ATTEMPT_SUFFIX.sub("", self.rollout_id)

    def span_seconds(self) -> dict[str, float]:
        """Seconds per span name (every name present, zero when absent)."""
        out = dict.fromkeys(SPAN_NAMES, 0.0)
        for s in self.spans:
            out[s.name] += s.duration
        return out


@dataclass(frozen=True)
class Run:
    """The rollouts of one run, read from ``path``."""

    name: str
    path: Path
    rollouts: tuple[Rollout, ...]

    @property
    def completed(self) -> tuple[Rollout, ...]:
        return tuple(r for r in self.rollouts if r.status == "completed")

    @property
    def model_time_known(self) -> bool:
        return all(r.model_time_known for r in self.rollouts)


def trace_path(path: str | Path) -> Path:
    """The ``trace.jsonl`` of a run directory, or ``path`` itself when it is a file."""
    p = Path(path)
    if p.is_dir():
        p = p / "trace.jsonl"
    if not p.is_file():
        raise TraceError("no such trace file (expected a run directory with trace.jsonl)", file=p)
    return p


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Read and validate a run; raises :class:`TraceError` naming file and line."""
    p = trace_path(path)
    rollouts: list[Rollout] = []
    with open(p, encoding="utf-8") as f:
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise TraceError(
                    f"not JSON ({e.msg}, column {e.colno})", file=p, line=lineno
                ) from e
            try:
                rollouts.append(parse_rollout(obj, default_id=f"line{lineno}"))
            except ValueError as e:
                raise TraceError(str(e), file=p, line=lineno) from e
    if not rollouts:
        raise TraceError("no rollouts in trace", file=p)
    run_name = name or (p.parent.name if p.name == "trace.jsonl" else p.stem)
    return Run(name=run_name, path=p, rollouts=tuple(rollouts))


def _number(obj: Mapping[str, Any], key: str, what: str) -> float:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{what}: {key!r} must be a finite number, got {v!r}")
    return float(v)


def _parse_span(obj: Any, i: int) -> Span:
    if not isinstance(obj, dict):
        raise ValueError(f"span {i}: must be an object")
    name = obj.get("name")
    if name not in SPAN_NAMES:
        raise ValueError(f"span {i}: unknown span name {name!r} (expected one of {SPAN_NAMES})")
    what = f"span {i} ({name})"
    start, end = _number(obj, "start", what), _number(obj, "end", what)
    if end < start:
        raise ValueError(f"{what}: end {end} is before start {start}")
    attrs = {k: v for k, v in obj.items() if k not in ("name", "start", "end")}
    return Span(name=name, start=start, end=end, attrs=attrs)


def parse_rollout(obj: Any, default_id: str = "?") -> Rollout:
    """Validate one decoded trace line; raises ``ValueError`` saying what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("a trace line must be a JSON object")
    schema = obj.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise ValueError(f"unknown schema {schema!r} (expected {SCHEMA!r})")
    start, end = _number(obj, "start", "rollout"), _number(obj, "end", "rollout")
    if end < start:
        raise ValueError(f"rollout: end {end} is before start {start}")
    status = obj.get("status", "completed")
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r} (expected one of {STATUSES})")
    raw_spans = obj.get("spans")
    if not isinstance(raw_spans, list):
        raise ValueError("rollout: 'spans' must be a list")
    spans = tuple(_parse_span(s, i) for i, s in enumerate(raw_spans))
    check_tiling(spans, start, end)
    reward = obj.get("reward")
    sample = obj.get("sample")
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 0):
        raise ValueError(f"rollout: 'sample' must be an integer >= 0, got {sample!r}")
    attempt = 1 if obj.get("attempt") is None else obj["attempt"]
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"rollout: 'attempt' must be an integer >= 1, got {attempt!r}")
    verdict = obj.get("verdict")
    if verdict is None:
        verdict = "scored" if status == "completed" else "policy_fault"
    if verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r} (expected one of {VERDICTS})")
    rid = str(obj.get("rollout_id") or default_id)
    task = str(obj.get("task") or rid)
    return Rollout(
        rollout_id=rid,
        task=task,
        group=str(obj.get("group") or task),
        sandbox_id=str(obj.get("sandbox_id") or rid),
        start=start,
        end=end,
        status=status,
        spans=spans,
        reward=float(reward) if isinstance(reward, int | float) else None,
        model_time_known=bool(obj.get("model_time_known", True)),
        sample=sample,
        attempt=attempt,
        verdict=verdict,
        cause=str(fault["cause"]) if isinstance(fault := obj.get("fault"), dict) and fault.get("cause") else None,
        contention=obj["contention"] if isinstance(obj.get("contention"), dict) else None,
        lineage={k: obj.get(k) for k in LINEAGE} if obj.get("tree_id") and obj.get("node_id") else None,
    )


def final_attempts(rollouts: Iterable[Rollout]) -> tuple[Rollout, ...]:
    """The last attempt of every rollout (see :attr:`Rollout.key`): the highest
    ``attempt``, the later end on a tie. Attempts that were retried are left out."""
    last: dict[tuple[str, str], Rollout] = {}
    for r in rollouts:
        prev = last.get(r.key)
        if prev is None or (r.attempt, r.end) > (prev.attempt, prev.end):
            last[r.key] = r
    return tuple(last.values())


def check_tiling(spans: Iterable[Span], start: float, end: float) -> None:
    """Raise ``ValueError`` unless ``spans`` tile ``[start, end]`` in order."""
    t = start
    for i, s in enumerate(spans):
        if abs(s.start - t) > TILE_TOLERANCE_S:
            kind = "gap" if s.start > t else "overlap"
            raise ValueError(
                f"span {i} ({s.name}): spans must tile the rollout; {kind} of "
                f"{abs(s.start - t):.6f} s before it (record uncovered time as 'overhead')"
            )
        t = s.end
    if abs(end - t) > TILE_TOLERANCE_S:
        raise ValueError(f"spans end at {t} but the rollout ends at {end}; spans must tile it")


def write_trace(path: str | Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """Write rollout records (dicts in the schema) to ``path`` (a dir or a .jsonl file)."""
    p = Path(path)
    if p.suffix != ".jsonl":
        p.mkdir(parents=True, exist_ok=True)
        p = p / "trace.jsonl"
    with open(p, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps({"schema": SCHEMA, **rec}, sort_keys=False) + "\n")
    return p
