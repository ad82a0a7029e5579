"""``sandfleet tasks``: list task folders and import public suites."""

from __future__ import annotations

import json
from pathlib import Path

import click

from sandfleet.cli.validate import validate
from sandfleet.errors import ImageBuildError
from sandfleet.images.bases import resolve_base
from sandfleet.tasks.loader import load_tasks
from sandfleet.tasks.model import Task


@click.group()
def tasks() -> None:
    """Load, import and validate task folders."""


def _base(task: Task) -> str:
    """What the task's FROM becomes; a substitution says so (docs/tasks.md, Base images)."""
    if task.base_image is None:
        return "-"
    try:
        ref = resolve_base(task.base_image)
    except ImageBuildError as e:
        return f"{task.base_image} (unsupported: {e})"
    return ref.describe() + (" [substitution]" if ref.substituted else "")


def _warning(task: Task) -> str | None:
    try:
        return resolve_base(task.base_image).note if task.base_image else None
    except ImageBuildError:
        return None


@tasks.command("ls")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per task.")
def ls(directory: Path, as_json: bool) -> None:
    """List the tasks under DIRECTORY (a task folder or a folder of them)."""
    loaded, failures = load_tasks(directory)
    if as_json:
        for task in loaded:
            row = {
                "name": task.name,
                "format": task.format,
                "path": str(task.path),
                "agent_timeout_s": task.agent_timeout_s,
                "verifier_timeout_s": task.verifier_timeout_s,
                "base_image": task.base_image,
                "base": _base(task),
                "base_warning": _warning(task),
            }
            click.echo(json.dumps(row))
        for failure in failures:
            click.echo(json.dumps({"path": str(failure.path), "error": str(failure.error)}))
    else:
        for task in loaded:
            click.echo(
                f"{task.name:40} {task.format:17} agent {task.agent_timeout_s:>6.0f}s "
                f"verifier {task.verifier_timeout_s:>5.0f}s  {_base(task)}"
            )
        for failure in failures:
            click.echo(f"error: {failure.error}", err=True)
        click.echo(f"{len(loaded)} tasks, {len(failures)} failed to load", err=True)
    if failures:
        raise SystemExit(1)


@tasks.command("import")
@click.argument("suite", type=click.Choice(["humaneval", "intercode-bash", "swebench"]))
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--repos", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="swebench: local clones of the instances' repositories (DIR/owner__name).")
def import_(suite: str, paths: tuple[Path, ...], repos: Path | None) -> None:
    """Import SUITE into task folders: `import humaneval|intercode-bash OUT` (from the installed PyPI
    package, as Harbor tasks), `import swebench FILE.jsonl [OUT]` (SWE-bench instances whose
    repositories can be fetched; OUT defaults to swebench-tasks)."""
    from sandfleet.tasks.importers import IMPORTERS

    if suite == "swebench":
        from sandfleet.errors import TaskError
        from sandfleet.tasks.importers.swebench import import_swebench

        if len(paths) not in (1, 2):
            raise click.UsageError("usage: sandfleet tasks import swebench FILE.jsonl [OUT]")
        out = paths[1] if len(paths) == 2 else Path("swebench-tasks")
        try:
            done = import_swebench(paths[0], out, repos=repos)
        except (TaskError, OSError) as e:
            raise click.ClickException(str(e)) from None
        for name, why in sorted(done.skipped.items()):
            click.echo(f"skipped {name}: {why}", err=True)
        click.echo(f"wrote {len(done.written)} tasks to {out}; skipped {len(done.skipped)} "
                   f"(see {out / 'IMPORT_REPORT.md'})")
        if not done.written:
            raise SystemExit(1)
        return
    if len(paths) != 1:
        raise click.UsageError(f"usage: sandfleet tasks import {suite} OUT")
    out = paths[0]

    result = IMPORTERS[suite](out)
    click.echo(
        f"wrote {len(result.written)} tasks to {out}; skipped {len(result.skipped)} "
        f"(see {out / 'IMPORT_REPORT.md'})"
    )



@tasks.command("generate")
@click.argument("family", type=click.Choice(["bash-basics"]))
@click.option("--n", "n", type=int, default=8, show_default=True, help="Instances per template.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="A new (or empty) folder.")
@click.option("--template", "templates", multiple=True, help="Only this template (repeatable).")
def generate_(family: str, n: int, seed: int, out: Path, templates: tuple[str, ...]) -> None:
    """Generate FAMILY's Harbor tasks from templates into OUT/train and OUT/eval (split by
    instance; each template's last paraphrase is held out for eval), with OUT/manifest.jsonl."""
    from sandfleet.errors import ConfigError
    from sandfleet.tasks.generate import generate

    try:
        made = generate(family, out, n=n, seed=seed, templates=templates)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    n_train = sum(g.split == "train" for g in made)
    click.echo(f"wrote {len(made)} tasks to {out} ({n_train} train, {len(made) - n_train} eval); "
               f"{out / 'manifest.jsonl'}")


tasks.add_command(validate)  # runs rollouts: sandfleet.cli.validate
