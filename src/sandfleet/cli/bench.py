"""``sandfleet bench ...``: micro (sandbox layer), the capacity benchmark, compare, soak, peers; the
service's benchmark is :mod:`sandfleet.cli.bench_service`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from sandfleet.cli.bench_service import service
from sandfleet.sandbox.registry import choices as backend_choices


@click.group()
def bench() -> None:
    """Benchmarks: micro (sandbox layer), rollout (platform time per rollout), interpreter (the code
    interpreter), run (capacity), report (one run), compare (two hosts)."""


BACKEND_CHOICE = click.Choice(backend_choices())


@bench.command("micro")
@click.option("--backend", type=BACKEND_CHOICE, default="auto", show_default=True)
@click.option("-n", "n", default=50, show_default=True, help="Repetitions of each timed operation.")
@click.option("--idle", default=256, show_default=True, help="Idle sandboxes to hold at once for density.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--remote", metavar="URL", default=None,
              help="Measure the sandboxes of the sandfleet service at URL (token in $SANDFLEET_TOKEN); "
              "the density figures then read this host's memory, not the service's.")
@click.option("--branch", "branch", is_flag=True,
              help="Branch figures instead (docs/branching.md): branch_p50_ms for n=1,8,32 over a 1 MiB and a "
              "512 MiB written layer beside create->exec->close, the source's exec round trip during a branch; "
              "with --backend microvm a running VM branched to 4 against one restore. -n: samples (default 5).")
def micro(backend: str, n: int, idle: int, as_json: bool, remote: str | None, branch: bool) -> None:
    """Sandbox-layer figures: create/exec/close latency, warm acquire, exec RTT, density."""
    if branch:
        from sandfleet.bench.branch import run_branch
        from sandfleet.client.remote import on_remote

        samples = n if n != 50 else 5  # (-n's default is the micro figures')
        result = asyncio.run(on_remote(remote, lambda: run_branch(
            backend, n=samples, progress=None if as_json else lambda m: click.echo(f"... {m}", err=True))))
    elif backend == "microvm":
        from sandfleet.bench import microvm as mbench
        from sandfleet.provenance import provenance

        result = mbench.run()
        result.setdefault("provenance", provenance({"bench": "micro", "backend": backend}))
    else:
        from sandfleet.bench.micro import run_micro
        from sandfleet.client.remote import on_remote

        result = asyncio.run(on_remote(remote, lambda: run_micro(
            backend, n=n, idle=idle, progress=None if as_json else lambda m: click.echo(f"... {m}", err=True))))
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            if k == "provenance":
                v = (f"sandfleet {v.get('sandfleet')} commit {v.get('commit')} on {v['host'].get('hostname')} "
                     f"at {v.get('at')}")
            click.echo(f"{k:32} {v}")
    if result.get("idle_stopped") and result.get("idle_created", 0) < idle:  # a host limit: one line, exit 1
        raise click.ClickException(f"held {result.get('idle_created', 0)} of {idle} idle sandboxes: "
                                   f"{result['idle_stopped']}")


@bench.command("rollout")
@click.option("--tasks", "tasks_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A task folder, or a folder of task folders (default: the bundled examples/tasks).")
@click.option("--task", "only", multiple=True, help="Run only these tasks (repeatable).")
@click.option("--backend", type=BACKEND_CHOICE, default="bwrap", show_default=True)
@click.option("-n", "n", default=1, show_default=True, type=click.IntRange(min=1), help="Rollouts per task.")
@click.option("--concurrency", default=None, type=click.IntRange(min=1),
              help="Rollouts in flight at once (default: this host's cores, at least -n).")
@click.option("--micro-n", default=30, show_default=True, type=click.IntRange(min=1),
              help="Create/exec/close cycles measured after the suite.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Keep the run's files here (default: a temporary folder, removed).")
@click.option("--json", "as_json", is_flag=True)
def rollout_cmd(tasks_dir: Path | None, only: tuple[str, ...], backend: str, n: int, concurrency: int | None,
                micro_n: int, out_dir: Path | None, as_json: bool) -> None:
    """Platform time per rollout (sandbox_start + other_sandbox spans of an oracle run of a
    suite), per span, against create/exec/close of a bare sandbox (docs/bench.md)."""
    from sandfleet.bench.rollout import run_rollout_bench
    from sandfleet.errors import ConfigError

    tasks_dir = tasks_dir or _bundled_tasks()
    try:
        result = asyncio.run(run_rollout_bench(
            tasks_dir, backend=backend, n=n, concurrency=concurrency, only=only, micro_n=micro_n, out_dir=out_dir,
            progress=None if as_json else lambda m: click.echo(f"... {m}", err=True)))
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for k, v in result.items():
        if k == "provenance":
            continue
        if k == "spans_ms_per_rollout":
            click.echo("mean ms per rollout, by span:")
            for what, ms in v.items():
                click.echo(f"  {what:40} {ms:8.2f}")
            continue
        click.echo(f"{k:32} {v}")


def _bundled_tasks() -> Path:
    """examples/tasks of this checkout, or of the current folder."""
    for base in (Path(__file__).resolve().parents[3], Path.cwd()):
        if (base / "examples" / "tasks").is_dir():
            return base / "examples" / "tasks"
    raise click.UsageError("no bundled examples/tasks here: pass --tasks DIR")


def _ints(text: str, option: str = "--ns") -> tuple[int, ...]:
    """A comma list of positive integers; anything else is a usage error naming the option."""
    out = []
    for x in (x.strip() for x in text.split(",")):
        if not x:
            continue
        if not x.isdigit() or int(x) < 1:
            raise click.BadParameter(f"{x!r} is not a positive integer (expected e.g. 1,2,4)", param_hint=option)
        out.append(int(x))
    return tuple(out)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


@bench.command("run")
@click.option("--backend", type=BACKEND_CHOICE, default="auto", show_default=True)
@click.option("--modes", default="single,sweep,capacity,baseline,evals,density", show_default=True,
              help="Comma list of: single, sweep, capacity, baseline, evals, soak, density.")
@click.option("--duration", "duration", default=60.0, show_default=True,
              help="Seconds of each timed phase (each sweep level, baseline side, evals, soak).")
@click.option("--repeats", default=5, show_default=True, help="Timed rounds of the mix in single mode.")
@click.option("--min-samples", default=40, show_default=True, type=click.IntRange(min=0),
              help="Each sweep level (and the interleaved single baseline) runs on until every command has "
                   "run this many times, or the level's time cap passes.")
@click.option("--level-cap", "level_cap", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Longest a sweep level runs to reach --min-samples, in seconds [default: 10x --duration].")
@click.option("--ns", default="", help="Coarse sweep load levels, e.g. 1,2,4 (default 1,2,4.. to 2x threads).")
@click.option("--refine", default=3, show_default=True, type=click.IntRange(min=0),
              help="Most finer levels added between the last coarse level within the target and the first past it.")
@click.option("--target", default=1.5, show_default=True, help="p95 slowdown target for capacity.")
@click.option("--commands", default="", help="Comma list of bench commands (default all).")
@click.option("--throttle", type=float, default=None,
              help="Emulate a slower host: run in a cgroup giving this fraction of each thread (e.g. 0.6).")
@click.option("--eval-task", default="implement-roman-numerals", show_default=True,
              help="Task (name under examples/tasks, or a task folder) whose verifier is an evaluation.")
@click.option("--density-max", default=1024, show_default=True, help="Most idle sandboxes to create.")
@click.option("--density-budget-mib", type=float, default=None,
              help="Memory the idle sandboxes may take (default a quarter of MemAvailable).")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="Results JSON.")
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None,
              help="Also write this run's HTML report (charts of p95 slowdown against N, capacity).")
@click.option("--ray", "ray_address", metavar="ADDRESS", default=None,
              help="Run it on every node of a Ray cluster (host:port, auto, or local:N): one result per node and a "
              "comparison with the first (docs/cluster.md).")
def run_cmd(backend: str, modes: str, duration: float, repeats: int, min_samples: int, level_cap: float | None,
            ns: str, refine: int, target: float, commands: str, throttle: float | None, eval_task: str,
            density_max: int, density_budget_mib: float | None, out: str, html: str | None,
            ray_address: str | None = None) -> None:
    """Capacity benchmark: latency alone and under load, capacity, evals/min, soak, density."""
    import signal
    import time
    from pathlib import Path

    from sandfleet.bench.report import html_report, summary_lines
    from sandfleet.bench.run import BenchConfig, run_bench
    from sandfleet.errors import ConfigError

    cfg = BenchConfig(backend=backend, modes=_names(modes), duration_s=duration, repeats=repeats,
                      min_samples=min_samples, level_cap_s=level_cap, ns=_ints(ns), refine=refine,
                      target=target, commands=_names(commands), throttle=throttle, eval_task=eval_task,
                      density_max=density_max, density_budget_mib=density_budget_mib)
    try:
        cfg.check()
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    path = Path(out)
    results: dict = {}
    t0 = time.monotonic()

    def save(r: dict) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(r, indent=2, default=str) + "\n")
        tmp.replace(path)

    def say(msg: str) -> None:
        click.echo(f"[{time.monotonic() - t0:7.1f}s] {msg}", err=True)

    if ray_address is not None:  # one result per node (sandfleet.bench.nodes)
        if throttle is not None or html:
            raise click.UsageError("--ray excludes --throttle and --html (report each node's results instead)")
        from sandfleet.bench.compare import table_lines
        from sandfleet.bench.nodes import bench_on_ray

        results = asyncio.run(bench_on_ray(ray_address, cfg, say=say))
        save(results)
        for node in results["nodes"].values():
            click.echo(f"== node {node['label']}")
            for line in summary_lines(node["results"]):
                click.echo(line)
        for label, cmp in results["comparison"].items():
            click.echo(f"== {label} against the first node")
            for line in [cmp["refused"]] if "refused" in cmp else table_lines(cmp):
                click.echo(line)
        click.echo(f"results: {path}")
        return

    async def main() -> None:
        # SIGTERM stops the run as Ctrl-C does: cancelled, sandboxes closed, results kept.
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        await run_bench(cfg, results, progress=say, save=save)

    try:
        asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        results["interrupted"] = True
        click.echo("interrupted: keeping partial results", err=True)
    finally:
        if results:
            save(results)
    for line in summary_lines(results):
        click.echo(line)
    click.echo(f"results: {path}")
    if html and results:
        Path(html).write_text(html_report(results, names=(path.stem, "")))
        click.echo(f"report: {html}")


def _results(path: str) -> dict:
    """A results file, or a one-line error naming it and what is wrong."""
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise click.ClickException(f"{path}: not a bench results file ({e})") from None
    if not isinstance(data, dict) or "schema" not in data:
        raise click.ClickException(f"{path}: not a bench results file (no 'schema'; made by bench run?)")
    return data


@bench.command("report")
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--html", "html", type=click.Path(dir_okay=False), required=True, help="The HTML report to write.")
def report_cmd(results: str, html: str) -> None:
    """The HTML report of one results file (p95 slowdown against N per command, capacity)."""
    from pathlib import Path

    from sandfleet.bench.report import html_report, summary_lines

    r = _results(results)
    for line in summary_lines(r):
        click.echo(line)
    Path(html).write_text(html_report(r, names=(Path(results).stem, "")))
    click.echo(f"report: {html}", err=True)


@bench.command("compare")
@click.argument("a", type=click.Path(exists=True, dir_okay=False))
@click.argument("b", type=click.Path(exists=True, dir_okay=False))
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None, help="Write an HTML report.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare_cmd(a: str, b: str, html: str | None, as_json: bool) -> None:
    """Compare two results files: single ratio, slowdown at full load, capacity, evals/min (B/A)."""
    from pathlib import Path

    from sandfleet.bench.compare import IncomparableError, compare, table_lines
    from sandfleet.bench.report import html_report

    ra, rb = _results(a), _results(b)
    names = (Path(a).stem, Path(b).stem)
    try:
        cmp = compare(ra, rb, names=(f"A ({a})", f"B ({b})"))
    except IncomparableError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(cmp, indent=2))
    else:
        for line in table_lines(cmp):
            click.echo(line)
    if html:
        Path(html).write_text(html_report(ra, rb, cmp, names=names))
        click.echo(f"report: {html}", err=True)


@bench.command("interpreter")
@click.option("--backend", type=BACKEND_CHOICE, default="bwrap", show_default=True,
              help="Backend of the sandboxes, in process and of the service started for the run.")
@click.option("-n", "n", default=200, show_default=True, type=click.IntRange(min=1),
              help="Round trips of each: a cell x += 1 and an exec of true, in turn.")
@click.option("--concurrent", default=64, show_default=True, type=click.IntRange(min=1),
              help="Sandboxes at once, each with its own kernel.")
@click.option("--cells", default=20, show_default=True, type=click.IntRange(min=1),
              help="Cells per sandbox (and fresh python3 -c processes per sandbox on the other side).")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(min=1),
              help="Rounds of kernels and of fresh processes, alternating.")
@click.option("--fusion-rounds", default=6, show_default=True, type=click.IntRange(min=1),
              help="Rounds of SandboxFusion's run_jupyter (--cells cells) against as many run_code requests.")
@click.option("--no-service", "no_service", is_flag=True,
              help="Only in process: start no service (no /v1, e2b SDK and SandboxFusion round trips).")
@click.option("--json", "as_json", is_flag=True)
def interpreter_cmd(backend: str, n: int, concurrent: int, cells: int, rounds: int, fusion_rounds: int,
                    no_service: bool, as_json: bool) -> None:
    """The code interpreter: a cell's round trip against an exec of true (in process, /v1, the e2b SDKs),
    SandboxFusion's run_jupyter against run_code per cell, and cells per second of many kernels against
    fresh python3 -c processes, side by side in one run."""
    from sandfleet.bench.interpreter import run_interpreter_bench
    from sandfleet.errors import SandfleetError
    from sandfleet.provenance import provenance

    say = (lambda _m: None) if as_json else (lambda m: click.echo(f"... {m}", err=True))
    try:
        result = run_interpreter_bench(backend=backend, n=n, concurrent=concurrent, cells=cells, rounds=rounds,
                                       service=not no_service, fusion_rounds=fusion_rounds, say=say)
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    result["provenance"] = provenance({"bench": "interpreter", "backend": backend, "n": n,
                                       "concurrent": concurrent, "cells": cells, "rounds": rounds,
                                       "fusion_rounds": fusion_rounds, "service": not no_service})
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for k, v in result.items():
        if k == "provenance":
            v = (f"sandfleet {v.get('sandfleet')} commit {v.get('commit')} on {v['host'].get('hostname')} "
                 f"at {v.get('at')}")
        click.echo(f"{k:32} {v}")


@bench.command("soak")
@click.option("--tasks", "task_refs", default="implement-roman-numerals", show_default=True,
              help="Comma list of bundled task names or task folders.")
@click.option("--backend", type=BACKEND_CHOICE, default="bwrap", show_default=True)
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(min=1))
@click.option("--duration", "duration_s", default=120.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds of rollouts (the study's soak: 5400).")
@click.option("--window", "window_s", default=30.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds per evals/min window (first vs last: the drift).")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None, help="Also write the JSON here.")
def soak_cmd(task_refs: str, backend: str, concurrency: int, duration_s: float, window_s: float,
             out: str | None) -> None:
    """Real rollouts at full load for a long while: evals/min over time and its drift, lost
    results, infra faults inside sandfleet, host memory growth per hour, leaks at the end.
    Exits 1 when a result was lost, an infra fault was ours, or something leaked."""
    from pathlib import Path

    from sandfleet.bench.soak import run_soak
    from sandfleet.errors import SandfleetError

    try:
        r = asyncio.run(run_soak([t.strip() for t in task_refs.split(",") if t.strip()], backend=backend,
                                 concurrency=concurrency, duration_s=duration_s, window_s=window_s,
                                 say=lambda m: click.echo(m, err=True)))
    except (SandfleetError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    text = json.dumps(r, indent=1)
    click.echo(text)
    if out:
        Path(out).write_text(text + "\n")
    if r["lost"] or r["infra_faults_inside"] or r["leaks"]:
        raise SystemExit(1)


@bench.command("peers")
@click.option("--image", default=None, help="The root filesystem every system runs on: a base image (sandfleet "
              "image ls) or 'host' [default: debian-bookworm-amd64 where built, else host].")
@click.option("--rounds", default=15, show_default=True, type=click.IntRange(min=1),
              help="create->exec->close samples per system (alternating).")
@click.option("--rtt", default=30, show_default=True, type=click.IntRange(min=1),
              help="exec round trips per live system (alternating).")
@click.option("--only", default="", help="Comma list of systems (default all: raw-bwrap, sandfleet-bwrap, "
              "sandfleet-gvisor, sandfleet-microvm, runsc-do, runsc-run, crun, podman).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Also write the results JSON here.")
@click.option("--html", type=click.Path(dir_okay=False), default=None, help="Write an HTML page with charts.")
def peers_cmd(image: str | None, rounds: int, rtt: int, only: str, as_json: bool, out: str | None,
              html: str | None) -> None:
    """sandfleet's backends and the runtimes users would pick instead, in one run, alternating:
    create->exec->close, exec round trip, 16 CPU-bound commands, idle memory."""
    from pathlib import Path

    from sandfleet.bench.peers import SYSTEMS, run_peers, table_lines

    names = _names(only)
    bad = [n for n in names if n not in SYSTEMS]
    if bad:
        raise click.BadParameter(f"unknown system(s) {', '.join(bad)}; known: {', '.join(SYSTEMS)}",
                                 param_hint="--only")
    import signal

    def stop(signum: int, frame: object) -> None:  # SIGTERM: unwind, so live containers are removed
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    result = asyncio.run(run_peers(image=image, rounds=rounds, rtt=rtt, only=names,
                                   progress=None if as_json else lambda m: click.echo(f"... {m}", err=True)))
    if out:
        Path(out).write_text(json.dumps(result, indent=2))
    if html:
        from sandfleet.bench.peers_report import html_page

        Path(html).write_text(html_page(result))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for line in table_lines(result):
        click.echo(line)


bench.add_command(service)  # sandfleet.cli.bench_service
