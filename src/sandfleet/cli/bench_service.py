"""``sandfleet bench service``: the sandbox service against in-process, in one run
(:mod:`sandfleet.bench.service` measures)."""

from __future__ import annotations

import asyncio
import json

import click


@click.command("service")
@click.option("--backend", type=click.Choice(["auto", "bwrap", "process"]), default="auto", show_default=True,
              help="Backend of the service started for the run, and of the in-process side.")
@click.option("-n", "n", default=30, show_default=True, help="create+exec+close rounds per side.")
@click.option("--rtt-n", default=300, show_default=True, help="exec round trips per side.")
@click.option("--concurrency", default=64, show_default=True, help="Sandboxes at once for execs/s.")
@click.option("--seconds", default=3.0, show_default=True, help="Duration of the execs/s phase per side.")
@click.option("--remote", metavar="URL", default=None,
              help="Measure this running service (token in $SANDFLEET_TOKEN) instead of starting one.")
@click.option("--json", "as_json", is_flag=True)
def service(backend: str, n: int, rtt_n: int, concurrency: int, seconds: float, remote: str | None,
            as_json: bool) -> None:
    """The sandbox service against in-process: create/exec/close, exec RTT, execs/s."""
    import tempfile
    from pathlib import Path

    from sandfleet.bench.procfs import raise_nofile
    from sandfleet.bench.service import measure
    from sandfleet.errors import SandfleetError
    from sandfleet.provenance import provenance

    raise_nofile()
    say = (lambda _m: None) if as_json else (lambda m: click.echo(f"... {m}", err=True))
    try:
        if remote is not None:
            from sandfleet.client.remote import token_from_env

            result = asyncio.run(measure(remote, token_from_env(), backend=backend, n=n, rtt_n=rtt_n,
                                         conc=concurrency, seconds=seconds, say=say))
        else:
            from sandfleet.server.testing import running_service

            with tempfile.TemporaryDirectory(prefix="sandfleet-bench-service-") as tmp, \
                    running_service(Path(tmp), args=["--backend", backend,
                                                     "--max-sandboxes", str(max(256, 2 * concurrency))]) as svc:
                say(f"service at {svc.url}")
                result = asyncio.run(measure(svc.url, svc.token, backend=backend, n=n, rtt_n=rtt_n,
                                             conc=concurrency, seconds=seconds, say=say))
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    result["provenance"] = provenance({"bench": "service", "backend": backend, "n": n, "rtt_n": rtt_n,
                                       "concurrency": concurrency, "seconds": seconds, "remote": remote})
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for k, v in result.items():
        if k != "provenance":
            click.echo(f"{k:34} {v}")
