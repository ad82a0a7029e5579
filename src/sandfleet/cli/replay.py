"""``sandfleet replay``: run a run's rollouts again from their records and tell them apart from
the originals, command by command (docs/replay.md)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from sandfleet.rollout.normalize import NORMALIZERS
from sandfleet.sandbox.registry import choices as backend_choices


@click.command("replay")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--rollout", "rollout_ids", multiple=True, metavar="ID", help="Replay only these rollouts (repeatable).")
@click.option("--backend", type=click.Choice(backend_choices(auto=False)), default=None,
              help="Replay on this backend (default: the recorded one).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write replay.json, report.txt, report.html and the replays' own records.jsonl here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-normalize", "off", multiple=True, type=click.Choice([*NORMALIZERS, "all"]),
              help="Compare outputs without this normalizer (repeatable; all: none of them).")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 1000),
              help="Replay each rollout K times and report the reward flip rate.")
@click.option("--until-turn", "until_turn", default=None, type=click.IntRange(0, 100_000), metavar="T",
              help="Stop each policy after turn T (the verifier still runs; the reward is shown, not compared).")
@click.option("--stop-before", "stop_before", type=click.Choice(["verifier"]), default=None,
              help="End each replay before the verifier (the commands are compared, the reward is not).")
@click.option("--concurrency", default=None, type=click.IntRange(1, 1000),
              help="Replays at once (default: as many sandboxes as this host's CPUs hold, as `run` admits).")
@click.option("--tasks", "tasks_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Find the tasks in this folder (by their folder name) instead of where they were recorded.")
def replay(run_dir: Path, rollout_ids: tuple[str, ...], backend: str | None, out_dir: Path | None, as_json: bool,
           off: tuple[str, ...], repeat: int, until_turn: int | None, stop_before: str | None,
           concurrency: int | None, tasks_dir: Path | None) -> None:
    """Replay RUN_DIR's rollouts (records.jsonl) in fresh sandboxes of the same images, the model
    answered from the record. Exits 1 when a record is refused (its task's files or image
    changed) or was edited after recording."""
    from sandfleet.errors import ConfigError
    from sandfleet.rollout.replay_run import replay_run, report_text, write_out

    normalizers = () if "all" in off else tuple(n for n in NORMALIZERS if n not in off)
    try:
        report = asyncio.run(replay_run(run_dir, rollout_ids=rollout_ids, backend=backend, normalizers=normalizers,
                                        repeat=repeat, concurrency=concurrency, tasks_dir=tasks_dir,
                                        until_turn=until_turn, stop_before_verifier=stop_before == "verifier",
                                        on_checked=lambda line: click.echo(line, err=True)))
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    text = report_text(report)
    if out_dir is not None:
        write_out(report, out_dir, text)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else text)
    summary = report.summary()
    if summary["refused"] or summary["tampered"]:
        raise SystemExit(1)
