"""E2B's egress lists (``network.allowOut`` / ``network.denyOut`` of a create request) as
sandfleet's allowlist policy (sandbox/allowlist.py), the same one Harbor's ``allowlist`` gets.

E2B's rules: without lists, ``allow_internet_access`` decides, and when a client leaves it out
the sandbox has the internet, as on E2B (``sandfleet serve --no-e2b-internet`` turns that
default off for the whole service; a backend without network, microvm, has it off);
``allow_internet_access = false`` is ``denyOut = ["0.0.0.0/0"]``; ``allowOut``
entries (CIDRs, IPs, names, ``*.domain``) take precedence over ``denyOut`` ones (CIDRs and
IPs only). So: everything denied -> an allowlist of ``allowOut``; some CIDRs denied -> a
denylist that ``allowOut`` gets past; only ``allowOut`` -> everything is allowed anyway.
``dnsServers`` is not needed: names resolve through the sandbox's own resolver."""

from __future__ import annotations

from typing import Any

ALL_TRAFFIC = "0.0.0.0/0"


def network_limits(body: dict[str, Any], default: bool = True) -> dict[str, Any]:
    """``Limits`` fields (``network``, ``allow``, ``deny``) for a create request's body
    (``default``: the internet when the body does not say); ValueError naming a malformed list."""
    asked = body.get("allow_internet_access")
    internet = default if asked is None else bool(asked)
    net = body.get("network") or {}
    if not isinstance(net, dict):
        raise ValueError("network must be an object")
    lists: dict[str, list[str]] = {}
    for key in ("allowOut", "denyOut"):
        value = net.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise ValueError(f"network.{key} must be a list of strings")
        lists[key] = list(value or [])
    allow, deny = lists["allowOut"], lists["denyOut"]
    if not allow and not deny:
        return {"network": internet}
    if not internet or ALL_TRAFFIC in [d.strip() for d in deny]:
        if not allow:
            return {"network": False}
        return {"network": True, "allow": tuple(allow)}
    if not deny:  # allowOut alone restricts nothing (E2B: no deny rule to take precedence over)
        return {"network": True}
    return {"network": True, "allow": tuple(allow), "deny": tuple(deny)}
