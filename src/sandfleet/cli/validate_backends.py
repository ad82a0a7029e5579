"""``sandfleet tasks validate --backends all|b1,b2``: each task's oracle (and no-op) on every
backend asked for that this host has, and the tasks whose oracle reward differs between them.

A task whose oracle scores 1 on bwrap and 0 on gVisor (a syscall gVisor lacks, a /proc file it
fakes, a timing under ptrace) is a false zero waiting for whoever trains on that backend."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sandfleet.sandbox.registry import ISOLATED, NAMES

if TYPE_CHECKING:
    from sandfleet.rollout.validate import Verdict

ORDER = (*sorted(ISOLATED), *(b for b in NAMES if b not in ISOLATED))
"""``all``: the isolated backends by name (bwrap, gvisor, microvm), then process."""


def chosen_backends(spec: str) -> tuple[list[str], dict[str, str]]:
    """The backends ``spec`` names (``all``: every one) that this host has, in a fixed order,
    and those it lacks with why (from ``sandfleet doctor``)."""
    from sandfleet.doctor import report
    from sandfleet.sandbox.spec import BACKENDS

    asked = list(ORDER) if spec.strip() == "all" else [b.strip() for b in spec.split(",") if b.strip()]
    unknown = [b for b in asked if b not in BACKENDS]
    if unknown or not asked:
        raise click.BadParameter(f"unknown backend(s) {', '.join(unknown) or '(none)'}; known: all, "
                                 f"{', '.join(BACKENDS)}", param_hint="--backends")
    facts = report()["backends"]
    have = [b for b in asked if facts.get(b, {}).get("available")]
    lacking = {b: str(facts.get(b, {}).get("reason") or "not available") for b in asked if b not in have}
    if spec.strip() != "all" and lacking:
        raise click.UsageError("--backends: this host lacks " + "; ".join(f"{b} ({why})" for b, why in lacking.items()))
    if not have:
        raise click.UsageError("--backends: none of them is available here")
    return have, lacking


def differing(per_backend: dict[str, dict[str, Verdict]]) -> dict[str, dict[str, list[float | None]]]:
    """Tasks whose oracle did not score the same on every backend (how many of its runs passed),
    with the oracle's rewards on each."""
    out: dict[str, dict[str, list[float | None]]] = {}
    names = sorted({n for verdicts in per_backend.values() for n in verdicts})
    for name in names:
        rewards = {b: per_backend[b][name].oracle_rewards for b in per_backend if name in per_backend[b]}
        passed = {sum(1 for r in rs if r is not None and r >= 1.0 - 1e-9) / max(len(rs), 1) for rs in rewards.values()}
        if len(passed) > 1:
            out[name] = rewards
    return out


def validate_per_backend(backends: Sequence[str], lacking: dict[str, str], run: Callable[[str], dict[str, Verdict]],
                         failures: Sequence[Any], repeats: int, report_path: Path, as_json: bool,
                         invalid: Callable[[str], Verdict]) -> None:
    """Validate on each backend in turn (``run(backend)``), then write and print the report:
    per backend every verdict, and the tasks whose oracle reward differs. Exit 1 when one
    differs or a task is not valid somewhere."""
    per_backend: dict[str, dict[str, Verdict]] = {}
    wall: dict[str, float] = {}
    for backend in backends:
        t0 = time.perf_counter()
        verdicts = run(backend)
        wall[backend] = round(time.perf_counter() - t0, 1)
        for failure in failures:
            verdicts[failure.path.name] = invalid(f"does not load: {failure.error}")
        per_backend[backend] = verdicts
    differs = differing(per_backend)
    report: dict[str, Any] = {
        "backends": list(backends),
        "unavailable": lacking,
        "differs": differs,
        "wall_s": wall,
        "per_backend": {b: {n: asdict(v) for n, v in sorted(vs.items())} for b, vs in per_backend.items()},
    }
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        rows = [("task", *(f"{b} oracle=1" for b in backends), "")]
        for name in sorted({n for vs in per_backend.values() for n in vs}):
            cells = []
            for b in backends:
                v = per_backend[b].get(name)
                good = sum(1 for r in (v.oracle_rewards if v else []) if r is not None and r >= 1.0 - 1e-9)
                cells.append(f"{good}/{len(v.oracle_rewards) if v else 0}" + ("" if v is None or v.status == "valid"
                                                                              else f" {v.status}"))
            rows.append((name, *cells, "DIFFERS" if name in differs else ""))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        for b, why in lacking.items():
            click.echo(f"skipped {b}: {why}", err=True)
        for b in backends:
            for name, v in sorted(per_backend[b].items()):
                if v.status != "valid":
                    click.echo(f"\n{name} on {b}: {v.status}\n{v.reason}", err=True)
        click.echo(f"\n{len(differs)} task(s) whose oracle reward differs between {', '.join(backends)}"
                   + (f": {', '.join(differs)}" if differs else "") + f" (repeats {repeats}; wall "
                   + ", ".join(f"{b} {s} s" for b, s in wall.items()) + f"); report: {report_path}")
    if differs or any(v.status != "valid" for vs in per_backend.values() for v in vs.values()):
        raise SystemExit(1)
