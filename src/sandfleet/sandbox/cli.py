"""``sandfleet sandbox ...``: run, create, exec, ls, rm."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from sandfleet.errors import SandfleetError
from sandfleet.sandbox import create_sandbox, holder, make_spec, state
from sandfleet.sandbox.spec import SandboxSpec


def spec_options(f: Any) -> Any:
    for opt in reversed([
        click.option("--backend", type=click.Choice(["auto", "bwrap", "process", "microvm"]), default="auto",
                     show_default=True),
        click.option("--image", default="host", show_default=True, help="Image name or hash."),
        click.option("--cpus", type=float, default=1.0, show_default=True, help="CPU quota."),
        click.option("--memory", "memory_mib", type=int, default=1024, show_default=True, help="Memory limit, MiB."),
        click.option("--pids", type=int, default=1024, show_default=True, help="Process limit."),
        click.option("--disk", "disk_mib", type=int, default=1024, show_default=True, help="Writable layer size, MiB."),
        click.option("--ttl", "ttl_s", type=float, default=3600.0, show_default=True, help="Lifetime, seconds."),
        click.option("--network/--no-network", default=False, help="Network access (off by default)."),
        click.option("--workdir", default="/work", show_default=True),
        click.option("--no-limits", is_flag=True,
                     help="Run without cpu, memory and pids limits where cgroups are unusable (else refused)."),
    ]):
        f = opt(f)
    return f


def _spec(kw: dict[str, Any]) -> SandboxSpec:
    if kw.pop("no_limits", False):
        os.environ["SANDFLEET_NO_LIMITS"] = "1"  # also for a detached sandbox's holder process
    return make_spec(**kw)


@click.group()
def sandbox() -> None:
    """Create, use and remove sandboxes."""


@sandbox.command("run", context_settings={"ignore_unknown_options": True})
@spec_options
@click.option("--timeout", type=float, default=None, help="Kill CMD (and its whole tree) after S seconds; exit 124.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(cmd: tuple[str, ...], timeout: float | None, **kw: Any) -> None:
    """Create a sandbox, run CMD in it, close it; exit with CMD's exit code."""

    def show(stream: str, data: bytes) -> None:
        (sys.stdout if stream == "stdout" else sys.stderr).buffer.write(data)

    async def go() -> int:
        sb = await create_sandbox(_spec(kw))
        try:
            res = await sb.exec(list(cmd), timeout=timeout, on_output=show)
        finally:
            await sb.close()
        sys.stdout.flush()
        if res.truncated:
            click.echo("sandfleet: output beyond the cap was dropped", err=True)
        if res.timed_out:
            click.echo(f"sandfleet: timed out after {timeout}s; killed", err=True)
            return 124
        return res.exit_code

    try:
        code = asyncio.run(go())
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    sys.exit(code)


@sandbox.command("create")
@spec_options
def create(**kw: Any) -> None:
    """Create a detached sandbox (kept by a holder process until rm or its TTL); print its id."""
    spec = _spec(kw)
    r, w = os.pipe()
    # Until the sandbox exists the holder's stderr is this scratch file (read back if the
    # creation fails); then the holder logs to <state>/<id>/holder.log, never to this terminal.
    with tempfile.TemporaryFile() as early:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandfleet.sandbox.holder", spec.model_dump_json(), str(w)],
            pass_fds=(w,), start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=early,
        )
        os.close(w)
        with os.fdopen(r) as f:
            line = f.readline()
        if not line:
            proc.wait()
            early.seek(0)
            err = early.read().decode(errors="replace").strip()
            why = err.splitlines()[-1] if err else f"the holder exited with {proc.returncode}"
            raise click.ClickException(f"sandbox creation failed: {why}")
    click.echo(json.loads(line)["id"])


def _find(sid: str) -> dict[str, Any]:
    """The marker of the sandbox whose id is exactly ``sid`` (never a suffix or prefix: a
    short string must not pick someone else's sandbox)."""
    for meta in state.list_sandboxes():
        if meta["id"] == sid:
            return meta
    raise click.ClickException(f"no sandbox {sid!r}: give a whole id, as `sandfleet sandbox ls` shows it")


def _call(meta: dict[str, Any], req: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """One request to the sandbox's holder (framed JSON, :mod:`sandfleet.sandbox.holder`)."""
    sock_path = Path(meta["dir"]) / "ctl.sock"
    if not sock_path.exists():
        raise click.ClickException(f"sandbox {meta['id']} is not a detached sandbox (made by sandbox create)")
    try:
        return holder.call(str(sock_path), req, None if timeout is None else timeout + 15)
    except holder.FrameError as e:
        raise click.ClickException(f"sandbox {meta['id']}: {e}") from None
    except TimeoutError:
        raise click.ClickException(f"sandbox {meta['id']}: its holder did not answer in time") from None
    except OSError as e:
        raise click.ClickException(f"sandbox {meta['id']}: can't reach its holder ({e})") from None


@sandbox.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("sid")
@click.option("--timeout", type=float, default=None)
@click.option("--cwd", default=None)
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(sid: str, cmd: tuple[str, ...], timeout: float | None, cwd: str | None) -> None:
    """Run CMD in a detached sandbox."""
    resp = _call(_find(sid), {"argv": list(cmd), "timeout": timeout, "cwd": cwd}, timeout)
    if not resp.get("ok"):
        raise click.ClickException(resp.get("error", "failed"))
    sys.stdout.write(resp["stdout"])
    sys.stderr.write(resp["stderr"])
    if resp.get("truncated"):
        click.echo("sandfleet: output beyond the cap was dropped", err=True)
    sys.exit(124 if resp["timed_out"] else resp["exit_code"])


@sandbox.command("ls")
@click.option("--json", "as_json", is_flag=True)
def ls(as_json: bool) -> None:
    """List sandboxes on this host (all owners)."""
    rows = state.list_sandboxes()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    click.echo(f"{'ID':32} {'BACKEND':8} {'IMAGE':14} {'OWNER':>8} STATE")
    for m in rows:
        st = "expired" if m["expired"] else ("alive" if m["alive"] else "orphaned")
        image = str(m.get("image", "?"))[:14]
        click.echo(f"{m['id']:32} {m.get('backend', '?'):8} {image:14} {m.get('owner_pid', '?'):>8} {st}")


@sandbox.command("rm")
@click.argument("sids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Remove every sandbox marker, live or not.")
@click.option("--orphans", is_flag=True, help="Reap only sandboxes whose owner is gone or whose TTL passed.")
def rm(sids: tuple[str, ...], all_: bool, orphans: bool) -> None:
    """Remove sandboxes (their processes, cgroups and files)."""
    if orphans or all_:
        for sid in state.reap_leftovers(include_live=all_):
            click.echo(f"reaped {sid}")
        return
    if not sids:
        raise click.UsageError("name sandboxes to remove, or pass --orphans / --all")
    for sid in sids:
        meta = _find(sid)
        try:
            _call(meta, {"op": "close"}, 5)
            for _ in range(100):  # the holder closes the sandbox and removes its marker
                if not Path(meta["dir"]).exists():
                    break
                time.sleep(0.05)
        except (click.ClickException, OSError):
            pass
        if Path(meta["dir"]).exists():
            state.reap_one(meta)
        click.echo(f"removed {meta['id']}")
