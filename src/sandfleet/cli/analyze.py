"""``sandfleet analyze``: the figures of one run, or of two runs on the same tasks.

    sandfleet analyze RUN [RUN_B] [--whatif 1,2,4,8,16,32] [--step-time S]
                      [--staleness-bound K] [--html OUT] [--json]
    sandfleet analyze --convert harbor JOB_DIR --out RUN_DIR

The command only parses options: :func:`sandfleet.analysis.report.build_report` makes the
typed report, and its renderers print it (``Report.to_json``, :mod:`sandfleet.analysis.text`)
or write it (:mod:`sandfleet.analysis.html`).

Bad input (a missing trace, a line that isn't JSON, an unknown span) prints ``error: ...``
naming file and line, and exits with status 2.
"""

from __future__ import annotations

import json

import click

from sandfleet.analysis.fmt import table
from sandfleet.errors import SandfleetError

__all__ = ["analyze", "table"]

EXIT_BAD_INPUT = 2


def _parse_ks(text: str) -> list[float]:
    try:
        ks = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise click.BadParameter(f"expected numbers separated by commas, got {text!r}") from e
    if not ks or any(k <= 0 for k in ks):
        raise click.BadParameter("speed-ups must be positive numbers, e.g. 1,2,4,8")
    return ks


@click.command("analyze")
@click.argument("runs", nargs=-1, required=True, type=click.Path(), metavar="RUN [RUN_B]")
@click.option(
    "--whatif",
    "whatif_text",
    default="1,2,4,8,16,32",
    show_default=True,
    help="Inference speed-ups k to recompute rollout time (and the gap) for.",
)
@click.option(
    "--step-time",
    type=float,
    default=None,
    help="Trainer step time in seconds for the staleness distribution "
    "[default: the step time the bound allows for run A].",
)
@click.option(
    "--staleness-bound",
    type=float,
    default=1.0,
    show_default=True,
    help="Weight versions a rollout may land behind (at p90).",
)
@click.option(
    "--html",
    "html_out",
    type=click.Path(),
    default=None,
    help="Write a self-contained HTML report with plots here.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option(
    "--convert",
    "convert_fmt",
    type=click.Choice(["harbor"]),
    default=None,
    help="Convert another system's results (RUN is its job directory) into a "
    "sandfleet run at --out, instead of analyzing.",
)
@click.option("--out", type=click.Path(), default=None, help="Run directory for --convert.")
@click.pass_context
def analyze(
    ctx: click.Context,
    runs: tuple[str, ...],
    whatif_text: str,
    step_time: float | None,
    staleness_bound: float,
    html_out: str | None,
    as_json: bool,
    convert_fmt: str | None,
    out: str | None,
) -> None:
    """Turn the traces of RUN (and RUN_B) into where-the-time-goes figures.

    RUN is a run directory holding trace.jsonl, or a trace.jsonl file. With two runs on
    the same tasks, B is compared with A.
    """
    ks = _parse_ks(whatif_text)
    try:
        if convert_fmt:
            from sandfleet.analysis.convert import convert

            if len(runs) != 1 or not out:
                raise click.UsageError("--convert takes one source directory and --out RUN_DIR")
            path, n = convert(convert_fmt, runs[0], out)
            click.echo(f"wrote {n} rollouts to {path}")
            return
        if len(runs) > 2:
            raise click.UsageError("give one run, or two runs (A and B) to compare")
        from sandfleet.analysis.html import write_report
        from sandfleet.analysis.report import build_report
        from sandfleet.analysis.text import render_text
        from sandfleet.analysis.trace import load_run

        report = build_report([load_run(r) for r in runs], ks, step_time, staleness_bound)
        if html_out:
            write_report(html_out, report)
        click.echo(json.dumps(report.to_json(), indent=2) if as_json else render_text(report))
        if html_out and not as_json:
            click.echo(f"\nreport: {html_out}")
    except SandfleetError as e:
        click.echo(f"error: {e}", err=True)
        ctx.exit(EXIT_BAD_INPUT)
