"""envd's files on sandfleet: ListDir, Stat, MakeDir, Remove (filesystem.Filesystem) and
``GET``/``POST /files`` (a file's bytes down; octet-stream or multipart/form-data up, gzip
or not, parsed by Starlette's form parser), each run in the sandbox as the request's user."""

from __future__ import annotations

import gzip
import posixpath
import re
import stat
import zlib
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response

from sandfleet.agent.client import ExecResult
from sandfleet.errors import SandfleetError
from sandfleet.server.dialects.e2b.state import Boxes
from sandfleet.server.dialects.e2b.wire import (
    CONNECT_STATUS,
    CPError,
    EnvdError,
    guest_envd_error,
    request_message,
    rfc3339,
)
from sandfleet.server.wire import FormError, form_parts

if TYPE_CHECKING:
    from sandfleet.server.service import Entry

HOME = "/home/user"
META_HEADER = "x-metadata-"
"""A file's metadata travels as ``X-Metadata-<key>: <value>`` headers of its upload (envd 0.6.2)."""
META_KEY = re.compile(r"^[!#$%&'*+.^_`|~0-9a-z-]+$")
META_VALUE = re.compile(r"^[\x20-\x7e]*$")
META_SET = ("import os, sys\n"
            "p, a = sys.argv[1], sys.argv[2:]\n"
            "try:\n"
            "    for k, v in zip(a[::2], a[1::2]):\n"
            "        os.setxattr(p, 'user.e2b.' + k, v.encode())\n"
            "except OSError as e:\n"
            "    sys.exit(f'{e.strerror}')\n")
"""Sets a file's metadata as E2B's envd does: ``user.e2b.<key>`` extended attributes."""
META_GET = ("import os, sys\n"
            "w = sys.stdout.buffer.write\n"
            "for p in sys.stdin.buffer.read().split(b'\\0'):\n"
            "    try:\n"
            "        names = [n for n in os.listxattr(p, follow_symlinks=False) if n.startswith('user.e2b.')]\n"
            "        for n in names:\n"
            "            w(b'x\\t' + n[9:].encode() + b'\\t' + os.getxattr(p, n, follow_symlinks=False)"
            " + b'\\t' + p + b'\\0')\n"
            "    except OSError:\n"
            "        pass\n")
"""Prints ``x<TAB>key<TAB>value<TAB>path`` records (NUL-ended) of the ``user.e2b.*`` attributes
of the paths on its stdin; a record of find's own never starts with ``x``."""


