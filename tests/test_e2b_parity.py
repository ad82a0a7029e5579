"""E2B and SWE-ReX parity: the real, unmodified E2B SDK (sync and async) and SWE-ReX's own
RemoteRuntime against a real ``sandfleet serve`` on loopback, through every public method
of ``Sandbox``, ``commands``, ``pty``, ``files`` and the runtime. Each method either works as
the SDK documents, or is refused with an error that says "not supported by sandfleet" and
names the feature.

Every check records one row; the rows make the coverage table of docs/service.md, which
this module compares with the page (``SANDFLEET_WRITE_COVERAGE=1`` rewrites the page's table
from the run instead). A row is recorded only after its assertions passed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                                reason="the service needs the server extra (pip install -e '.[server]')")

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.server.testing import RunningService, running_service

DOC = Path(__file__).resolve().parents[1] / "docs" / "service.md"
BEGIN, END = "<!-- parity-table:begin -->", "<!-- parity-table:end -->"
ROWS: dict[tuple[str, str], tuple[str, str]] = {}
"""(client, method) -> (result, how it was checked)."""
EXPECTED_GROUPS = ("e2b sync", "e2b async", "swe-rex")


def row(client: str, method: str, result: str, note: str) -> None:
    assert result in ("works", "refused")
    ROWS[(client, method)] = (result, note)


def refused(err: BaseException, feature: str) -> None:
    text = str(err)
    assert "not supported by sandfleet" in text and feature in text, text


def table() -> str:
    lines = ["| client | method | result | checked by the test |", "|---|---|---|---|"]
    order = {g: i for i, g in enumerate(EXPECTED_GROUPS)}
    for (client, method), (result, note) in sorted(ROWS.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        lines.append(f"| {client} | `{method}` | {result} | {note} |")
    works = sum(1 for r, _ in ROWS.values() if r == "works")
    lines.append("")
    lines.append(f"{works} of {len(ROWS)} rows work ({100 * works / len(ROWS):.0f} %); "
                 f"{len(ROWS) - works} are refused with \"not supported by sandfleet\".")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    with running_service(tmp_path_factory.mktemp("parity"), args=["--max-ttl", "900", "--max-busy", "2",
                                                                  "--swerex-max-output", "64"]) as s:
        yield s


@pytest.fixture(scope="module", autouse=True)
def coverage_table() -> Iterator[None]:
    ROWS.clear()
    yield
    if {c for c, _ in ROWS} != set(EXPECTED_GROUPS):
        return  # a partial run (-k): nothing to compare
    text = table()
    doc = DOC.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    if os.environ.get("SANDFLEET_WRITE_COVERAGE") == "1":
        DOC.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])
        return
    assert doc[start:end].strip() == text.strip(), (
        "docs/service.md's parity table differs from this run: SANDFLEET_WRITE_COVERAGE=1 pytest "
        "tests/test_e2b_parity.py rewrites it")


@pytest.fixture
def e2b_env(svc: RunningService, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {"E2B_API_URL": svc.url, "E2B_SANDBOX_URL": svc.url, "E2B_API_KEY": svc.token}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    return env


def _until(pred: Any, what: str, timeout: float = 20.0) -> Any:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


S = "e2b sync"


def test_sync_sandbox(e2b_env: dict[str, str], svc: RunningService) -> None:
    from e2b import Sandbox
    from e2b.exceptions import FileNotFoundException, SandboxException

    sbx = Sandbox.create(envs={"GREETING": "hi"}, metadata={"suite": "parity"}, timeout=300)
    row(S, "Sandbox.create", "works", "envs on every process, metadata, timeout")
    try:
        assert sbx.is_running()
        row(S, "Sandbox.is_running", "works", "True while alive, False after kill")
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id and info.metadata == {"suite": "parity"}
        row(S, "Sandbox.get_info", "works", "id, metadata, state")
        sbx.set_timeout(600)
        row(S, "Sandbox.set_timeout", "works", "the TTL moves")
        other = Sandbox.connect(sbx.sandbox_id)
        assert other.commands.run("echo $GREETING").stdout == "hi\n"
        assert sbx.connect().sandbox_id == sbx.sandbox_id
        row(S, "Sandbox.connect", "works", "class and instance method")
        assert sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]
        row(S, "Sandbox.list", "works", "a paginator; metadata filter (test_e2b.py)")
        # users: E2B's `user` with HOME /home/user; root with HOME /root
        r = sbx.commands.run("whoami; echo $HOME; id -u")
        assert r.stdout.split() == ["user", "/home/user", "1000"]
        r = sbx.commands.run("whoami; echo $HOME; cd && pwd", user="root")
        assert r.stdout.split() == ["root", "/root", "/root"]
        row(S, "Sandbox (users)", "works", "default `user` (uid 1000, HOME /home/user); `root` with HOME /root")
        m = sbx.get_metrics()
        assert len(m) == 1 and m[0].mem_used > 0 and m[0].cpu_count >= 1 and m[0].disk_total > 0
        row(S, "Sandbox.get_metrics", "works", "from the sandbox's cgroups (CPU, memory) and df (disk)")
        for name, call in (("pause", sbx.pause), ("beta_pause", sbx.beta_pause)):
            with pytest.raises(SandboxException) as ei:
                call()
            refused(ei.value, "pause")
            row(S, f"Sandbox.{name}", "refused", "501: no pause/resume under one id; snapshots keep the files")
        with pytest.raises(SandboxException) as ei:
            sbx.update_network({"deny_out": ["0.0.0.0/0"]})
        refused(ei.value, "update_network")
        row(S, "Sandbox.update_network", "refused", "501: the network is chosen at create")
        # snapshots: a snapshot's id is a template
        sbx.files.write("/home/user/kept.txt", "kept")
        snap = sbx.create_snapshot()
        assert snap.snapshot_id
        row(S, "Sandbox.create_snapshot", "works", "a sandfleet snapshot; its id is a template")
        ids = [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
        assert snap.snapshot_id in ids
        row(S, "Sandbox.list_snapshots", "works", "this token's snapshots")
        child = Sandbox.create(template=snap.snapshot_id, timeout=120)
        try:
            assert child.files.read("/home/user/kept.txt") == "kept"
        finally:
            child.kill()
        row(S, "Sandbox.create (template=snapshot)", "works", "a sandbox from the snapshot has its files")
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
        assert Sandbox.delete_snapshot(snap.snapshot_id) is False
        row(S, "Sandbox.delete_snapshot", "works", "True, then False")
        kids = sbx.fork(count=2)
        assert len(kids) == 2 and all(isinstance(k, Sandbox) for k in kids), kids
        try:
            for k in kids:
                assert k.files.read("/home/user/kept.txt") == "kept" and k.sandbox_id != sbx.sandbox_id
        finally:
            for k in kids:
                k.kill()
        row(S, "Sandbox.fork", "works", "children start from the parent's files")
        # ports through the service, behind the traffic token
        sbx.commands.run("python3 -m http.server 8000 --bind 127.0.0.1 -d /home/user", background=True)
        host = sbx.get_host(8000)
        resp = _until(lambda: _get(f"http://{host}/kept.txt"), "the sandbox's web server")
        assert resp.status_code == 200 and resp.text == "kept"
        bad = re.sub(r":[^@]+@", ":wrong@", host)
        assert httpx.get(f"http://{bad}/kept.txt", timeout=30).status_code == 401
        ifaces = sbx.commands.run("tail -n +3 /proc/net/dev | cut -d: -f1").stdout.split()
        assert ifaces == ["lo"], ifaces  # the sandbox still has no network but its loopback
        row(S, "Sandbox.get_host", "works", "http://<get_host(port)> reaches the port through the service; "
                                            "a wrong token is 401; the sandbox still has only `lo`")
        # signed file URLs, on the service's own address
        url = sbx.download_url("/home/user/kept.txt")
        assert httpx.get(url, timeout=30).content == b"kept"
        assert httpx.get(url.replace("signature=v1_", "signature=v1_x"), timeout=30).status_code == 401
        row(S, "Sandbox.download_url", "works", "a signed URL; a wrong signature is 401")
        up = sbx.upload_url("/home/user/up.txt")
        assert httpx.post(up, files={"file": ("up.txt", b"uploaded")}, timeout=30).status_code == 200
        assert sbx.files.read("/home/user/up.txt") == "uploaded"
        row(S, "Sandbox.upload_url", "works", "multipart POST to the signed URL")
        with pytest.raises(SandboxException) as ei:
            Sandbox.create(mcp={"exa": {"apiKey": "x"}}, timeout=60)
        refused(ei.value, "MCP")
        with pytest.raises(FileNotFoundException):
            sbx.get_mcp_token()  # as on E2B for a sandbox made without mcp=
        row(S, "Sandbox.create (mcp=...)", "refused", "501: no MCP gateway (so get_mcp_url/get_mcp_token name none)")
        sbx.git.init("/home/user/repo")
        st = sbx.git.status("/home/user/repo")
        assert st is not None and not st.file_status
        row(S, "Sandbox.git", "works", "git.init and git.status run git in the sandbox")
    finally:
        assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False and not sbx.is_running()
    row(S, "Sandbox.kill", "works", "instance and class method; False for a gone sandbox")


def _get(url: str) -> httpx.Response | None:
    try:
        r = httpx.get(url, timeout=30)
    except httpx.HTTPError:
        return None
    return r if r.status_code == 200 else None
