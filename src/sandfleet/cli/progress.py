"""Progress of a command that runs rollouts (``sandfleet run``, ``tasks validate``): a bar on
a terminal, and lines a log can keep when stderr is not one (click's bar draws nothing there)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TextIO

import click

if TYPE_CHECKING:
    from sandfleet.rollout.result import RolloutResult

LINES = 50
"""About how many progress lines a run writes to a log, whatever its size (at least one per
rollout for runs of up to this many, and always the last)."""


def every(total: int) -> int:
    """A line per this many final rollouts."""
    return max(1, -(-total // LINES))


@contextlib.contextmanager
def progress(total: int, label: str = "rollouts", file: TextIO | None = None,
             tty: bool | None = None) -> Iterator[Callable[[RolloutResult], None]]:
    """What each final result is handed to: on a terminal a bar on stderr (passes and failures
    so far), elsewhere a line per :func:`every` results (``rollouts 12/40 (30 %): pass 9 fail 1,
    12.5 s | <task>``), flushed, so ``... > run.log 2>&1`` shows how far it got."""
    out = file or sys.stderr
    if tty is None:
        tty = out.isatty()
    passed = failed = done = 0
    step = every(total)
    t0 = time.monotonic()
    if tty:
        with click.progressbar(length=total, label=label, file=out, show_pos=True, item_show_func=lambda s: s) as bar:
            def on_bar(result: RolloutResult) -> None:
                nonlocal passed, failed
                if not result.final:
                    return  # another attempt follows
                passed += result.passed
                failed += result.status != "completed"
                bar.update(1, f"pass {passed} fail {failed} | {result.task}")

            yield on_bar
        return

    def on_line(result: RolloutResult) -> None:
        nonlocal passed, failed, done
        if not result.final:
            return
        done += 1
        passed += result.passed
        failed += result.status != "completed"
        if done % step == 0 or done == total:
            pct = f" ({100 * done // total} %)" if total else ""
            click.echo(f"{label} {done}/{total}{pct}: pass {passed} fail {failed}, "
                       f"{time.monotonic() - t0:.1f} s | {result.task}", file=out)
            out.flush()

    click.echo(f"{label}: {total} to run", file=out)
    out.flush()
    yield on_line
