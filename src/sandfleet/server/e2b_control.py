"""The E2B control plane beyond create/connect/list/kill: metrics, snapshots, forks, and
the clear refusals of what sandfleet does not serve.

- ``get_metrics``: the sandbox's cgroups (``e2b_metrics``).
- ``create_snapshot``: a sandfleet snapshot (its filesystem; memory where the backend saves
  it). Its id is a template: ``Sandbox.create(template=<snapshot id>)`` starts a sandbox
  from it (a fork); ``list_snapshots`` and ``delete_snapshot`` work on the token's own.
- ``Sandbox.fork``: a snapshot of the sandbox, then ``count`` sandboxes from it (the
  snapshot is dropped at once where the children copied it, else kept and listed).
- ``pause``, ``beta_pause``, resume and ``update_network`` answer 501 "<feature> is not
  supported by sandfleet" with what to do instead; the SDK raises it as a SandboxException.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from sandfleet.errors import SandfleetError
from sandfleet.images import resolve_image
from sandfleet.sandbox.base import Snapshot
from sandfleet.server.e2b_metrics import metrics
from sandfleet.server.e2b_wire import CPError, cp_error, unsupported

if TYPE_CHECKING:
    from sandfleet.server.e2b import E2B

Route = Callable[[Request], Awaitable[Any]]


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise CPError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise CPError(400, "the body is not a JSON object")
    return body


def _copied(snap: Snapshot) -> bool:
    """Whether sandboxes forked from ``snap`` copied its layers (bwrap over a host-root
    image: the launcher copies them into each writable layer), so it may go at once. Over a
    built image its layer stays an overlay lower of the children, and a microVM's memory
    file is theirs too: deleting it would pull files from under them."""
    if snap.backend != "bwrap":
        return False
    try:
        return resolve_image(snap.spec.image).lowers[-1] == Path("/")
    except SandfleetError:
        return False


def install(app: FastAPI, e2b: E2B, cp: Callable[..., Any]) -> None:
    service = e2b.service

    async def get_metrics(request: Request) -> Any:
        e = e2b.entry(e2b.owner(request), request.path_params["sid"])
        return await metrics(e)

    async def snapshot(request: Request) -> Any:
        owner = e2b.owner(request)
        sid = request.path_params["sid"]
        e2b.entry(owner, sid)
        body = await _body(request)
        try:
            snap_id, _ = await service.snapshot(owner, sid)
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
        found = [(k, s) for k, s in service.snapshots.items() if s.owner == owner
                 and (not q.get("sandboxID") or s.sandbox == q["sandboxID"])
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
        body = await _body(request)
        try:
            count = int(body.get("count") or 1)
            timeout = float(body["timeout"]) if body.get("timeout") else None
        except (TypeError, ValueError):
            raise CPError(400, "count and timeout are numbers") from None
        if not 1 <= count <= 64:
            raise CPError(400, f"count {count} is not 1..64")
        try:
            snap_id, _ = await service.snapshot(owner, sid)
        except NotImplementedError as err:
            raise unsupported("fork", f"{err} (this service's backend has no snapshots)") from None
        except Exception as err:
            raise cp_error(err) from None
        try:
            kids = await service.fork(owner, snap_id, count, ttl_s=timeout, labels=None, deadline_ms=None)
        except Exception as err:
            service.delete_snapshot(owner, snap_id)
            raise cp_error(err) from None
        if _copied(service.snapshots[snap_id].snap):
            service.delete_snapshot(owner, snap_id)  # the children have their own copies of its layer
        else:  # its layer is under the children's root: it lives until they are gone (list_snapshots shows it)
            e2b.snapshot_names[snap_id] = f"fork-of-{sid}"
        parent = e2b.box(e)
        return [{"sandbox": e2b.sandbox_body(e2b.adopt(k, parent.template, dict(parent.metadata)))} for k in kids]

    def refuse(feature: str, why: str) -> Route:
        async def route(request: Request) -> Any:
            e2b.entry(e2b.owner(request), request.path_params["sid"])  # 404 for an unknown sandbox
            raise unsupported(feature, why)
        return route

    pause = refuse("pause", "a sandfleet sandbox can't be paused and resumed under the same id; "
                            "create_snapshot and Sandbox.create(template=<snapshot id>) keep its files")
    resume = refuse("resume", "sandfleet sandboxes are never paused")
    network = refuse("update_network", "a sandbox's network is chosen at create (allow_internet_access)")
    app.add_api_route("/sandboxes/{sid}/metrics", cp(get_metrics), methods=["GET"], include_in_schema=False)
    app.add_api_route("/sandboxes/{sid}/snapshots", cp(snapshot, 201), methods=["POST"], include_in_schema=False)
    app.add_api_route("/snapshots", cp(list_snapshots), methods=["GET"], include_in_schema=False)
    app.add_api_route("/templates/{tid}", cp(delete_snapshot), methods=["DELETE"], include_in_schema=False)
    app.add_api_route("/sandboxes/{sid}/fork", cp(fork, 201), methods=["POST"], include_in_schema=False)
    app.add_api_route("/sandboxes/{sid}/pause", cp(pause), methods=["POST"], include_in_schema=False)
    app.add_api_route("/sandboxes/{sid}/resume", cp(resume), methods=["POST"], include_in_schema=False)
    app.add_api_route("/sandboxes/{sid}/network", cp(network), methods=["PUT"], include_in_schema=False)
