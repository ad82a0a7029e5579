"""Base coverage of a folder of tasks: how many build exactly, how many are approximated
(grouped by substitution) and how many are refused (grouped by reason), read from each
task's Dockerfile without building anything (``sandfleet tasks validate --coverage``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from sandfleet.errors import ImageBuildError, SandfleetError
from sandfleet.images.bases import resolve_base
from sandfleet.tasks.model import Task

Class = Literal["exact", "approximated", "refused"]


@dataclass
class BaseCoverage:
    """How one task's bases map: its class, the substitutions or the refusal."""

    coverage: Class
    groups: list[str] = field(default_factory=list)
    """The substitutions (``golang -> Debian trixie golang-go``) or the refusal reason."""
    detail: list[str] = field(default_factory=list)
    """The warnings (asked and got) or the refusal, in full."""
    asked: list[str] = field(default_factory=list)
    got: list[str] = field(default_factory=list)


def task_coverage(task: Task, *, strict: bool = False, accept_older: bool = False) -> BaseCoverage:
    """The coverage class of ``task``: every FROM of the stages its final stage needs."""
    from sandfleet.images.dockerfile import parse_dockerfile
    from sandfleet.imagestore import arch

    if task.dockerfile is None:
        if task.docker_image is None:
            return BaseCoverage("exact", ["no Dockerfile: the host's root"])
        return BaseCoverage("refused", ["names only a registry image (no environment/Dockerfile)"],
                            [f"{task.docker_image}: sandfleet can't pull images"])
    try:
        df = parse_dockerfile(task.dockerfile, arch=arch())
    except SandfleetError as e:
        return BaseCoverage("refused", ["the Dockerfile does not parse"], [str(e)])
    stages = [df.stages[i] for i in df.needed_stages()]
    refs = [(s.base.image, str(task.dockerfile), s.base.line) for s in stages if s.parent is None]
    out = BaseCoverage("exact")
    for ref, file, line in refs:
        try:
            base = resolve_base(ref, strict=strict, accept_older=accept_older, file=file, line=line)
        except ImageBuildError as e:
            reason = getattr(e, "reason", None) or str(e)
            return BaseCoverage("refused", [reason], [str(e)])
        if base.substituted:
            out.coverage = "approximated"
            out.groups.append(base.kind)
            out.detail.append(base.note or base.kind)
        if base.asked and base.got:
            out.asked.append(base.asked)
            out.got.append(base.got)
    return out


def coverage_report(tasks: Sequence[Task], **kw: bool) -> dict[str, object]:
    """``{"tasks": n, "exact": n, "approximated": {group: [task, ...]}, "refused": {reason:
    [task, ...]}, "per_task": {task: BaseCoverage}}``."""
    per_task = {t.name: task_coverage(t, **kw) for t in tasks}
    approximated: dict[str, list[str]] = {}
    refused: dict[str, list[str]] = {}
    for name, c in sorted(per_task.items()):
        if c.coverage == "approximated":
            for group in dict.fromkeys(c.groups):
                approximated.setdefault(group, []).append(name)
        elif c.coverage == "refused":
            refused.setdefault(c.groups[0], []).append(name)
    counts = {k: sum(1 for c in per_task.values() if c.coverage == k) for k in ("exact", "approximated", "refused")}
    return {"tasks": len(per_task), "counts": counts,
            "approximated": dict(sorted(approximated.items(), key=lambda kv: (-len(kv[1]), kv[0]))),
            "refused": dict(sorted(refused.items(), key=lambda kv: (-len(kv[1]), kv[0]))),
            "per_task": {n: asdict(c) for n, c in sorted(per_task.items())}}


def format_coverage(report: dict[str, object]) -> list[str]:
    """The report as lines: the three counts, then each group with its tasks."""
    counts: dict[str, int] = report["counts"]  # type: ignore[assignment]
    n = int(report["tasks"])  # type: ignore[call-overload]
    lines = [f"base coverage of {n} task(s): {counts['exact']} exact, {counts['approximated']} approximated, "
             f"{counts['refused']} refused"]
    for title, key in (("approximated", "approximated"), ("refused", "refused")):
        groups: dict[str, list[str]] = report[key]  # type: ignore[assignment]
        for group, names in groups.items():
            shown = ", ".join(names[:8]) + (f", ... ({len(names) - 8} more)" if len(names) > 8 else "")
            lines.append(f"  {title} {len(names):>3}  {group}: {shown}")
    return lines
