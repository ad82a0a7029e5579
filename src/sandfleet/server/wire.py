"""Wire helpers every part of the service shares: its HTTP errors (:class:`Problem`, and
:func:`problem_for`, sandfleet's exceptions as answers by :data:`sandfleet.errors.WIRE`),
NDJSON lines, base64 fields, tar uploads checked before they are unpacked, multipart forms (through Starlette's
parser, python-multipart)."""

from __future__ import annotations

import base64
import binascii
import io
import json
import tarfile
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from sandfleet.errors import ServiceError, to_wire

NDJSON_TYPE = "application/x-ndjson"
BINARY_BODY = {"requestBody": {"required": True, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
TAR_BODY = {"requestBody": {"required": True, "description": "an uncompressed tar stream", "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}


class Problem(HTTPException):
    """An error answer: HTTP ``status``, a machine-readable ``code`` and a message."""

    def __init__(self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None):
        super().__init__(status_code=status, detail=message, headers=headers)
        self.code = code
        self.message = message
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.extra}


def problem_for(e: BaseException) -> Problem | None:
    """The HTTP answer for a sandfleet exception, from :data:`sandfleet.errors.WIRE` (the
    one table of codes); None for an exception that is a bug of ours (the caller logs it
    and answers 500)."""
    if isinstance(e, Problem):
        return e
    wire = to_wire(e)
    if wire is None:
        return None
    status, code, extra = wire
    retry = e.retry_after if isinstance(e, ServiceError) else None
    headers = None if retry is None else {"Retry-After": str(int(retry)) if float(retry).is_integer() else str(retry)}
    return Problem(status, code, str(e) or type(e).__name__, headers=headers, extra=extra)


def ndjson_line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def problem_response(p: Problem) -> JSONResponse:
    return JSONResponse(p.body(), status_code=p.status_code, headers=p.headers)


def b64_field(text: str | None, name: str) -> bytes | None:
    """A base64 request field's bytes; 400 naming the field when it is not base64."""
    if text is None:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Problem(400, "invalid_request", f"{name} is not valid base64") from None


def check_tar(data: bytes) -> None:
    """Refuse an archive whose members would land outside the directory it is unpacked in."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for m in tar:
                try:
                    tarfile.data_filter(m, "/.sandfleet-upload")
                except tarfile.FilterError as err:
                    raise Problem(400, "bad_path", f"upload refused: {err}") from None
    except (tarfile.TarError, EOFError) as err:
        raise Problem(400, "invalid_request", f"the body is not an uncompressed tar archive: {err}") from None


class FormError(ValueError):
    """A multipart/form-data body that does not parse; the message says why."""


async def form_parts(headers: Mapping[str, str], body: bytes, *, max_part_size: int) -> list[tuple[str, str, bytes]]:
    """(field name, file name or "", bytes) of each part of a multipart/form-data ``body``,
    in order, parsed by Starlette's parser (python-multipart). ``body`` is the request's
    body already read (and decoded, where it came gzip-encoded); ``max_part_size`` bounds a
    part that is not a file (files have no bound here: the service caps the body)."""

    async def stream() -> AsyncGenerator[bytes, None]:
        yield body

    parser = MultiPartParser(Headers(headers=dict(headers)), stream(), max_part_size=max_part_size)
    try:
        form = await parser.parse()
    except MultiPartException as e:
        raise FormError(e.message) from None
    try:
        out = []
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                out.append((name, value.filename or "", await value.read()))
            else:
                out.append((name, "", value.encode()))
        return out
    finally:
        await form.close()
