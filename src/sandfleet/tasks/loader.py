"""``load_task`` and ``load_tasks``: a folder (or a folder of folders) into :class:`Task`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandfleet.errors import ImageError, TaskError
from sandfleet.images.dockerfile import parse_dockerfile
from sandfleet.tasks.harbor import load_harbor
from sandfleet.tasks.model import DEFAULT_WORKDIR, PreparePlan, Task, TaskFormat
from sandfleet.tasks.swebench import load_swebench
from sandfleet.tasks.tb1 import load_tb1

MARKERS: dict[str, TaskFormat] = {"task.toml": "harbor", "task.yaml": "terminal-bench-1",
                                  "swebench.json": "swebench"}
PREPARE_SCRIPT = "environment/prepare.sh"
"""The prepare step, a sandfleet extension of both formats (neither has one of its own)."""
PREPARE_MAX_BYTES = 1 << 20


def detect_format(path: Path) -> TaskFormat | None:
    """``harbor`` when ``path`` holds task.toml, ``terminal-bench-1`` for task.yaml, else None."""
    found = [fmt for marker, fmt in MARKERS.items() if (path / marker).is_file()]
    if len(found) > 1:
        raise TaskError("holds both task.toml and task.yaml; keep one", file=str(path))
    return found[0] if found else None


def load_task(path: Path | str) -> Task:
    """Load one task folder, detecting its format.

    Raises :class:`TaskError` for a malformed task (naming the file and field) and
    :class:`ImageBuildError` for a Dockerfile outside the supported subset (naming the line).
    """
    folder = Path(path).resolve()
    if not folder.is_dir():
        raise TaskError("is not a folder", file=str(folder))
    fmt = detect_format(folder)
    if fmt is None:
        raise TaskError(
            "holds neither task.toml (Harbor), task.yaml (Terminal-Bench 1) nor swebench.json (SWE-bench)",
            file=str(folder),
        )
    fields, solution, verifier = {"harbor": load_harbor, "terminal-bench-1": load_tb1,
                                  "swebench": load_swebench}[fmt](folder)
    extra_env = fields.pop("extra_env")
    workdir_override = fields.pop("workdir_override", None)  # Harbor [environment].workdir
    build_timeout = fields.get("build_timeout_s", Task.model_fields["build_timeout_s"].default)
    prepare = _prepare_plan(folder, float(build_timeout))
    workdir, env, user, base = DEFAULT_WORKDIR, {}, None, fields.get("docker_image")
    if fields["dockerfile"] is not None:
        parsed = parse_dockerfile(fields["dockerfile"])
        workdir = parsed.workdir or DEFAULT_WORKDIR
        env, user, base = dict(parsed.env), parsed.user, parsed.base_image
    workdir = workdir_override or workdir
    return Task(
        name=folder.name,
        path=folder,
        format=fmt,
        workdir=workdir,
        env={**env, **extra_env},
        user=user,
        base_image=base,
        solution=solution,
        verifier=verifier,
        prepare=prepare,
        **fields,
    )


def _prepare_plan(folder: Path, timeout_s: float) -> PreparePlan | None:
    """``environment/prepare.sh`` when the task has one: a regular file (not a link) of at
    most 1 MiB."""
    script = folder / PREPARE_SCRIPT
    if not script.exists() and not script.is_symlink():
        return None
    if script.is_symlink() or not script.is_file():
        raise TaskError("must be a regular file (the task's prepare step), not a link or a folder",
                        file=str(script))
    size = script.stat().st_size
    if size > PREPARE_MAX_BYTES:
        raise TaskError(f"is {size} bytes; a prepare step is at most {PREPARE_MAX_BYTES} bytes", file=str(script))
    return PreparePlan(script=script, timeout_s=timeout_s)


@dataclass(frozen=True)
class LoadFailure:
    """A task folder that did not load, and why."""

    path: Path
    error: TaskError | ImageError


def find_task_dirs(root: Path | str) -> list[Path]:
    """``root`` itself when it is a task, else its task sub-folders (one level), sorted."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise TaskError("is not a folder", file=str(root))
    if detect_format(root) is not None:
        return [root]
    children = (p for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith("."))
    return [p for p in children if any((p / m).is_file() for m in MARKERS)]


def load_tasks(root: Path | str) -> tuple[list[Task], list[LoadFailure]]:
    """Load every task under ``root``; returns the tasks sorted by name and the failures.

    Every folder is tried; a broken one never hides the others."""
    tasks: list[Task] = []
    failures: list[LoadFailure] = []
    for folder in find_task_dirs(root):
        try:
            tasks.append(load_task(folder))
        except (TaskError, ImageError) as e:
            failures.append(LoadFailure(folder, e))
    return sorted(tasks, key=lambda t: t.name), failures
