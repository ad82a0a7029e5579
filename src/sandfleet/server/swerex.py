"""Placeholder; filled in below."""

from __future__ import annotations

from typing import Any


def install(app: Any, service: Any, tokens: Any) -> None:
    return None
