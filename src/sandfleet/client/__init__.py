"""The Python client of ``sandfleet serve``: sandboxes on another host, same contract.

    from sandfleet.client import connect

    async with await connect("https://cpu-7:8765", token) as svc:
        async with await svc.create_sandbox(image="host", ttl_s=600) as sb:
            res = await sb.exec("pytest -q", timeout=60)

``async with remote(url):`` makes every sandbox created inside (by any sandfleet code) a
sandbox of that service: the ``--remote URL`` option of the CLI. It needs only httpx (no
server extra). ``connect(..., transport=...)`` takes any httpx
transport (a test's ``httpx.ASGITransport``, a proxy).
"""

from sandfleet.client.remote import on_remote, remote
from sandfleet.client.sandbox import RemoteSandbox, RemoteSnapshot
from sandfleet.client.service import ServiceClient, connect

__all__ = ["RemoteSandbox", "RemoteSnapshot", "ServiceClient", "connect", "on_remote", "remote"]
