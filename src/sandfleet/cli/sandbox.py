"""``sandfleet sandbox ...``: run, create, exec, ls, rm."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from sandfleet.errors import SandfleetError
from sandfleet.sandbox import create_sandbox, holder, make_spec, state
from sandfleet.sandbox.registry import choices as backend_choices
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.settings import current as current_settings
from sandfleet.settings import install


def spec_options(f: Any) -> Any:
    for opt in reversed([
        click.option("--backend", type=click.Choice(backend_choices()), default="auto",
                     show_default=True),
        click.option("--image", default="host", show_default=True, help="Image name or hash."),
        click.option("--cpus", type=float, default=1.0, show_default=True, help="CPU quota."),
        click.option("--memory", "memory_mib", type=int, default=1024, show_default=True, help="Memory limit, MiB."),
        click.option("--pids", type=int, default=1024, show_default=True, help="Process limit."),
        click.option("--disk", "disk_mib", type=int, default=1024, show_default=True, help="Writable layer size, MiB."),
        click.option("--ttl", "ttl_s", type=float, default=3600.0, show_default=True, help="Lifetime, seconds."),
        click.option("--network/--no-network", default=False, help="Network access (off by default)."),
        click.option("--workdir", default="/work", show_default=True),
        click.option("--seccomp-allow", "seccomp_allow", multiple=True, metavar="RULE[,RULE...]",
                     help="Opt out of these rules of the default seccomp filter (docs/security.md, "
                     "'Syscall filter'); 'unconfined' turns it off."),
        click.option("--no-limits", is_flag=True,
                     help="Run without cpu, memory and pids limits where cgroups are unusable (else refused)."),
    ]):
        f = opt(f)
    return f


def _spec(kw: dict[str, Any]) -> SandboxSpec:
    if kw.pop("no_limits", False):  # also for a detached sandbox's holder process (settings.child_env)
        install(current_settings().replace(no_limits=True))
    kw["seccomp_allow"] = tuple(r for v in kw.get("seccomp_allow", ()) for r in v.split(",") if r.strip())
    return make_spec(**kw)


@click.group()
def sandbox() -> None:
    """Create, use and remove sandboxes."""


def remote_option(f: Any) -> Any:
    return click.option("--remote", metavar="URL", default=None,
                        help="On the sandfleet service at URL (token in $SANDFLEET_TOKEN).")(f)


@sandbox.command("run", context_settings={"ignore_unknown_options": True})
@spec_options
@click.option("--timeout", type=float, default=None, help="Kill CMD (and its whole tree) after S seconds; exit 124.")
@remote_option
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(cmd: tuple[str, ...], timeout: float | None, remote: str | None, **kw: Any) -> None:
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

    from sandfleet.client.remote import on_remote

    try:
        code = asyncio.run(on_remote(remote, go))
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    sys.exit(code)


@sandbox.command("create")
@spec_options
@remote_option
def create(remote: str | None, **kw: Any) -> None:
    """Create a detached sandbox (kept by a holder process until rm or its TTL; with
    --remote, by the service); print its id."""
    spec = _spec(kw)
    if remote is not None:
        from sandfleet.client.remote import remote as on_service

        async def make() -> str:
            async with on_service(remote) as svc:
                return (await svc.create_sandbox(spec)).id

        try:
            click.echo(asyncio.run(make()))
        except SandfleetError as e:
            raise click.ClickException(str(e)) from None
        return
    try:
        made = holder.spawn(spec)
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    click.echo(made["id"])


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
@remote_option
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(sid: str, cmd: tuple[str, ...], timeout: float | None, cwd: str | None, remote: str | None) -> None:
    """Run CMD in a detached sandbox."""
    if remote is not None:
        _exec_remote(remote, sid, list(cmd), timeout, cwd)
        return
    resp = _call(_find(sid), {"argv": list(cmd), "timeout": timeout, "cwd": cwd}, timeout)
    if not resp.get("ok"):
        raise click.ClickException(resp.get("error", "failed"))
    sys.stdout.write(resp["stdout"])
    sys.stderr.write(resp["stderr"])
    if resp.get("truncated"):
        click.echo("sandfleet: output beyond the cap was dropped", err=True)
    sys.exit(124 if resp["timed_out"] else resp["exit_code"])


def _exec_remote(url: str, sid: str, argv: list[str], timeout: float | None, cwd: str | None) -> None:
    from sandfleet.client.remote import remote as on_service

    def show(stream: str, data: bytes) -> None:
        (sys.stdout if stream == "stdout" else sys.stderr).buffer.write(data)

    async def go() -> int:
        async with on_service(url) as svc:
            res = await (await svc.sandbox(sid)).exec(argv, timeout=timeout, cwd=cwd, on_output=show)
        sys.stdout.flush()
        return 124 if res.timed_out else res.exit_code

    try:
        code = asyncio.run(go())
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    sys.exit(code)


def _remote_rows(url: str, delete: tuple[str, ...] | None) -> list[dict[str, Any]]:
    """This token's sandboxes on the service; ``delete``: remove those (all if empty) first."""
    from sandfleet.client.remote import remote as on_service

    async def go() -> list[dict[str, Any]]:
        async with on_service(url) as svc:
            if delete is not None:
                if delete:
                    for sid in delete:
                        await svc.delete(sid)
                    return [{"id": sid} for sid in delete]
                return [{"id": sid} for sid in await svc.delete_where()]
            return await svc.find()

    try:
        return asyncio.run(go())
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None


@sandbox.command("ls")
@click.option("--json", "as_json", is_flag=True)
@remote_option
def ls(as_json: bool, remote: str | None) -> None:
    """List sandboxes on this host (all owners); with --remote, this token's on the service."""
    if remote is not None:
        found = _remote_rows(remote, None)
        if as_json:
            click.echo(json.dumps(found, indent=2))
            return
        click.echo(f"{'ID':32} {'BACKEND':8} {'IMAGE':14} {'TTL LEFT':>9} LABELS")
        for m in found:
            labels = ",".join(f"{k}={v}" for k, v in m["spec"]["labels"].items())
            click.echo(f"{m['id']:32} {m['backend']:8} {m['spec']['image'][:14]:14} {m['expires_in_s']:>9.0f} {labels}")
        return
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
@remote_option
def rm(sids: tuple[str, ...], all_: bool, orphans: bool, remote: str | None) -> None:
    """Remove sandboxes (their processes, cgroups and files); with --remote, this token's
    sandboxes on the service (--all: every one of them)."""
    if remote is not None:
        if not sids and not all_:
            raise click.UsageError("name sandboxes to remove, or pass --all")
        for row in _remote_rows(remote, () if all_ else sids):
            click.echo(f"removed {row['id']}")
        return
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