class FilesRPC:
    """The file calls (``/files``), a component of :class:`~.dialect.E2B` over its :class:`~.state.Boxes`."""

    def __init__(self, boxes: Boxes):
        self.boxes = boxes

    async def _entries(self, e: Entry, path: str, depth: int, user: str | None,
                       meta: bool = True) -> list[dict[str, Any]]:
        """The entries of ``path`` (itself at depth 0), with their metadata (``user.e2b.*``
        attributes, read by the image's python3 where it has one) unless ``meta`` is false."""
        script = ('[ -e "$1" ] || [ -L "$1" ] || exit 3; [ "$2" = 0 ] || [ -d "$1" ] || exit 4; m=$3; '
                  'if [ "$2" = 0 ]; then set -- "$1" -maxdepth 0; else set -- "$1" -mindepth 1 -maxdepth "$2"; fi; '
                  "find \"$@\" -printf '%y\\t%s\\t%m\\t%u\\t%g\\t%T@\\t%l\\t%p\\0'; rc=$?; "
                  '[ -z "$m" ] || ! command -v python3 >/dev/null 2>&1 || find "$@" -print0 | python3 -S -c "$m"; '
                  "exit $rc")
        full = posixpath.normpath(posixpath.join(e.sb.spec.workdir, path))
        try:
            res = await e.sb.exec(["sh", "-c", script, "sh", full, str(depth), META_GET if meta else ""], cwd="/",
                                  user=user, max_output=64 << 20)
        except Exception as err:
            raise guest_envd_error(err) from None
        if res.exit_code == 3:
            raise EnvdError("not_found", f"path {full} does not exist")
        if res.exit_code == 4:
            raise EnvdError("invalid_argument", f"path {full} is not a directory")
        out = []
        metas: dict[str, dict[str, str]] = {}
        for rec in res.stdout_bytes.split(b"\0"):
            if rec.startswith(b"x\t"):
                _, key, value, p = rec.decode(errors="replace").split("\t", 3)
                metas.setdefault(p, {})[key] = value
                continue
            parts = rec.decode(errors="replace").split("\t", 7)
            if len(parts) != 8:
                continue
            kind, size, mode, owner, group, mtime, target, p = parts
            ftype = {"f": "FILE_TYPE_FILE", "d": "FILE_TYPE_DIRECTORY", "l": "FILE_TYPE_SYMLINK"}.get(kind)
            if ftype is None:
                continue
            bits = int(mode, 8)
            fmt = {"f": stat.S_IFREG, "d": stat.S_IFDIR, "l": stat.S_IFLNK}[kind]
            ent: dict[str, Any] = {
                "name": posixpath.basename(p) or p, "type": ftype, "path": p, "size": size, "mode": bits,
                "permissions": stat.filemode(fmt | bits), "owner": owner, "group": group,
                "modifiedTime": rfc3339(float(mtime)), "isSymlink": kind == "l"}
            if kind == "l":
                ent["symlinkTarget"] = target
            out.append(ent)
        if res.exit_code != 0 and not out:
            raise EnvdError("invalid_argument", res.stderr.strip() or f"listing {full} failed")
        for ent in out:
            if ent["path"] in metas:
                ent["metadata"] = metas[ent["path"]]
        return out

    async def list_dir(self, request: Request) -> dict[str, Any]:
        e, _, user = self.boxes.envd(request)
        req = await request_message(request)
        depth = int(req.get("depth") or 1)
        return {"entries": await self._entries(e, str(req.get("path") or HOME), max(1, depth), user)}

    async def stat_(self, request: Request) -> dict[str, Any]:
        e, _, user = self.boxes.envd(request)
        req = await request_message(request)
        ents = await self._entries(e, str(req.get("path") or HOME), 0, user)
        if not ents:
            raise EnvdError("not_found", "no such path")
        return {"entry": ents[0]}

    async def _sh(self, e: Entry, user: str | None, script: str, *args: str) -> ExecResult:
        try:
            return await e.sb.exec(["sh", "-c", script, "sh", *args], cwd="/", user=user)
        except Exception as err:
            raise guest_envd_error(err) from None

    def _abs(self, e: Entry, path: str) -> str:
        return posixpath.normpath(posixpath.join(e.sb.spec.workdir, path))

    async def make_dir(self, request: Request) -> dict[str, Any]:
        e, _, user = self.boxes.envd(request)
        path = self._abs(e, str((await request_message(request)).get("path") or ""))
        res = await self._sh(e, user, '[ -e "$1" ] && exit 3; mkdir -p "$1"', path)
        if res.exit_code == 3:
            raise EnvdError("already_exists", f"{path} exists")
        if res.exit_code != 0:
            raise EnvdError("invalid_argument", res.stderr.strip())
        return {}

    async def remove(self, request: Request) -> dict[str, Any]:
        e, _, user = self.boxes.envd(request)
        path = self._abs(e, str((await request_message(request)).get("path") or ""))
        res = await self._sh(e, user, '[ -e "$1" ] || [ -L "$1" ] || exit 3; rm -rf "$1"', path)
        if res.exit_code == 3:
            raise EnvdError("not_found", f"{path} does not exist")
        return {}

    async def read(self, request: Request) -> Response:
        e, _, user = self.boxes.envd(request)
        path = request.query_params.get("path")
        if not path:
            raise CPError(400, "path is needed")
        try:
            data = await e.sb.read_file(self._abs(e, path), user=user)
        except Exception as err:
            ee = guest_envd_error(err)
            raise CPError(CONNECT_STATUS.get(ee.code, 400),  # permission_denied: 403 (401 would say "credentials")
                          ee.message) from None
        return Response(data, media_type="application/octet-stream")

    async def write(self, request: Request) -> list[dict[str, Any]]:
        e, _, user = self.boxes.envd(request)
        ctype = request.headers.get("content-type", "")
        raw = await request.body()
        if request.headers.get("content-encoding", "").lower() == "gzip":
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError, zlib.error):
                raise CPError(400, "the body is not valid gzip") from None
        qpath = request.query_params.get("path")
        if ctype.startswith("multipart/form-data"):
            try:
                parts = await form_parts(request.headers, raw, max_part_size=self.boxes.service.config.max_body_bytes)
            except FormError as err:
                raise CPError(400, f"the body is not a multipart form: {err}") from None
            named = [(filename or field, data) for field, filename, data in parts]  # the file's name, else the field's
            files = named if len(named) > 1 or not qpath else [(qpath, data) for _, data in named]
        else:
            if not qpath:
                raise CPError(400, "path is needed for an octet-stream upload")
            files = [(qpath, raw)]
        if not files:
            raise CPError(400, "no file in the request")
        meta = {k[len(META_HEADER):].lower(): v for k, v in request.headers.items()
                if k.lower().startswith(META_HEADER)}
        for k, v in meta.items():
            if not META_KEY.match(k) or not META_VALUE.match(v):
                raise CPError(400, f"invalid metadata {k!r}: keys are HTTP token characters, values printable ASCII")
        out = []
        for name, data in files:
            path = self._abs(e, name)
            try:
                try:
                    await e.sb.write_file(path, data, user=user)
                except SandfleetError as err:
                    if getattr(err, "errno", None) != 2:
                        raise
                    await e.sb.exec(["mkdir", "-p", posixpath.dirname(path)], cwd="/", user=user)
                    await e.sb.write_file(path, data, user=user)
            except Exception as err:
                ee = guest_envd_error(err)
                raise CPError(403 if ee.code == "permission_denied" else 400, ee.message) from None
            info: dict[str, Any] = {"name": posixpath.basename(path), "type": "file", "path": path}
            if meta:
                await self._set_meta(e, user, path, meta)
                info["metadata"] = meta
            out.append(info)
        return out

    async def _set_meta(self, e: Entry, user: str | None, path: str, meta: dict[str, str]) -> None:
        """A file's metadata as ``user.e2b.<key>`` extended attributes (python3 in the sandbox sets them)."""
        args = [x for kv in meta.items() for x in kv]
        script = 'command -v python3 >/dev/null 2>&1 || exit 127; exec python3 -S -c "$@"'
        res = await self._sh(e, user, script, META_SET, path, *args)
        if res.exit_code == 127:
            raise CPError(400, "file metadata needs python3 in the sandbox's image (it sets the file's "
                               "user.e2b.* extended attributes); this image has none")
        if res.exit_code != 0:
            raise CPError(400, f"file metadata could not be set on {path}: {res.stderr.strip()}")
