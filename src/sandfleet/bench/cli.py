"""``sandfleet bench ...``: micro (sandbox layer) and the capacity benchmark."""

from __future__ import annotations

import asyncio
import json

import click


@click.group()
def bench() -> None:
    """Benchmarks: micro (sandbox layer), run (capacity), compare (two hosts)."""


BACKEND_CHOICE = click.Choice(["auto", "bwrap", "process", "microvm"])


@bench.command("micro")
@click.option("--backend", type=BACKEND_CHOICE, default="auto", show_default=True)
@click.option("-n", "n", default=50, show_default=True, help="Repetitions of each timed operation.")
@click.option("--idle", default=256, show_default=True, help="Idle sandboxes to hold at once for density.")
@click.option("--json", "as_json", is_flag=True)
def micro(backend: str, n: int, idle: int, as_json: bool) -> None:
    """Sandbox-layer figures: create/exec/close latency, warm acquire, exec RTT, density."""
    if backend == "microvm":
        from sandfleet.sandbox.microvm import bench as mbench

        result = mbench.run()
    else:
        from sandfleet.bench.micro import run_micro

        result = asyncio.run(run_micro(backend, n=n, idle=idle,
                                       progress=None if as_json else lambda m: click.echo(f"... {m}", err=True)))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for k, v in result.items():
        click.echo(f"{k:32} {v}")


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
@click.option("--min-samples", default=10, show_default=True,
              help="Each sweep level runs on until every command ran this often.")
@click.option("--ns", default="", help="Sweep load levels, e.g. 1,2,3,4 (default 1,2,4.. to 2x threads).")
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
def run_cmd(backend: str, modes: str, duration: float, repeats: int, min_samples: int, ns: str, target: float,
            commands: str, throttle: float | None, eval_task: str, density_max: int, density_budget_mib: float | None,
            out: str) -> None:
    """Capacity benchmark: latency alone and under load, capacity, evals/min, soak, density."""
    import signal
    import time
    from pathlib import Path

    from sandfleet.bench.report import summary_lines
    from sandfleet.bench.run import BenchConfig, run_bench

    cfg = BenchConfig(backend=backend, modes=_names(modes), duration_s=duration, repeats=repeats,
                      min_samples=min_samples, ns=_ints(ns),
                      target=target, commands=_names(commands), throttle=throttle, eval_task=eval_task,
                      density_max=density_max, density_budget_mib=density_budget_mib)
    path = Path(out)
    results: dict = {}
    t0 = time.monotonic()

    def save(r: dict) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(r, indent=2, default=str) + "\n")
        tmp.replace(path)

    def say(msg: str) -> None:
        click.echo(f"[{time.monotonic() - t0:7.1f}s] {msg}", err=True)

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


@bench.command("compare")
@click.argument("a", type=click.Path(exists=True, dir_okay=False))
@click.argument("b", type=click.Path(exists=True, dir_okay=False))
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None, help="Write an HTML report.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare_cmd(a: str, b: str, html: str | None, as_json: bool) -> None:
    """Compare two results files: single ratio, slowdown at full load, capacity, evals/min (B/A)."""
    from pathlib import Path

    from sandfleet.bench.compare import compare, table_lines
    from sandfleet.bench.report import html_report

    ra, rb = json.loads(Path(a).read_text()), json.loads(Path(b).read_text())
    cmp = compare(ra, rb)
    if as_json:
        click.echo(json.dumps(cmp, indent=2))
    else:
        for line in table_lines(cmp):
            click.echo(line)
    if html:
        Path(html).write_text(html_report(ra, rb, cmp, names=(Path(a).stem, Path(b).stem)))
        click.echo(f"report: {html}", err=True)
