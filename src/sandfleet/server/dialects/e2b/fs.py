"""envd's filesystem extras on sandfleet: Move (``files.rename``) and directory watchers
(``files.watch_dir``: WatchDir, streamed, for the async SDK; CreateWatcher,
GetWatcherEvents and RemoveWatcher, polled, for the sync SDK).

Everything runs inside the sandbox as the request's user, so permissions are that user's.
A watcher compares listings of the directory (``find``, as ListDir) every
``WATCH_INTERVAL_S``: a new path is CREATE, a gone one REMOVE, a new size or mtime WRITE, a
new mode CHMOD. It sees what changed between two looks, not every write (a file made and
removed within one interval is not reported), and a rename shows as REMOVE + CREATE.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from sandfleet.server.dialects.e2b.files import FilesRPC
from sandfleet.server.dialects.e2b.state import Box, Watcher
from sandfleet.server.dialects.e2b.wire import CONNECT_JSON, EnvdError, end_stream, envelope, request_message

if TYPE_CHECKING:
    from sandfleet.server.service import Entry

WATCH_INTERVAL_S = 0.25
WATCH_DEPTH = 32
"""How deep a recursive watch looks."""
WATCHERS_PER_SANDBOX = 16
EVENTS_KEPT = 10_000


Listing = dict[str, tuple[str, str, str, int]]


class FsRPC(FilesRPC):
    """filesystem.Filesystem (on the file calls), a component of :class:`~.dialect.E2B`."""

    async def move(self, request: Request) -> dict[str, Any]:
        e, _, user = self.boxes.envd(request)
        req = await request_message(request)
        src, dst = self._abs(e, str(req.get("source") or "")), self._abs(e, str(req.get("destination") or ""))
        if src == "/" or dst == "/":
            raise EnvdError("invalid_argument", "Move needs a source and a destination")
        res = await self._sh(e, user, '[ -e "$1" ] || [ -L "$1" ] || exit 3; mkdir -p "$(dirname "$2")" && '
                                      'mv -T -- "$1" "$2"', src, dst)
        if res.exit_code == 3:
            raise EnvdError("not_found", f"path {src} does not exist")
        if res.exit_code != 0:
            code = "permission_denied" if "ermission denied" in res.stderr else "invalid_argument"
            raise EnvdError(code, res.stderr.strip() or f"moving {src} to {dst} failed")
        ents = await self._entries(e, dst, 0, user)
        return {"entry": ents[0]} if ents else {}

    async def _listing(self, e: Entry, path: str, depth: int, user: str | None,
                       meta: bool = False) -> tuple[Listing, dict[str, Any]]:
        ents = await self._entries(e, path, depth, user, meta=meta)
        return ({x["path"]: (x["type"], str(x["size"]), x["modifiedTime"], int(x["mode"])) for x in ents},
                {x["path"]: x for x in ents})

    async def _watch(self, e: Entry, path: str, recursive: bool, include: bool, user: str | None,
                     w: Watcher, first: Listing) -> None:
        prev = first
        depth = WATCH_DEPTH if recursive else 1
        try:
            while True:
                await asyncio.sleep(WATCH_INTERVAL_S)
                try:
                    cur, ents = await self._listing(e, path, depth, user, meta=include)
                except EnvdError as err:
                    w.error = err
                    return
                out = []
                for p in sorted(set(prev) | set(cur)):
                    old, new = prev.get(p), cur.get(p)
                    kind = ("EVENT_TYPE_CREATE" if old is None else "EVENT_TYPE_REMOVE" if new is None
                            else "EVENT_TYPE_WRITE" if old[:3] != new[:3] else "EVENT_TYPE_CHMOD" if old != new
                            else None)
                    if kind is None:
                        continue
                    ev: dict[str, Any] = {"name": posixpath.relpath(p, path), "type": kind}
                    if include and new is not None:
                        ev["entry"] = ents[p]
                    out.append(ev)
                prev = cur
                if out:
                    w.events.extend(out)
                    del w.events[:-EVENTS_KEPT]
                    w.changed.set()
        finally:
            w.changed.set()

    async def _new_watcher(self, request: Request, b: Box) -> tuple[Watcher, str]:
        e, _, user = self.boxes.envd(request)
        req = await request_message(request)
        path = self._abs(e, str(req.get("path") or ""))
        recursive = bool(req.get("recursive"))
        if len([w for w in b.watchers.values() if w.task and not w.task.done()]) >= WATCHERS_PER_SANDBOX:
            raise EnvdError("resource_exhausted", f"a sandbox has at most {WATCHERS_PER_SANDBOX} watchers")
        first, _ = await self._listing(e, path, WATCH_DEPTH if recursive else 1, user)  # not_found for no dir
        w = Watcher()
        w.task = asyncio.create_task(self._watch(e, path, recursive, bool(req.get("includeEntry")
                                                                           or req.get("include_entry")),
                                                 user, w, first))
        wid = f"w-{secrets.token_hex(6)}"
        b.watchers[wid] = w
        return w, wid

    async def create_watcher(self, request: Request) -> dict[str, Any]:
        _, b, _ = self.boxes.envd(request)
        _, wid = await self._new_watcher(request, b)
        return {"watcherId": wid}

    def _watcher(self, b: Box, req: dict[str, Any]) -> tuple[str, Watcher]:
        wid = str(req.get("watcherId") or req.get("watcher_id") or "")
        w = b.watchers.get(wid)
        if w is None:
            raise EnvdError("not_found", f"watcher {wid!r} not found")
        return wid, w

    async def get_watcher_events(self, request: Request) -> dict[str, Any]:
        _, b, _ = self.boxes.envd(request)
        _, w = self._watcher(b, await request_message(request))
        if w.error is not None:
            raise w.error
        events, w.events = w.events, []
        return {"events": events}

    async def remove_watcher(self, request: Request) -> dict[str, Any]:
        _, b, _ = self.boxes.envd(request)
        wid, w = self._watcher(b, await request_message(request))
        del b.watchers[wid]
        if w.task is not None:
            w.task.cancel()
        return {}

    async def watch_dir(self, request: Request) -> Response:
        _, b, _ = self.boxes.envd(request)
        w, wid = await self._new_watcher(request, b)

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield envelope(0, {"start": {}})
                while True:
                    while w.events:
                        ev = w.events.pop(0)
                        yield envelope(0, {"filesystem": ev})
                    if w.task is None or w.task.done():
                        err = w.error
                        yield end_stream({"code": err.code, "message": err.message} if err else None)
                        return
                    w.changed.clear()
                    if not w.events:
                        await w.changed.wait()
            finally:
                b.watchers.pop(wid, None)
                if w.task is not None:
                    w.task.cancel()
                    with contextlib.suppress(BaseException):
                        await w.task

        return StreamingResponse(stream(), media_type=CONNECT_JSON)
