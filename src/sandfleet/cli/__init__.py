"""The ``sandfleet`` command line: every click command lives in this package (the top layer of
issue 27's order), one module per command, loaded lazily; :mod:`sandfleet.cli.where` holds
the "where to run" dispatch (here, ``--remote URL[,URL...]``, ``--ray``) that several share."""

from __future__ import annotations

import importlib
import logging
import signal
import sys
from typing import Any

import click

from sandfleet.settings import Settings, installed

# name -> "module:attribute" of a click command or group (all in this package), and its help line
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("sandfleet.cli.doctor:doctor", "What this host supports, with advice."),
    "sandbox": ("sandfleet.cli.sandbox:sandbox", "Create, use and remove sandboxes."),
    "image": ("sandfleet.cli.image:image", "Build and list environment images."),
    "tasks": ("sandfleet.cli.tasks:tasks", "Load, import and validate task folders."),
    "run": ("sandfleet.cli.run:run", "Run rollouts of a task suite (the main job)."),
    "replay": ("sandfleet.cli.replay:replay", "Run a run's rollouts again from their records; compare."),
    "bench": ("sandfleet.cli.bench:bench", "Benchmarks: micro, capacity, compare."),
    "analyze": ("sandfleet.cli.analyze:analyze", "Turn traces into the figures of a hardware choice."),
    "model-server": ("sandfleet.cli.model_server:model_server", "Serve scripted chat replies (tests, demos)."),
    "serve": ("sandfleet.cli.serve:serve", "Serve this host's sandboxes over HTTP (docs/service.md)."),
}


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        try:
            cmd = _load(target[0])
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("sandfleet"):
                raise click.ClickException(f"command {cmd_name!r} is not available yet ({e})") from e
            raise
        assert isinstance(cmd, click.Command)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.version_option(package_name="sandfleet")
def cli(verbose: int) -> None:
    """sandfleet: agentic RL rollouts in isolated sandboxes."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    # the environment, read once here: the command and everything below read these settings
    settings = click.get_current_context().with_resource(installed(Settings.from_env()))
    logging.basicConfig(
        level=log_level(settings.log_level, level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def log_level(text: str | None, default: int) -> int:
    """``SANDFLEET_LOG_LEVEL``: a level name (DEBUG, info ...) or number; a bad one is a usage error."""
    if text is None or not text.strip():
        return default
    text = text.strip()
    if text.isdigit():
        return int(text)
    level = logging.getLevelNamesMapping().get(text.upper())
    if level is None:
        names = ", ".join(n for n in logging.getLevelNamesMapping() if n not in ("WARN", "FATAL", "NOTSET"))
        raise click.UsageError(f"SANDFLEET_LOG_LEVEL={text!r} is not a log level (one of {names}, or a number)")
    return level


def _terminate(signum: int, frame: object) -> None:
    signal.raise_signal(signal.SIGINT)  # asyncio.run turns it into a clean cancellation


def main(argv: list[str] | None = None) -> Any:
    from sandfleet.errors import SandfleetError
    from sandfleet.reaping import become_subreaper, run_as_init

    run_as_init()  # as PID 1: a small init stays PID 1, this goes on as its child
    become_subreaper()  # what a sandbox leaves behind (bwrap's child) is reaped here, not by init
    # SIGTERM stops like Ctrl-C: running work is cancelled and every sandbox is closed,
    # also when started in the background (where the shell leaves SIGINT ignored).
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        return cli.main(args=argv, prog_name="sandfleet", standalone_mode=True)
    except SandfleetError as e:  # pragma: no cover - click handles most
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
