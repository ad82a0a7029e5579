"""``sandfleet bench ...``: micro (sandbox layer) and the capacity benchmark."""

from __future__ import annotations

import asyncio
import json

import click


@click.group()
def bench() -> None:
    """Benchmarks: micro (sandbox layer), run (capacity), compare (two hosts)."""


@bench.command("micro")
@click.option("--backend", default="auto", show_default=True)
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
