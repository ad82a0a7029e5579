"""The request bodies of SandboxFusion's API at the dialect's edge: ``RunCodeRequest`` and
``RunJupyterRequest``, the fields sandfleet uses (others are accepted and ignored, as
SandboxFusion does). A field of the wrong type is a 400 whose ``detail`` says what the field
must be, in the order SandboxFusion checks them (:func:`problem`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

FILES = "files must be an object of path -> base64 text, fetch_files a list of paths"


def _none_if_empty(v: Any) -> Any:
    return v or None  # SandboxFusion treats an empty or false files / fetch_files as none


class RunCode(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    code: str
    language: str
    stdin: str | None = None
    compile_timeout: int | float | None = None
    run_timeout: int | float | None = None
    memory_limit_MB: int | float | None = None
    files: dict[str, str | None] | None = None
    """Path (relative to the working directory) -> base64 content; a null content is skipped."""
    fetch_files: list[str] | None = None

    _files = field_validator("files", "fetch_files", mode="before")(_none_if_empty)


class RunJupyter(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    cells: list[str]
    kernel: str | None = None
    cell_timeout: int | float | None = None
    total_timeout: int | float | None = None
    files: dict[str, str | None] | None = None
    fetch_files: list[str] | None = None

    _files = field_validator("files", "fetch_files", mode="before")(_none_if_empty)


def problem(err: ValidationError, model: type[BaseModel], bounds: dict[str, tuple[float, float]]) -> str:
    """The 400's detail: what the first field that failed (in the model's order) must be."""
    order = list(model.model_fields)
    first = min(err.errors(), key=lambda x: order.index(str(x["loc"][0])) if x.get("loc") else len(order))
    loc = first.get("loc") or ("",)
    key = str(loc[0])
    if key in ("code", "language"):
        return "code and language are required strings"
    if key == "stdin":
        return "stdin must be a string or null"
    if key == "cells":
        return "cells is a required list of strings"
    if key == "kernel":
        return f"kernel {first.get('input')!r} is not supported by sandfleet (python3)"
    if key in bounds:
        low, high = bounds[key]
        return f"{key} must be a number from {low:g} to {high:g}, not {first.get('input')!r}"
    if key == "files" and len(loc) > 1:
        return f"files[{loc[1]!r}] is not base64 text"
    return FILES
