"""The client's one boundary with HTTP: requests, and every failure mapped into sandfleet's
exception tree (an error body's ``code`` back to the exception a local sandbox raises, by
:data:`sandfleet.errors.WIRE`, the table the server answers by)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

import httpx
import pydantic

from sandfleet.errors import ConfigError, ProtocolError, ServiceError, from_wire

JSON = {"content-type": "application/json"}


@contextlib.contextmanager
def checked_request() -> Iterator[None]:
    """Build a request's wire model inside: a value it refuses is the ConfigError the
    service would answer (400 invalid_request), raised before anything is sent."""
    try:
        yield
    except pydantic.ValidationError as e:
        raise ConfigError(f"invalid request: {_first_error(e)}") from None


def _first_error(e: pydantic.ValidationError) -> str:
    errs = e.errors()
    parts = [f"{'.'.join(str(x) for x in err.get('loc', ()))}: {err.get('msg')}" for err in errs[:3]]
    return "; ".join(parts) or str(e)


def body(model: pydantic.BaseModel) -> bytes:
    """A request's JSON body from its wire model, without the fields left None (the service
    assumes the same for a field that is absent)."""
    return model.model_dump_json(exclude_none=True).encode()


M = TypeVar("M", bound=pydantic.BaseModel)


def answer(model: type[M], data: Any) -> M:
    """An answer's JSON read by its wire model; ProtocolError for one that does not fit."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as e:
        raise ProtocolError(f"the service sent a malformed {model.__name__}: {_first_error(e)}") from None


def _retry_after(resp: httpx.Response) -> float | None:
    with contextlib.suppress(TypeError, ValueError):
        return float(resp.headers.get("retry-after"))
    return None


async def raise_for_status(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    await resp.aread()
    try:
        body = resp.json()
        if not isinstance(body, dict):
            raise ValueError
    except ValueError:
        body = {"code": "error", "message": f"HTTP {resp.status_code}: {resp.text[:200]}"}
    raise from_wire(resp.status_code, body, _retry_after(resp))


def transport_error(e: httpx.HTTPError, url: str) -> Exception:
    """An httpx failure with no answer: the service can't be reached, or went away."""
    if isinstance(e, httpx.TimeoutException):
        return ServiceError(f"the service at {url} did not answer in time ({type(e).__name__})", code="timeout")
    return ServiceError(f"cannot reach the service at {url}: {type(e).__name__}: {e}", code="unreachable")


async def ndjson(resp: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The records of an NDJSON answer; ProtocolError for a line that isn't a JSON object."""
    async for line in resp.aiter_lines():
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise ProtocolError(f"the service sent a malformed NDJSON line: {line[:120]!r}") from None
        if not isinstance(rec, dict):
            raise ProtocolError(f"the service sent a non-object NDJSON line: {line[:120]!r}")
        yield rec
