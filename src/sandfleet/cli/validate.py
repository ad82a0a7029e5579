"""``sandfleet tasks validate``: the oracle must score 1 and the no-op agent 0, every time
(:mod:`sandfleet.rollout.validate` holds what it runs; :mod:`sandfleet.cli.where`, where)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sandfleet.cli.progress import progress
from sandfleet.cli.where import RAY_ADDRESSES, Where, dispatch, ray_option, refuse, remote_option

if TYPE_CHECKING:
    from sandfleet.rollout.result import RolloutResult
    from sandfleet.rollout.validate import Verdict
    from sandfleet.tasks.model import Task


def _cell(rewards: list[float | None], want: float) -> str:
    good = sum(1 for r in rewards if r is not None and abs(r - want) < 1e-9)
    return f"{good}/{len(rewards)}"


@click.command("validate")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--repeats",
    "-r",
    default=3,
    show_default=True,
    type=int,
    help="Runs of the oracle and of the no-op agent per task.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report instead of a table.")
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("validation.json"),
    show_default=True,
    help="Where to write the report.",
)
@click.option("--concurrency", "concurrency_opt", default="auto", show_default=True,
              help="Rollouts at once. auto: as many sandboxes as this host's CPUs hold at the tasks' declared cpus; "
              "a larger number is allowed with a warning.")
@click.option("--backend", default="auto", show_default=True)
@click.option("--agent-user", "agent_user", default=None,
              help="Run the oracle and the no-op agent as this user (root = Docker's behaviour); default: "
              "each task's declared user, else the non-root 'agent'.")
@click.option("--network/--no-network", default=False, show_default=True,
              help="Network in the sandboxes (tests that download at test time need it).")
@click.option("--verify", "verify", type=click.Choice(["shared", "separate"]), default="shared", show_default=True,
              help="Run the tests in the rollout's sandbox, or in a fresh one that gets only the workdir and "
              "declared artifacts (as sandfleet run --verify).")
@click.option("--strict-bases", is_flag=True,
              help="Refuse a substituted base (e.g. python:3.12, which no Debian ships) instead of warning.")
@click.option("--accept-older-versions", "accept_older", is_flag=True,
              help="Build a language base asking for a version newer than Debian ships (golang:1.26) with the "
              "newest Debian has (a substitution, warned) instead of refusing it.")
@click.option("--coverage", "coverage_only", is_flag=True,
              help="Only report how the tasks' bases map (exact / approximated / refused, grouped), from their "
              "Dockerfiles; runs nothing.")
@click.option("--reward-key", default=None,
              help="The named reward of reward.json that counts (default: 'reward', else the only one, else the mean).")
@click.option("--reward-weights", default=None, help="Weighted sum of named rewards instead: a=0.7,b=0.3.")
@remote_option("the tasks' repeats over them (docs/cluster.md)")
@click.option("--arch", "arches", default=None, metavar="ARCH[,ARCH]",
              help="Validate for these architectures (a foreign one under qemu-user emulation), e.g. amd64,arm64; "
              "a per-arch table: valid on both, on only one, flaky n/R.")
@click.option("--page-size", "page_size", default=None, metavar="64k",
              help="Also flag ELF files of each task image that a kernel with pages this large can't load.")
@click.option("--under-load", "under_load", is_flag=True,
              help="Then run each oracle again beside busy processes (--load-procs) and flag a task whose reward "
              "flips as load_sensitive, naming the test that failed.")
@click.option("--backends", "backends_opt", default=None, metavar="all|B1,B2",
              help="Validate on each of these backends (all: every one this host has) and report the tasks whose "
              "oracle reward differs between them.")
@click.option("--load-procs", "load_procs", type=int, default=None,
              help="Busy processes for --under-load (default: two per CPU of this host).")
@ray_option(f"Run the repeats on a Ray cluster (docs/cluster.md): {RAY_ADDRESSES}; --concurrency is then per node.")
def validate(
    directory: Path, repeats: int, as_json: bool, report_path: Path, concurrency_opt: str, backend: str,
    agent_user: str | None, network: bool, strict_bases: bool, reward_key: str | None, reward_weights: str | None,
    remote: str | None, arches: str | None = None, page_size: str | None = None, ray_address: str | None = None,
    accept_older: bool = False, coverage_only: bool = False, verify: str = "shared", under_load: bool = False,
    load_procs: int | None = None, backends_opt: str | None = None,
) -> None:
    """Validate the tasks under DIRECTORY: oracle scores 1, no-op scores 0, every time; ends with
    the base coverage (exact / approximated / refused)."""
    from sandfleet.cluster.validate import pool_options, validate_on_pool
    from sandfleet.rollout.validate import Verdict, validate_tasks
    from sandfleet.tasks.coverage import coverage_report, format_coverage
    from sandfleet.tasks.loader import load_tasks
    from sandfleet.tasks.reward import parse_reward_weights, with_reward_selection

    where = Where(remote, ray_address)
    if repeats < 1:
        raise click.BadParameter("must be at least 1", param_hint="--repeats")
    here_only = {"--arch": bool(arches), "--page-size": bool(page_size), "--strict-bases": strict_bases}
    if where.ray is not None:
        refuse("--ray", {"--remote": bool(remote), **here_only})
    elif where.several:
        refuse("--remote", here_only, why="with several URLs ")
    try:
        weights = parse_reward_weights(reward_weights) if reward_weights else None
        if reward_key and weights:
            raise ValueError("choose --reward-key or --reward-weights, not both")
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--reward-weights") from None
    if load_procs is not None and (not under_load or load_procs < 1):
        raise click.BadParameter("needs --under-load and at least 1", param_hint="--load-procs")
    if backends_opt is not None:
        refuse("--backends", {"--backend": backend != "auto", "--remote": remote is not None,
                              "--ray": ray_address is not None, "--arch": bool(arches),
                              "--page-size": bool(page_size), "--under-load": under_load})
    if under_load and (remote is not None or ray_address is not None):
        raise click.UsageError("--under-load loads this host's CPUs: it excludes --remote and --ray")
    if under_load and (arches or page_size):
        raise click.UsageError("--under-load validates on this host's own arch: it excludes --arch and --page-size")
    if accept_older and (ray_address is not None or remote is not None):
        raise click.UsageError("--accept-older-versions builds here: it excludes --ray and --remote")
    tasks, failures = load_tasks(directory)
    tasks = [with_reward_selection(t, reward_key, weights) for t in tasks]
    concurrency = _concurrency(where, concurrency_opt, tasks)
    coverage = coverage_report(tasks, strict=strict_bases, accept_older=accept_older)
    for failure in failures:
        coverage["counts"]["refused"] += 1  # type: ignore[index]
        coverage["tasks"] += 1  # type: ignore[operator]
        coverage["refused"].setdefault("does not load", []).append(failure.path.name)  # type: ignore[attr-defined]
    if coverage_only:
        report_path.write_text(json.dumps(coverage, indent=2) + "\n")
        click.echo(json.dumps(coverage, indent=2) if as_json else "\n".join(format_coverage(coverage)))
        return

    if under_load:
        from sandfleet.rollout.underload import default_load_procs

        load_procs = load_procs or default_load_procs()

    on_result: list[Callable[[RolloutResult], None]] = []  # the progress of the run below, when it runs here

    def here() -> Awaitable[dict[str, Verdict]]:
        return validate_tasks(tasks, repeats=repeats, concurrency=concurrency, backend=backend, agent_user=agent_user,
                              network=network, strict_bases=strict_bases, accept_older=accept_older,
                              verify=verify, under_load=load_procs if under_load else None,
                              on_result=on_result[0] if on_result else None)

    def run() -> dict[str, Verdict]:
        return asyncio.run(dispatch(
            where, here=here,
            on_pool=lambda pool: validate_on_pool(pool, tasks, repeats=repeats, network=network, hosts=where.hosts),
            **pool_options(repeats, concurrency, backend, agent_user, network, verify)))

    if backends_opt is not None:  # per backend, here (the rest refused above)
        from sandfleet.cli.validate_backends import chosen_backends, validate_per_backend

        chosen, lacking = chosen_backends(backends_opt)
        validate_per_backend(
            chosen, lacking,
            lambda b: asyncio.run(validate_tasks(tasks, repeats=repeats, concurrency=concurrency, backend=b,
                                                 agent_user=agent_user, network=network, strict_bases=strict_bases,
                                                 accept_older=accept_older, verify=verify)),
            failures, repeats, report_path, as_json, lambda why: Verdict("invalid", why))
        return
    if arches or page_size:  # per architecture; never spread (refused above)
        from sandfleet.cli.validate_arch import validate_per_arch

        validate_per_arch(arches, page_size, tasks, failures, repeats, report_path, as_json, run,
                          lambda why: Verdict("invalid", why))
        return
    t0 = time.perf_counter()
    # oracle and no-op rollouts of every task (a bar on a terminal, lines in a log; the oracle
    # retried as root and the runs under load come after, outside the count)
    with (progress(len(tasks) * repeats * 2, "validate rollouts") if not where.spread
          else contextlib.nullcontext(lambda r: None)) as moved:  # a pool's hosts report no results one by one
        on_result.append(moved)
        verdicts = run()
    wall = time.perf_counter() - t0
    for failure in failures:
        verdicts[failure.path.name] = Verdict("invalid", f"does not load: {failure.error}")
    report: dict[str, Any] = {name: asdict(v) for name, v in sorted(verdicts.items())}
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_table(verdicts, format_coverage(coverage))
        if under_load:
            _print_load(verdicts, load_procs or 0)
        bad = sum(v.status != "valid" for v in verdicts.values())
        click.echo(f"\n{len(verdicts) - bad}/{len(verdicts)} valid in {wall:.1f} s (repeats {repeats}); "
                   f"report: {report_path}")
    if any(v.status != "valid" for v in verdicts.values()):
        raise SystemExit(1)


def _print_load(verdicts: Mapping[str, Verdict], procs: int) -> None:
    """One line for the run beside the load: how many oracles held, which tasks flipped."""
    ran = {n: v for n, v in verdicts.items() if v.under_load_rewards is not None}
    flipped = sorted(n for n, v in ran.items() if v.load_sensitive)
    click.echo(f"\nunder load ({procs} busy processes): {len(ran) - len(flipped)}/{len(ran)} oracles held")
    for name in flipped:
        click.echo(f"  load_sensitive  {name}: {', '.join(verdicts[name].load_flipped)}")


def _print_table(verdicts: Mapping[str, Verdict], coverage: list[str]) -> None:
    """A row per task (its verdict, the oracle's and the no-op's hits, the first line of why);
    on stderr, every reason in full, the warnings and the base coverage."""
    rows = [("task", "status", "oracle=1", "noop=0", "reason")]
    for name, v in sorted(verdicts.items()):
        first = v.reason.splitlines()[0] if v.reason else ""
        rows.append((name, v.status, _cell(v.oracle_rewards, 1.0), _cell(v.noop_rewards, 0.0), first[:100]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[4])
    for name, v in sorted(verdicts.items()):
        if v.status != "valid":
            click.echo(f"\n{name}: {v.status}\n{v.reason}", err=True)
    for name, v in sorted(verdicts.items()):
        for warning in v.warnings:
            click.echo(f"warning: {name}: {warning}", err=True)
    click.echo("\n".join(coverage), err=True)


def _concurrency(where: Where, value: str, tasks: list[Task]) -> int | None:
    """``--concurrency``: ``auto`` admits what this host's CPUs hold at the tasks' cpus, a
    larger number is allowed with a warning (said on stderr); None elsewhere (``--remote``,
    ``--ray``: each host's own default)."""
    from sandfleet.errors import ConfigError
    from sandfleet.rollout.admission import choose_concurrency

    auto = value.strip().lower() == "auto"
    if where.remote is not None or where.ray is not None:
        if auto:
            return None
        try:
            return int(value)
        except ValueError:
            raise click.BadParameter(f"a number or 'auto', not {value!r}", param_hint="--concurrency") from None
    try:
        n, notes = choose_concurrency(None if auto else value, [t.cpus for t in tasks])
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--concurrency") from None
    if n < 1:
        raise click.BadParameter(f"must be at least 1, not {n}", param_hint="--concurrency")
    for note in notes:
        click.echo(note, err=True)
    return n
