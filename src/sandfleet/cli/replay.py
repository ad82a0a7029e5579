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
              help="Write replay.json, report.txt, report.html and the replays' own records.jsonl here "
                   "(and replays.jsonl as each rollout ends: --resume goes on from it).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-normalize", "off", multiple=True, type=click.Choice([*NORMALIZERS, "all"]),
              help="Compare outputs without this normalizer (repeatable; all: none of them).")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 1000),
              help="Replay each rollout K times and report the reward flip rate.")
@click.option("--until-turn", "until_turn", default=None, type=click.IntRange(0, 100_000), metavar="T",
              help="Stop each policy after turn T and leave its sandbox alive there (with --no-keep: closed, "
                   "after the verifier ran; the reward is shown, not compared).")
@click.option("--stop-before", "stop_before", type=click.Choice(["verifier"]), default=None,
              help="End each replay before the verifier and leave its sandbox alive (the commands are compared, "
                   "the reward is not).")
@click.option("--keep/--no-keep", default=None,
              help="Leave each replay's sandbox alive, no verifier run in it (default: with --stop-before or "
                   "--until-turn). Listed by `sandfleet sandbox ls`, reached by `sandbox exec`, gone after "
                   "--ttl or `sandbox rm` (with --remote: on the service, those commands with --remote).")
@click.option("--ttl", "ttl_s", default=600.0, show_default=True, type=click.FloatRange(1, 7 * 86400),
              help="A kept sandbox's lifetime from its start, seconds.")
@click.option("--resume", is_flag=True,
              help="Go on with the replay that --out DIR holds (killed or stopped): the rollouts its "
                   "replays.jsonl holds are not replayed again.")
@click.option("--remote", metavar="URL", default=None,
              help="Replay in the sandboxes of the sandfleet service at URL (its token in $SANDFLEET_TOKEN); "
                   "each record's image is checked there.")
@click.option("--concurrency", default=None, type=click.IntRange(1, 1000),
              help="Replays at once (default: as many sandboxes as this host's CPUs hold, as `run` admits).")
@click.option("--tasks", "tasks_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Find the tasks in this folder (by their folder name) instead of where they were recorded.")
def replay(run_dir: Path, rollout_ids: tuple[str, ...], backend: str | None, out_dir: Path | None, as_json: bool,
           off: tuple[str, ...], repeat: int, until_turn: int | None, stop_before: str | None,
           concurrency: int | None, tasks_dir: Path | None, keep: bool | None, ttl_s: float,
           resume: bool, remote: str | None) -> None:
    """Replay RUN_DIR's rollouts (records.jsonl) in fresh sandboxes of the same images, the model
    answered from the record. Exits 1 when a record is refused (its task's files or image
    changed) or was edited after recording."""
    import sandfleet.integrations._session  # noqa: F401  (its session policy's rebuilder: records of a trainer's run)
    from sandfleet.client.remote import on_remote
    from sandfleet.errors import ConfigError, SandfleetError
    from sandfleet.rollout.replay_run import replay_run, report_text, write_out

    normalizers = () if "all" in off else tuple(n for n in NORMALIZERS if n not in off)
    if resume and out_dir is None:
        raise click.UsageError("--resume needs --out DIR: the replay to go on with")
    if keep is None:
        keep = stop_before is not None or until_turn is not None
    try:
        report = asyncio.run(on_remote(remote, lambda: replay_run(
            run_dir, rollout_ids=rollout_ids, backend=backend, normalizers=normalizers, repeat=repeat,
            concurrency=concurrency, tasks_dir=tasks_dir, until_turn=until_turn,
            stop_before_verifier=stop_before == "verifier", keep=keep, keep_ttl_s=ttl_s,
            journal_dir=out_dir, resume=resume,
            on_checked=lambda line: click.echo(line, err=True))))
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    except SandfleetError as e:  # the service refused or can't be reached
        raise click.ClickException(str(e)) from None
    text = report_text(report)
    if out_dir is not None:
        write_out(report, out_dir, text)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else text)
    summary = report.summary()
    if summary["refused"] or summary["tampered"]:
        raise SystemExit(1)
