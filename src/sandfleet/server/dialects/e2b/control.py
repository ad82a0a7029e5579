"""The E2B control plane beyond create/connect/list/kill: metrics, snapshots, forks, and
the clear refusals of what sandfleet does not serve.

- ``get_metrics``: a series of 5 s samples of the sandbox's cgroups (``e2b_metrics``).
- ``create_snapshot``: a sandfleet snapshot (its filesystem; memory where the backend saves
  it). Its id is a template: ``Sandbox.create(template=<snapshot id>)`` starts a sandbox
  from it (a fork); ``list_snapshots`` and ``delete_snapshot`` work on the token's own. E2B's
  snapshot keeps running processes; where the backend can't (bwrap, gvisor), a sandbox with
  processes running is refused by name (409), never snapshotted without them silently.
- ``Sandbox.fork``: ``Sandbox.branch(count)`` (docs/branching.md): the children continue
  from the sandbox's state now and the sandbox keeps running; processes running in it that
  the backend can't carry (bwrap, gvisor) are refused by name (409), never lost silently.
- ``pause(mode="filesystem")`` and resume: ``e2b_pause`` (``/resume`` is connect's, in
  :mod:`.dialect`); a pause with memory and
  ``update_network`` answer 501 "<feature> is not supported by sandfleet" with what to do
  instead; the SDK raises it as a SandboxException.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

import sandfleet.server.dialects.e2b.pause as e2b_pause
from sandfleet.errors import HostUnsupportedError
from sandfleet.sandbox.base import AgentSandbox
from sandfleet.sandbox.branching import foreign_processes
from sandfleet.server.dialects.e2b.metrics import metrics
from sandfleet.server.dialects.e2b.state import Boxes
from sandfleet.server.dialects.e2b.wire import CPError, cp_error, json_body, unsupported

Route = Callable[[Request], Awaitable[Any]]




FILES_ONLY = ("bwrap", "gvisor")
"""Backends whose snapshot keeps the filesystem, not the processes (microvm's keeps memory)."""


def install(app: FastAPI, e2b: Boxes, cp: Callable[..., Any]) -> None:
    service = e2b.service

    async def get_metrics(request: Request) -> Any:
        e = e2b.entry(e2b.owner(request), request.path_params["sid"])
        e2b.box(e)  # sampled from now on (one made through /v1)
        q = request.query_params
        try:
            start, end = (int(q[k]) if q.get(k) else None for k in ("start", "end"))
        except ValueError:
            raise CPError(400, "start and end are Unix times in seconds") from None
        return await metrics(e, start, end)

    async def snapshot(request: Request) -> Any:
        owner = e2b.owner(request)
        sid = request.path_params["sid"]
        entry = e2b.entry(owner, sid)
        real = entry.sb.id
        body = await json_body(request)
        if service.backend in FILES_ONLY and isinstance(entry.sb, AgentSandbox):
            try:
                procs = await foreign_processes(entry.sb)
            except Exception as err:
                raise cp_error(err) from None
            if procs:
                named = "; ".join(f"pid {p} {c} ({cmd[:80]})" for p, c, cmd in procs[:10])
                more = f" and {len(procs) - 10} more" if len(procs) > 10 else ""
                raise CPError(409, f"create_snapshot of {sid} would not keep its {len(procs)} running process(es): "
                                   f"{named}{more}: sandfleet's snapshot on the {service.backend} backend keeps the "
                                   "filesystem, not processes or memory (E2B's keeps both); stop them first "
                                   "(commands.kill), or serve with --backend microvm")
        try:
            snap_id, _ = await service.snapshot(owner, real)
        except NotImplementedError as err:
            raise unsupported("create_snapshot", f"{err} (this service's backend has no snapshots)") from None
        except Exception as err:
            raise cp_error(err) from None
        name = body.get("name")
        if name:
            e2b.snapshot_names[snap_id] = str(name)
        return {"snapshotID": snap_id, "names": [str(name)] if name else []}

    async def list_snapshots(request: Request) -> Any:
        owner = e2b.owner(request)
        q = request.query_params
        found = [(k, s) for k, s in service.snapshots.items() if s.owner == owner and k not in e2b.pause_snaps
                 and (not q.get("sandboxID") or s.sandbox == e2b.real(q["sandboxID"]))
                 and (not q.get("name") or e2b.snapshot_names.get(k) == q["name"])]
        names = e2b.snapshot_names
        return [{"snapshotID": k, "names": [names[k]] if k in names else []} for k, _ in found]

    async def delete_snapshot(request: Request) -> Any:
        owner = e2b.owner(request)
        tid = request.path_params["tid"]
        s = service.snapshots.get(tid)
        if s is None or s.owner != owner:
            raise CPError(404, f"no snapshot or template {tid!r} of this token")
        service.delete_snapshot(owner, tid)
        e2b.snapshot_names.pop(tid, None)
        return Response(status_code=204)

    async def fork(request: Request) -> Any:
        owner = e2b.owner(request)
        sid = request.path_params["sid"]
        e = e2b.entry(owner, sid)
        body = await json_body(request)
        try:
            count = int(body.get("count") or 1)
            timeout = float(body["timeout"]) if body.get("timeout") else None
        except (TypeError, ValueError):
            raise CPError(400, "count and timeout are numbers") from None
        if not 1 <= count <= 64:
            raise CPError(400, f"count {count} is not 1..64")
        try:  # the same primitive as POST /v1/sandboxes/{sid}/branch
            made, _ = await service.branch(owner, e.sb.id, count, processes="error", deadline_ms=None)
        except HostUnsupportedError as err:
            raise unsupported("fork", f"{err}") from None
        except Exception as err:
            raise cp_error(err) from None
        if timeout is not None:
            timeout = min(timeout, service.config.max_ttl_s)
            for k in made:
                k.expires = time.monotonic() + timeout
        parent = e2b.box(e)
        return [{"sandbox": e2b.sandbox_body(e2b.adopt(k, parent.template, dict(parent.metadata)))} for k in made]

    def refuse(feature: str, why: str) -> Route:
        async def route(request: Request) -> Any:
            e2b.entry(e2b.owner(request), request.path_params["sid"])  # 404 for an unknown sandbox
            raise unsupported(feature, why)
        return route

    async def pause(request: Request) -> Any:
        await e2b_pause.pause(e2b, e2b.owner(request), request.path_params["sid"], await json_body(request))
        return Response(status_code=204)

    network = refuse("update_network", "a sandbox's network is chosen at create (allow_internet_access)")
    app.add_api_route("/sandboxes/{sid}/metrics", cp(get_metrics), methods=["GET"], include_in_schema=False)
    app.add_api_route("/sandboxes/{sid}/snapshots", cp(snapshot, 201), methods=["POST"], include_in_schema=False)
    app.add_api_route("/snapshots", cp(list_snapshots), methods=["GET"], include_in_schema=False)
    app.add_api_route("/templates/{tid}", cp(delete_snapshot), methods=["DELETE"], include_in_schema=False)
    app.add_api_route("/sandboxes/{sid}/fork", cp(fork, 201), methods=["POST"], include_in_schema=False)
    app.add_api_route("/sandboxes/{sid}/pause", cp(pause), methods=["POST"], include_in_schema=False)
    app.add_api_route("/sandboxes/{sid}/network", cp(network), methods=["PUT"], include_in_schema=False)
