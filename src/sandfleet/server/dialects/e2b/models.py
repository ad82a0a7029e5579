"""The control plane's request bodies at the dialect's edge: ``POST /sandboxes`` (the SDK's
``NewSandbox``), the fields sandfleet uses; others are accepted and ignored. A field of the
wrong type is a 400 naming it. What E2B offers and sandfleet does not (:data:`UNSUPPORTED_FIELDS`)
is a 501 before the model is read; ``allow_internet_access`` and ``network`` are read by
:func:`.network.network_limits` (its own errors, its own tests)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

UNSUPPORTED_FIELDS = (("MCP", "mcp"), ("volume mounts", "volumeMounts"), ("auto-pause", "autoPause"), ("IAM", "iam"))


class NewSandbox(BaseModel):
    model_config = ConfigDict(extra="ignore", coerce_numbers_to_str=True)

    templateID: str | None = None
    timeout: float | None = None
    """Seconds; none (or 0): the dialect's default."""
    metadata: dict[str, str] | None = None
    envVars: dict[str, str] | None = None


def problem(err: ValidationError) -> str:
    """The 400's message: each field that failed and why (the first three)."""
    return "invalid sandbox: " + "; ".join(
        f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}" for e in err.errors()[:3])
