"""Turning pydantic validation errors on task files into :class:`TaskError` naming file+field."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sandfleet.errors import TaskError

M = TypeVar("M", bound=BaseModel)

_MESSAGES = {
    "greater_than": "must be a positive number",
    "greater_than_equal": "must not be negative",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "int_parsing": "must be an integer",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a table of key = value",
    "list_type": "must be a list",
    "missing": "is required",
    "literal_error": "is not one of the allowed values",
}


def validate(model: type[M], data: Any, *, file: str, prefix: str = "") -> M:
    """``model.model_validate(data)``, with the first error as a :class:`TaskError`."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        error = e.errors()[0]
        loc = ".".join(str(part) for part in error["loc"])
        field = f"{prefix}{loc}" if loc else prefix.rstrip(".") or None
        kind = error["type"]
        if kind == "extra_forbidden":
            allowed = ", ".join(sorted(model.model_fields))
            message = f"unknown key (known here: {allowed})"
            if len(error["loc"]) > 1:
                message = "unknown key"
        elif kind == "literal_error":
            message = f"must be {error.get('ctx', {}).get('expected', 'an allowed value')}"
        else:
            message = _MESSAGES.get(kind, error["msg"])
        raise TaskError(message, file=file, field=field) from None
