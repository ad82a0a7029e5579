"""Synthetic traces: rollouts built from per-span seconds, and the study's two runs.

For tests and demos (a fake shipped in ``src/``). :data:`STUDY_A` and :data:`STUDY_B` are one
consistent reading of the published per-rollout components: the better host's rollout is
about 442 s (333 s waiting on the model, 43 s agent commands, 46 s verifier, 19 s other
sandbox work, 1 s start and overhead); the other host adds 4, 26, 11 and 12 s.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandfleet.analysis.trace import write_trace

STUDY_A = {
    "sandbox_start": 0.5,
    "model": 333.0,
    "agent_command": 43.0,
    "verifier": 46.0,
    "other_sandbox": 19.0,
    "overhead": 0.5,
}
STUDY_B = {
    **STUDY_A,
    "model": 337.0,
    "agent_command": 69.0,
    "verifier": 57.0,
    "other_sandbox": 31.0,
}


def rollout_record(
    task: str,
    sample: int,
    start: float,
    seconds: Mapping[str, float],
    *,
    group: str | None = None,
    turns: int = 4,
    prompt_tokens: int = 2000,
    tokens_per_turn: int = 1500,
    completion_tokens: int = 300,
    status: str = "completed",
) -> dict[str, Any]:
    """A tiled rollout: sandbox_start, ``turns`` x (model, agent_command), other_sandbox
    (upload tests), verifier, overhead; each span name gets ``seconds[name]`` in total."""
    spans: list[dict[str, Any]] = []
    t = start

    def add(name: str, dur: float, **attrs: Any) -> None:
        nonlocal t
        spans.append({"name": name, "start": t, "end": t + dur, **attrs})
        t += dur

    add("sandbox_start", seconds.get("sandbox_start", 0.0))
    for i in range(turns):
        add(
            "model",
            seconds.get("model", 0.0) / turns,
            turn=i,
            prompt_tokens=prompt_tokens + i * tokens_per_turn,
            completion_tokens=completion_tokens,
        )
        add("agent_command", seconds.get("agent_command", 0.0) / turns, turn=i, exit_code=0)
    add("other_sandbox", seconds.get("other_sandbox", 0.0), what="upload tests")
    add("verifier", seconds.get("verifier", 0.0), exit_code=0)
    add("overhead", seconds.get("overhead", 0.0))
    return {
        "run_id": "synthetic",
        "rollout_id": f"{task}#{sample}",
        "task": task,
        "group": group or task,
        "sample": sample,
        "sandbox_id": f"sf-synth-{task}-{sample}",
        "backend": "synthetic",
        "agent": "synthetic",
        "start": start,
        "end": t,
        "status": status,
        "error": None,
        "reward": 1.0 if status == "completed" else None,
        "spans": spans,
    }


def study_records(
    seconds: Mapping[str, float],
    *,
    steps: int = 5,
    tasks_per_step: int = 4,
    samples: int = 8,
    spread: float = 0.45,
    t0: float = 1.7e9,
) -> list[dict]:
    """A run shaped like the study's (5 steps, 160 rollouts in GRPO groups of 8).

    Inside a group, sample i's spans are all scaled by a factor spread symmetrically
    around 1 (from ``1 - spread`` to ``1 + spread``), so every span's mean is exactly
    ``seconds``; all members of a step start together, and the next step starts when
    the last group of the step ends.
    """
    records = []
    t = t0
    for step in range(steps):
        step_end = t
        for j in range(tasks_per_step):
            task = f"task-{step * tasks_per_step + j:02d}"
            for i in range(samples):
                f = 1.0 + spread * (2 * i - (samples - 1)) / max(1, samples - 1)
                rec = rollout_record(
                    task, i, t, {k: v * f for k, v in seconds.items()}, group=f"{task}@step{step}"
                )
                records.append(rec)
                step_end = max(step_end, rec["end"])
        t = step_end + 1.0
    return records


def write_study(out_dir: str | Path, **kw: Any) -> tuple[Path, Path]:
    """Write the study's two runs (A: better host, B: the other) under ``out_dir``."""
    root = Path(out_dir)
    return (
        write_trace(root / "A", study_records(STUDY_A, **kw)),
        write_trace(root / "B", study_records(STUDY_B, **kw)),
    )
