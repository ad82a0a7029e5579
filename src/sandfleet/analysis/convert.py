"""Converters from other systems' results into ``sandfleet.trace/1`` rollouts.

**Harbor** (``laude-institute/harbor``): a job directory holds one folder per trial, each
with a ``result.json`` (Harbor's ``TrialResult``): ``task_name``, ``trial_name``,
``started_at``/``finished_at``, four phase timings ``environment_setup``, ``agent_setup``,
``agent_execution`` and ``verifier`` (each ``{started_at, finished_at}``),
``verifier_result.rewards`` (for example ``{"reward": 1.0}``), ``agent_result`` token counts
and ``exception_info``. The phases map to spans::

    environment_setup -> sandbox_start      agent_execution -> agent_command
    agent_setup       -> other_sandbox      verifier        -> verifier

Time between or around the phases becomes ``overhead`` so the spans tile the trial.
Harbor does not time the model apart from the agent's commands: the model's time is inside
``agent_command``, and the converted rollouts say so with ``"model_time_known": false``.
Timestamps without a time zone (Harbor writes local ``datetime.now()``) are read as UTC; only
differences between them matter here. A trial with a verifier reward is ``completed`` (its
exception, such as an agent timeout, kept in ``error``); one without is ``failed``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandfleet.analysis.trace import TraceError, write_trace

HARBOR_PHASES = (
    ("environment_setup", "sandbox_start"),
    ("agent_setup", "other_sandbox"),
    ("agent_execution", "agent_command"),
    ("verifier", "verifier"),
)
FORMATS = ("harbor",)


def _ts(value: Any, what: str, file: Path) -> float | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TraceError(f"{what}: expected an ISO timestamp, got {value!r}", file=file)
    try:
        dt = datetime.fromisoformat(value)
    except ValueError as e:
        raise TraceError(f"{what}: not an ISO timestamp: {value!r}", file=file) from e
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _phases(obj: dict[str, Any], file: Path) -> list[tuple[str, float, float | None]]:
    out = []
    for key, span in HARBOR_PHASES:
        timing = obj.get(key)
        if timing is None:
            continue
        if not isinstance(timing, dict):
            raise TraceError(f"{key}: expected an object with started_at/finished_at", file=file)
        s = _ts(timing.get("started_at"), f"{key}.started_at", file)
        e = _ts(timing.get("finished_at"), f"{key}.finished_at", file)
        if s is not None:
            out.append((span, s, e))
    return sorted(out, key=lambda p: p[1])


def _tile(phases: list[tuple[str, float, float | None]], start: float, end: float) -> list[dict]:
    """Spans covering ``[start, end]``: the phases clipped in order, overhead in between."""
    spans: list[dict[str, Any]] = []
    t = start
    for i, (name, ps, pe) in enumerate(phases):
        nxt = phases[i + 1][1] if i + 1 < len(phases) else end
        s = min(max(ps, t), end)
        e = min(max(pe if pe is not None else nxt, s), end)
        if s > t:
            spans.append({"name": "overhead", "start": t, "end": s})
        if e > s:
            span: dict[str, Any] = {"name": name, "start": s, "end": e}
            if name == "agent_command":
                span["model_time_known"] = False
            spans.append(span)
        t = max(t, e)
    if end > t:
        spans.append({"name": "overhead", "start": t, "end": end})
    return spans


def _field(obj: dict[str, Any], key: str, file: Path, name: str | None = None) -> dict[str, Any]:
    """An optional object field: {} when absent or null, a TraceError naming it when it is
    not an object."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TraceError(f"field {name or key!r} must be an object, not {type(value).__name__}", file=file)
    return value


def harbor_trial(obj: Any, file: Path, run_id: str) -> dict[str, Any]:
    """One Harbor ``TrialResult`` (decoded JSON) as a sandfleet rollout record."""
    if not isinstance(obj, dict) or "trial_name" not in obj:
        raise TraceError("not a Harbor trial result (no 'trial_name')", file=file)
    phases = _phases(obj, file)
    start = _ts(obj.get("started_at"), "started_at", file)
    end = _ts(obj.get("finished_at"), "finished_at", file)
    start = start if start is not None else min((p[1] for p in phases), default=None)
    ends = [p[2] for p in phases if p[2] is not None]
    end = end if end is not None else max(ends, default=None)
    if start is None or end is None or end < start:
        raise TraceError("trial has no usable started_at/finished_at", file=file)
    rewards = _field(obj, "verifier_result", file).get("rewards")
    reward = None
    if isinstance(rewards, dict) and rewards:
        value = rewards.get("reward", next(iter(rewards.values())))
        reward = float(value) if isinstance(value, int | float) else None
    exc = _field(obj, "exception_info", file)
    error = f"{exc.get('exception_type')}: {exc.get('exception_message', '')}" if exc else None
    agent_info = _field(obj, "agent_info", file)
    env = _field(_field(obj, "config", file), "environment", file, "config.environment").get("type")
    usage = _field(obj, "agent_result", file)
    task = str(obj.get("task_name") or obj["trial_name"])
    return {
        "run_id": run_id,
        "rollout_id": str(obj["trial_name"]),
        "task": task,
        "group": task,
        "sandbox_id": str(obj["trial_name"]),
        "backend": f"harbor:{env}" if env else "harbor",
        "agent": agent_info.get("name"),
        "start": start,
        "end": end,
        "status": "completed" if reward is not None else "failed",
        "error": error,
        "reward": reward,
        "model_time_known": False,
        "source": "harbor",
        "tokens": {
            k: usage.get(k)
            for k in ("n_input_tokens", "n_cache_tokens", "n_output_tokens")
            if k in usage
        },
        "spans": _tile(phases, start, end),
    }


def harbor_job(job_dir: str | Path) -> list[dict[str, Any]]:
    """Every trial of a Harbor job directory (or one trial's ``result.json``) as records."""
    root = Path(job_dir)
    if root.is_file():
        files, run_id = [root], root.parent.parent.name
    elif root.is_dir():
        files = sorted(root.glob("*/result.json"))
        files = files or ([root / "result.json"] if (root / "result.json").is_file() else [])
        run_id = root.name
    else:
        raise TraceError("no such Harbor job directory or result file", file=root)
    records = []
    for f in files:
        try:
            obj = json.loads(f.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise TraceError(f"not JSON ({e.msg})", file=f, line=e.lineno) from e
        except UnicodeDecodeError as e:
            raise TraceError(f"not UTF-8 text (byte {e.start}: {e.reason})", file=f) from None
        except OSError as e:
            raise TraceError(f"can't read it: {e.strerror}", file=f) from None
        if isinstance(obj, dict) and "trial_name" in obj:
            records.append(harbor_trial(obj, f, run_id))
    if not records:
        raise TraceError(
            "no Harbor trial results (*/result.json with 'trial_name') found", file=root
        )
    records.sort(key=lambda r: r["start"])
    samples: dict[str, int] = defaultdict(int)
    for r in records:
        r["sample"] = samples[r["group"]]
        samples[r["group"]] += 1
    return records


def convert(fmt: str, source: str | Path, out: str | Path) -> tuple[Path, int]:
    """Convert ``source`` in format ``fmt`` into a run at ``out``; (trace path, rollouts)."""
    if fmt != "harbor":
        raise TraceError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    records = harbor_job(source)
    return write_trace(out, records), len(records)
