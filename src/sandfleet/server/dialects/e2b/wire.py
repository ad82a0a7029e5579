"""What every part of the E2B dialect shares: Connect framing (JSON codec), its errors, and
the mapping of sandfleet's errors onto the codes the E2B SDK turns into its exceptions."""

from __future__ import annotations

import datetime as dt
import json
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from sandfleet.errors import SandfleetError
from sandfleet.server.wire import Problem, problem_for

log = logging.getLogger("sandfleet.server.dialects.e2b")

CONNECT_JSON = "application/connect+json"
CONNECT_STATUS = {"invalid_argument": 400, "unauthenticated": 401, "permission_denied": 403, "not_found": 404,
                  "already_exists": 409, "resource_exhausted": 429, "internal": 500, "unimplemented": 501,
                  "unavailable": 503, "deadline_exceeded": 504, "failed_precondition": 400}
UNSUPPORTED = "not supported by sandfleet"
"""Every refusal of an E2B feature that sandfleet does not serve says this, with the feature."""


class CPError(Exception):
    """A control-plane error: ``{"code": status, "message"}``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class EnvdError(Exception):
    """An envd (Connect) error: a string code and a message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class NotFound(Exception):
    """The sandbox of an envd request is unknown or dead: 502 "... was not found"."""


def unsupported(feature: str, why: str = "") -> CPError:
    """501 naming the feature: the SDK raises it as a SandboxException with this text."""
    return CPError(501, f"{feature} is {UNSUPPORTED}" + (f": {why}" if why else ""))


def envelope(flags: int, msg: dict[str, Any]) -> bytes:
    data = json.dumps(msg, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(error: dict[str, Any] | None = None) -> bytes:
    return envelope(2, {"error": error} if error else {})


def parse_envelopes(raw: bytes) -> list[dict[str, Any]]:
    """The messages of a Connect streaming request body (JSON codec)."""
    out = []
    off = 0
    while off < len(raw):
        if len(raw) - off < 5:
            raise EnvdError("invalid_argument", "a torn Connect envelope")
        flags, n = struct.unpack_from(">BI", raw, off)
        payload = raw[off + 5:off + 5 + n]
        off += 5 + n
        if len(payload) != n:
            raise EnvdError("invalid_argument", "a torn Connect envelope")
        if flags & 1:
            raise EnvdError("invalid_argument", "compressed messages are not accepted")
        if flags & 2:
            break
        try:
            msg = json.loads(payload or b"{}")
        except ValueError:
            raise EnvdError("invalid_argument", "a message that is not JSON") from None
        if not isinstance(msg, dict):
            raise EnvdError("invalid_argument", "a message that is not a JSON object")
        out.append(msg)
    return out


async def request_message(request: Request) -> dict[str, Any]:
    """The (first) message of an RPC, whether the client framed it as a stream (connect+json)
    or sent it unary (application/json)."""
    raw = await request.body()
    if request.headers.get("content-type", "").split(";")[0].strip() == CONNECT_JSON:
        msgs = parse_envelopes(raw)
        if not msgs:
            raise EnvdError("invalid_argument", "an empty request stream")
        return msgs[0]
    try:
        req = json.loads(raw or b"{}")
    except ValueError:
        raise EnvdError("invalid_argument", "the body is not JSON") from None
    if not isinstance(req, dict):
        raise EnvdError("invalid_argument", "the body is not a JSON object")
    return req


async def json_body(request: Request) -> dict[str, Any]:
    """A control-plane call's JSON object (none: ``{}``); 400 for anything else."""
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise CPError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise CPError(400, "the body is not a JSON object")
    return body


def rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cp_response(e: CPError) -> JSONResponse:
    return JSONResponse({"code": e.status, "message": e.message}, status_code=e.status)


def cp_error(e: BaseException) -> CPError:
    p = problem_for(e) if isinstance(e, SandfleetError | Problem) else None
    if p is None:
        log.error("E2B control-plane call failed: %s: %s", type(e).__name__, e, exc_info=e)
        return CPError(500, f"{type(e).__name__}: {e}")
    status = 404 if p.status_code == 410 else p.status_code
    return CPError(status, p.message)


def envd_response(e: EnvdError) -> JSONResponse:
    return JSONResponse({"code": e.code, "message": e.message}, status_code=CONNECT_STATUS.get(e.code, 500))


def not_found(sid: str) -> JSONResponse:
    return JSONResponse({"code": 502, "message": f"The sandbox {sid} was not found"}, status_code=502)


def error_response(err: BaseException) -> JSONResponse | None:
    """The one place a handler's error becomes E2B's wire error (None: not one of ours, the
    app's handlers answer it): a control-plane error is ``{"code": <status>, "message"}``, an
    envd one Connect's ``{"code": <name>, "message"}``, an unknown or dead sandbox 502 "...
    was not found" (the SDK's SandboxNotRunning). Sandbox and service errors become one of the
    three where they happen (:func:`cp_error`, :func:`guest_envd_error`): which, depends on the
    route family."""
    if isinstance(err, NotFound):
        return not_found(str(err))
    if isinstance(err, EnvdError):
        return envd_response(err)
    if isinstance(err, CPError):
        return cp_response(err)
    return None


def route(fn: Callable[[Request], Awaitable[Any]], status: int = 200) -> Callable[[Request], Awaitable[Response]]:
    """An E2B route: ``fn``'s answer as JSON with ``status`` (a Response as it is), its errors
    through :func:`error_response`."""
    async def handler(request: Request) -> Response:
        try:
            out = await fn(request)
        except Exception as err:
            answer = error_response(err)
            if answer is None:
                raise
            return answer
        return out if isinstance(out, Response) else JSONResponse(out, status_code=status)
    return handler


def guest_envd_error(e: BaseException) -> EnvdError:
    p = problem_for(e) if isinstance(e, SandfleetError | Problem) else None
    if p is None:
        log.error("E2B envd call failed: %s: %s", type(e).__name__, e, exc_info=e)
        return EnvdError("internal", f"{type(e).__name__}: {e}")
    errno = p.extra.get("errno")
    if errno == 2:
        return EnvdError("not_found", p.message)
    if errno == 13:
        return EnvdError("permission_denied", p.message)
    if p.status_code == 410:
        return EnvdError("unavailable", p.message)
    if p.status_code == 429:
        return EnvdError("resource_exhausted", p.message)
    return EnvdError("invalid_argument", p.message)
