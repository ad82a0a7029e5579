"""``sandfleet tasks validate --arch amd64,arm64 [--page-size 64k]``: each architecture in turn
(a foreign one under qemu-user emulation), one verdict per task across them
(:mod:`sandfleet.tasks.archreport`), a table and a JSON report."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from sandfleet.errors import HostUnsupportedError
from sandfleet.images import emulation
from sandfleet.tasks.archreport import LARGE_PAGE_ARCHES, classify, good, page_problems


def validate_per_arch(arches_text: str | None, page_size_text: str | None, tasks: Sequence[Any],
                      failures: Sequence[Any], repeats: int, report_path: Path, as_json: bool,
                      run: Callable[[], dict[str, Any]], invalid: Callable[[str], Any]) -> None:
    """Validate ``tasks`` once per architecture (``run()`` validates for the current target),
    write the report and print the table; exits 1 unless every task is valid on every arch."""
    try:
        arches = [emulation.normalize(a) for a in (arches_text or emulation.host_arch()).split(",") if a.strip()]
        pages = emulation.parse_page_size(page_size_text) if page_size_text else None
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    per_arch: dict[str, dict[str, Any]] = {}
    wall: dict[str, float] = {}
    problems: dict[str, dict[str, dict[str, int]]] = {}
    before = emulation.target()
    try:
        for arch in arches:
            emulation.set_target(arch)
            t0 = time.perf_counter()
            try:
                with emulation.emulation(arch):
                    verdicts = run()
                    if pages and arch in LARGE_PAGE_ARCHES:
                        cache: dict[Path, dict[str, int]] = {}
                        problems[arch] = {t.name: page_problems(t, pages, cache) for t in tasks
                                          if verdicts.get(t.name) is None or "image build failed"
                                          not in verdicts[t.name].reason}
            except HostUnsupportedError as e:
                raise click.ClickException(str(e)) from None
            wall[arch] = time.perf_counter() - t0
            for failure in failures:
                verdicts[failure.path.name] = invalid(f"does not load: {failure.error}")
            per_arch[arch] = verdicts
    finally:
        emulation.set_target(before)
    names = sorted({n for v in per_arch.values() for n in v})
    verdict = {n: classify({a: per_arch[a][n] for a in arches if n in per_arch[a]}) for n in names}
    report: dict[str, Any] = {
        "arches": {a: {n: asdict(v) for n, v in sorted(per_arch[a].items())} for a in arches},
        "verdict": verdict, "wall_s": {a: round(s, 1) for a, s in wall.items()}, "repeats": repeats,
        "host_arch": emulation.host_arch(),
    }
    if pages:
        report["page_size"] = {"bytes": pages, "problems": problems}
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        rows = [("task", *arches, "verdict")]
        for n in names:
            cells = [f"{per_arch[a][n].status} ({good(per_arch[a][n])}/{len(per_arch[a][n].oracle_rewards)})"
                     if n in per_arch[a] else "-" for a in arches]
            rows.append((n, *cells, verdict[n]))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        counts: dict[str, int] = {}
        for v in verdict.values():
            key = "flaky" if v.startswith("flaky") else v
            counts[key] = counts.get(key, 0) + 1
        click.echo("\n" + ", ".join(f"{k}: {c}" for k, c in sorted(counts.items())))
        for a in arches:
            click.echo(f"{a}: {wall[a]:.1f} s" + (f" ({wall[a] / wall[arches[0]]:.1f}x {arches[0]})"
                                                   if a != arches[0] and wall[arches[0]] > 0 else ""))
        for a, per_task in problems.items():
            flagged = {n: p for n, p in per_task.items() if p}
            click.echo(f"page size {pages and pages // 1024}k on {a}: {len(flagged)}/{len(per_task)} task images "
                       f"hold ELF files it can't load" + (": " + ", ".join(
                           f"{n} ({len(p)}, e.g. {min(p)})" for n, p in sorted(flagged.items())[:10]) if flagged
                           else ""))
        click.echo(f"report: {report_path}")
    if any(not v.startswith("valid on both") and v != "valid on all" for v in verdict.values()) or any(
            any(p.values()) for p in problems.values()):
        raise SystemExit(1)
