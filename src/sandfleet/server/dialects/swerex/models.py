"""The request bodies of SWE-ReX's ``swerex-remote`` API, as ``swerex.runtime.abstract`` sends
them (CreateBashSessionRequest, BashAction and BashInterruptAction, CloseBashSessionRequest,
Command, ReadFileRequest, WriteFileRequest). Fields the client sends and sandfleet does not
use are accepted and ignored; one of the wrong type is a 422 ``{"detail"}``, as swerex-remote's
own server answers. Upload is a multipart form (:func:`.api.SweRex.upload`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore", coerce_numbers_to_str=True)


class Empty(Body):
    """GET /, is_alive and close: no body."""


class SessionBody(Body):
    session: str | None = None

    @property
    def name(self) -> str:
        return self.session or "default"


class CreateSession(SessionBody):
    session_type: str | None = "bash"
    startup_source: list[str] | None = None


class CloseSession(SessionBody):
    pass


class RunInSession(SessionBody):
    """A BashAction, or a BashInterruptAction (``action_type`` ``bash_interrupt``)."""

    action_type: str | None = None
    command: str | None = None
    timeout: float | None = None
    check: str | None = "raise"
    error_msg: str | None = None
    expect: list[str] | None = None
    is_interactive_command: bool | None = None
    is_interactive_quit: bool | None = None
    n_retry: int | None = None
    """BashInterruptAction's."""

    @property
    def interactive(self) -> bool:
        return bool(self.is_interactive_command or self.is_interactive_quit or self.expect)


class Execute(Body):
    """A Command: argv (a list) or a string, split as a shell would unless ``shell``."""

    command: str | list[str] | None = None
    shell: bool | None = None
    timeout: float | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    check: bool | str | None = None
    error_msg: str | None = None
    merge_output_streams: bool | None = None


class ReadFile(Body):
    path: str
    encoding: str | None = None
    errors: str | None = None


class WriteFile(Body):
    path: str
    content: str | None = None


def parse(model: type[Body], body: Any) -> Body:
    """The body as ``model`` (a non-object body is an empty one, as before)."""
    return model.model_validate(body if isinstance(body, dict) else {})
