"""``sandfleet analyze``: the figures of one run, or of two runs on the same tasks.

    sandfleet analyze RUN [RUN_B] [--whatif 1,2,4,8,16,32] [--step-time S]
                      [--staleness-bound K] [--html OUT] [--json]
    sandfleet analyze --convert harbor JOB_DIR --out RUN_DIR

Bad input (a missing trace, a line that isn't JSON, an unknown span) prints ``error: ...``
naming file and line, and exits with status 2.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from sandfleet.analysis.fmt import interval as _interval
from sandfleet.analysis.fmt import num as _f
from sandfleet.analysis.fmt import pct as _pct
from sandfleet.errors import SandfleetError

EXIT_BAD_INPUT = 2


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned text columns: the first left-aligned, the others right-aligned."""
    cols = list(zip(*([list(headers)] + [list(r) for r in rows]), strict=True))
    widths = [max(len(c) for c in col) for col in cols]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _parse_ks(text: str) -> list[float]:
    try:
        ks = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise click.BadParameter(f"expected numbers separated by commas, got {text!r}") from e
    if not ks or any(k <= 0 for k in ks):
        raise click.BadParameter("speed-ups must be positive numbers, e.g. 1,2,4,8")
    return ks


def render_text(a: dict[str, Any]) -> str:
    """The analysis as aligned tables."""
    labs = list(a["runs"])
    out = [
        table(
            ["run", "name", "rollouts", "completed", "failed", "cancelled"],
            [
                [
                    lab,
                    r["name"],
                    str(r["rollouts"]),
                    str(r["completed"]),
                    str(r["failed"]),
                    str(r["cancelled"]),
                ]
                for lab, r in a["runs"].items()
            ],
        )
    ]
    out.append("\nVerdicts (final attempts; pass rate over scored + policy_fault, masked apart)")
    out.append(table(
        ["run", "scored", "policy_fault", "infra_fault", "mask rate", "pass rate", "refilled"],
        [[lab, *(str(r["verdicts"][v]) for v in ("scored", "policy_fault", "infra_fault")), _pct(r["mask_rate"]),
          _pct(r["pass_rate"]), str(r["refilled"])] for lab, r in a["runs"].items()],
    ))
    out.append("\nContention (final attempts; outside = work outside the sandbox, own = its CPU limit's "
               "throttling; docs/rollouts.md)")
    out.append(table(
        ["run", "phase", "measured", "outside share mean", "p95", "outside wait s", "own throttled s",
         "host_contention masks"],
        [[lab, ph, str(c[ph]["measured"]), _f(c[ph]["outside_share_mean"], 2), _f(c[ph]["outside_share_p95"], 2),
          _f(c[ph]["outside_wait_s_mean"], 2), _f(c[ph]["throttled_s_mean"], 2),
          f"{c['host_contention']} ({_pct(c['host_contention_rate'])})" if ph == "verifier" else ""]
         for lab, r in a["runs"].items() if (c := r.get("contention")) for ph in ("agent", "verifier")],
    ))
    if not all(r["model_time_known"] for r in a["runs"].values()):
        out.append("note: model time unknown in some traces (converted); it is in agent_command")
    heads = [f"{lab} {m}" for lab in labs for m in ("mean", "median", "p90")]
    out.append("\nBreakdown per span (seconds per completed rollout)")
    out.append(
        table(
            ["span", *heads],
            [
                [
                    col,
                    *(
                        _f(a["spans"][lab][col][m])
                        for lab in labs
                        for m in ("mean", "median", "p90")
                    ),
                ]
                for col in a["spans"][labs[0]]
            ],
        )
    )
    out.append(
        "\nPlatform overhead (sandbox_start + other_sandbox + overhead, per completed rollout)"
    )
    out.append(
        table(
            ["run", "mean s", "of wall time", "sandbox_start s", "raw bwrap true ms"],
            [
                [lab, _f(a["platform_overhead_s"][lab]), _pct(a["platform_overhead_fraction"][lab]),
                 _f(a["spans"][lab]["sandbox_start"]["mean"], 3), _f(a["raw_bwrap_true_ms"].get(lab), 1)]
                for lab in labs
            ],
        )
    )
    if "compare" in a:
        c = a["compare"]
        left = f"; left out, without a completed rollout in one run: {', '.join(c['tasks_left_out'])}"
        out.append(
            f"\nB - A (same {c['tasks']} tasks, mean of per-task means; "
            f"{100 * c['ci_level']:g} % bootstrap intervals"
            + (left if c["tasks_left_out"] else "")
            + ")"
        )
        out.append(
            table(
                ["span", "A s", "B s", "B - A s", "interval s", "B - A %", "interval %"],
                [
                    [
                        col,
                        _f(d["a"]),
                        _f(d["b"]),
                        _f(d["delta_s"], suffix=" s"),
                        _interval(d["delta_s_ci90"]),
                        _f(d["delta_pct"], suffix=" %"),
                        _interval(d["delta_pct_ci90"]),
                    ]
                    for col, d in c["spans"].items()
                ],
            )
        )
    two = len(labs) == 2
    out.append(
        "\nWhat if inference were k times faster"
        + (f" (gap = {a['gap_definition']})" if two else "")
    )
    if a["whatif_not_applicable"]:
        out.append(f"not applicable: {a['whatif_not_applicable']}")
    else:
        out.append(
            table(
                ["k", *(f"{lab} mean s" for lab in labs), *(["gap"] if two else [])],
                [
                    [k, *(_f(d[lab]) for lab in labs), *([_pct(d["gap"])] if two else [])]
                    for k, d in a["whatif_detail"].items()
                ],
            )
        )
    out.append("\nKV cache and GRPO groups")
    out.append(
        table(
            ["run", "KV-cache idle", "KV idle through reward", "group wait"],
            [
                [
                    lab,
                    _pct(a["kv_idle_fraction"][lab]),
                    _pct(a["kv_idle_fraction_through_reward"][lab]),
                    _pct(a["group_wait_fraction"][lab]),
                ]
                for lab in labs
            ],
        )
    )
    for lab in labs:  # a --branch run: the work its trees did not redo (docs/figures.md)
        tf = (a.get("trees") or {}).get(lab)
        if tf:
            ws = tf["work_saved"]
            out.append(f"\nTrees of run {lab}: {ws['trees']} trees, {ws['leaves']} leaves, {ws['branches']} branches "
                       f"({_f(ws['branch_s'])} s); work saved against independent rollouts to the same leaves")
            out.append(table(["work", "ran", "independent", "saved", "saved share"],
                             [[k, f"{ws['ran'][k]:.6g}", f"{ws['independent'][k]:.6g}", f"{ws['saved'][k]:.6g}",
                               _pct(ws["saved_fraction"][k])] for k in ws["ran"]]))
    st = a["staleness"]
    given = "given" if st["step_time_given"] else "the step time run A's bound allows"
    out.append(
        f"\nStaleness (trainer step {_f(st['step_time_s'])} s, {given}; "
        f"bound {st['bound_versions']:g} versions at p{st['quantile']:g})"
    )
    out.append(
        table(
            ["run", "p50", "p90", "max", "histogram (versions: rollouts)", "allowed step s"],
            [
                [
                    lab,
                    _f(d["p50"], 2),
                    _f(d["p90"], 2),
                    _f(d["max"], 2),
                    " ".join(f"{k}:{v}" for k, v in d["histogram"].items()),
                    _f(st["allowed_step_time_s"][lab]),
                ]
                for lab, d in st["distribution"].items()
            ],
        )
    )
    if "training_faster_pct" in st:
        out.append(
            f"training can step {_f(st['training_faster_pct'])} % faster with run "
            f"{st['faster_run']} at the same staleness"
        )
    return "\n".join(out)


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
        from sandfleet.analysis.report import analyze as analyze_runs
        from sandfleet.analysis.trace import load_run

        loaded = [load_run(r) for r in runs]
        result = analyze_runs(loaded, ks, step_time, staleness_bound)
        if html_out:
            write_report(html_out, result, loaded)
        click.echo(json.dumps(result, indent=2) if as_json else render_text(result))
        if html_out and not as_json:
            click.echo(f"\nreport: {html_out}")
    except SandfleetError as e:
        click.echo(f"error: {e}", err=True)
        ctx.exit(EXIT_BAD_INPUT)
