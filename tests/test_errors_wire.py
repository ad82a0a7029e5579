"""The one table between the service's error codes and exceptions (errors.WIRE): what the
client raises for an answer is what the server answers for that exception, code and status."""

from __future__ import annotations

import pytest

from sandfleet.errors import (
    WIRE,
    AuthError,
    ConfigError,
    GuestFileNotFoundError,
    ImageError,
    SandboxDiedError,
    SandboxExpiredError,
    SandboxLostError,
    ServiceBusyError,
    ServiceError,
    error_of,
    from_wire,
    to_wire,
)

CODES = sorted({code for code, _, _ in WIRE})


@pytest.mark.parametrize("code", CODES)
def test_every_code_round_trips(code: str) -> None:
    status = next(s for c, s, _ in WIRE if c == code)
    e = from_wire(status, {"code": code, "message": f"about {code}"})
    assert str(e) == f"about {code}"
    wire = to_wire(e)
    assert wire is not None and wire[:2] == (status, code), (code, type(e).__name__, wire)


def test_a_code_has_one_status() -> None:
    seen: dict[str, int] = {}
    for code, status, _ in WIRE:
        assert seen.setdefault(code, status) == status, f"{code} has two statuses in WIRE"


def test_client_side_types() -> None:
    assert type(from_wire(410, {"code": "sandbox_lost", "message": "m"})) is SandboxLostError
    assert isinstance(from_wire(410, {"code": "sandbox_expired", "message": "m"}), SandboxDiedError)
    assert type(from_wire(400, {"code": "unknown_image", "message": "m"})) is ImageError
    assert type(from_wire(413, {"code": "too_large", "message": "m"})) is ConfigError
    busy = from_wire(429, {"code": "quota_exceeded", "message": "m"}, retry_after=3)
    assert isinstance(busy, ServiceBusyError) and (busy.code, busy.retry_after) == ("quota_exceeded", 3)
    assert isinstance(from_wire(401, {"code": "unauthorized", "message": "m"}), AuthError)
    # codes of no row keep their status and code (the client's task-image errors read them)
    other = from_wire(422, {"code": "some_new_code", "message": "m"})
    assert type(other) is ServiceError and (other.status, other.code) == (422, "some_new_code")
    assert isinstance(from_wire(429, {"code": "some_new_code"}), ServiceBusyError)
    guest = from_wire(422, {"code": "guest_error", "message": "m", "guest_type": "FileNotFoundError", "errno": 2})
    assert isinstance(guest, GuestFileNotFoundError) and guest.errno == 2


def test_server_side_codes() -> None:
    # a ServiceError raised inside the service names its code; the table gives the status
    assert to_wire(ServiceError("m", code="sandbox_not_found")) == (404, "sandbox_not_found", {})
    assert to_wire(ServiceError("m", code="host_error", retry_after=1)) == (503, "host_error", {})
    assert to_wire(ServiceError("m", code="never_heard_of")) == (500, "never_heard_of", {})
    assert to_wire(SandboxExpiredError("m"))[:2] == (410, "sandbox_expired")  # type: ignore[index]
    assert to_wire(ConfigError("unknown image 'x'"))[:2] == (400, "invalid_request")  # type: ignore[index]
    assert to_wire(GuestFileNotFoundError("m", errno=2)) == (
        422, "guest_error", {"guest_type": "FileNotFoundError", "errno": 2})
    assert to_wire(ValueError("a bug")) is None
    e = error_of("sandbox_closed", "gone")
    assert to_wire(e)[:2] == (410, "sandbox_closed") and str(e) == "gone"  # type: ignore[index]
