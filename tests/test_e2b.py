"""The real, unmodified ``e2b`` SDK (sync and async) against a real ``sandfleet serve`` on
loopback, through E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import ssl
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                                reason="the service needs the server extra (pip install -e '.[server]')")

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.server.testing import RunningService


@pytest.fixture(scope="module")
def svc(running_services: Any) -> RunningService:
    """The session's shared service, with two tokens of this module's own (tests/conftest.py)."""
    return running_services.view("--max-ttl", "900")


@pytest.fixture
def e2b_env(svc: RunningService, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {"E2B_API_URL": svc.url, "E2B_SANDBOX_URL": svc.url, "E2B_API_KEY": svc.token}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    return env


def test_sync_sdk(e2b_env: dict[str, str], svc: RunningService) -> None:
    from e2b import Sandbox
    from e2b.exceptions import NotFoundException, SandboxException
    from e2b.sandbox.commands.command_handle import CommandExitException

    sbx = Sandbox.create(envs={"GREETING": "hello"}, metadata={"suite": "sync"}, timeout=120)
    try:
        # foreground, envVars on every process, the base template's home and user
        r = sbx.commands.run('echo "$GREETING"; echo err >&2; pwd; echo $HOME')
        assert r.exit_code == 0
        assert r.stdout.split() == ["hello", "/home/user", "/home/user"]
        assert r.stderr == "err\n"
        # non-zero exit
        with pytest.raises(CommandExitException) as ei:
            sbx.commands.run("echo out; exit 3")
        assert ei.value.exit_code == 3 and ei.value.stdout == "out\n"
        # streaming callbacks
        seen: list[str] = []
        sbx.commands.run("for i in 1 2 3; do echo line$i; done", on_stdout=seen.append)
        assert "".join(seen) == "line1\nline2\nline3\n"
        # background + kill
        h = sbx.commands.run("echo started; sleep 60", background=True)
        assert h.pid > 0
        assert h.kill() is True
        with pytest.raises(CommandExitException) as ei:
            h.wait()
        assert ei.value.exit_code == -1
        assert sbx.commands.kill(h.pid) is False
        # background output is buffered, read later
        h = sbx.commands.run("echo bg-out; echo bg-err >&2", background=True)
        res = h.wait()
        assert (res.stdout, res.stderr, res.exit_code) == ("bg-out\n", "bg-err\n", 0)
        # files
        info = sbx.files.write("/home/user/dir/a.txt", "alpha")
        assert info.path == "/home/user/dir/a.txt"
        sbx.files.write("b.bin", b"\x00\x01\xff")
        assert sbx.files.read("/home/user/dir/a.txt") == "alpha"
        assert sbx.files.read("b.bin", format="bytes") == b"\x00\x01\xff"
        sbx.files.write("big.txt", "x" * 100_000)
        assert len(sbx.files.read("big.txt")) == 100_000
        names = {e.name: e for e in sbx.files.list("/home/user")}
        assert {"dir", "b.bin", "big.txt"} <= set(names)
        assert names["dir"].type.value == "dir" and names["b.bin"].size == 3
        with pytest.raises(NotFoundException):
            sbx.files.read("/home/user/missing.txt")
        with pytest.raises(NotFoundException):
            sbx.files.list("/home/user/no-such-dir")
        assert sbx.files.exists("b.bin") and not sbx.files.exists("nope")
        # control plane
        sbx.set_timeout(300)
        gi = sbx.get_info()
        assert gi.sandbox_id == sbx.sandbox_id and gi.metadata == {"suite": "sync"}
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.commands.run("echo $GREETING").stdout == "hello\n"
        listed = Sandbox.list()
        ids = [s.sandbox_id for s in listed.next_items()]
        assert sbx.sandbox_id in ids
        assert sbx.is_running()
    finally:
        assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(SandboxException):
        sbx.commands.run("true")
    assert not sbx.is_running()


def test_list_pages(e2b_env: dict[str, str]) -> None:
    from e2b import Sandbox, SandboxQuery

    boxes = [Sandbox.create(metadata={"suite": "pages"}, timeout=60) for _ in range(3)]
    try:
        pager = Sandbox.list(query=SandboxQuery(metadata={"suite": "pages"}), limit=2)
        got: list[str] = []
        pages = 0
        while pager.has_next:
            got += [s.sandbox_id for s in pager.next_items()]
            pages += 1
        assert pages == 2 and sorted(got) == sorted(b.sandbox_id for b in boxes)
    finally:
        for b in boxes:
            b.kill()


def test_async_sdk(e2b_env: dict[str, str]) -> None:
    from e2b import AsyncSandbox
    from e2b.exceptions import NotFoundException, SandboxException
    from e2b.sandbox.commands.command_handle import CommandExitException

    async def main() -> None:
        sbx = await AsyncSandbox.create(envs={"GREETING": "hi"}, timeout=120)
        try:
            r = await sbx.commands.run('echo "$GREETING"')
            assert r.stdout == "hi\n"
            with pytest.raises(CommandExitException) as ei:
                await sbx.commands.run("exit 5")
            assert ei.value.exit_code == 5
            seen: list[str] = []
            await sbx.commands.run("echo a; echo b", on_stdout=seen.append)
            assert "".join(seen) == "a\nb\n"
            h = await sbx.commands.run("sleep 60", background=True)
            assert await h.kill() is True
            with pytest.raises(CommandExitException):
                await h.wait()
            await sbx.files.write("/home/user/x.txt", "async")
            assert await sbx.files.read("/home/user/x.txt") == "async"
            assert "x.txt" in {e.name for e in await sbx.files.list("/home/user")}
            with pytest.raises(NotFoundException):
                await sbx.files.read("/home/user/missing")
            await sbx.set_timeout(200)
            assert (await sbx.get_info()).sandbox_id == sbx.sandbox_id
            again = await AsyncSandbox.connect(sbx.sandbox_id)
            assert (await again.commands.run("echo ok")).stdout == "ok\n"
            pager = AsyncSandbox.list()
            assert sbx.sandbox_id in [s.sandbox_id for s in await pager.next_items()]
        finally:
            assert await sbx.kill() is True
        assert await AsyncSandbox.kill(sbx.sandbox_id) is False
        with pytest.raises(SandboxException):
            await sbx.commands.run("true")

    asyncio.run(main())


def test_errors_and_schema(svc: RunningService) -> None:
    with httpx.Client(base_url=svc.url, timeout=30) as h:
        r = h.post("/v2/sandboxes", json={"templateID": "base"})
        assert r.status_code == 401 and r.json()["code"] == 401
        r = h.post("/v2/sandboxes", json={"templateID": "no-such-image"}, headers={"X-API-Key": svc.token})
        assert r.status_code == 400 and isinstance(r.json()["code"], int)
        # the body through its model (e2b/models.py): a wrongly typed field is a 400 naming it (a 500 before)
        for bad, field in (({"metadata": ["a"]}, "metadata"), ({"envVars": "x"}, "envVars"),
                           ({"timeout": "soon"}, "timeout")):
            r = h.post("/v2/sandboxes", json=bad, headers={"X-API-Key": svc.token})
            assert r.status_code == 400 and r.json()["message"].startswith(f"invalid sandbox: {field}:"), r.text
        r = h.get("/sandboxes/nope", headers={"X-API-Key": svc.token})
        assert r.status_code == 404 and r.json() == {"code": 404, "message": r.json()["message"]}
        r = h.get("/health", headers={"E2b-Sandbox-Id": "nope"})
        assert r.status_code == 502 and "was not found" in r.json()["message"]
        r = h.post("/v2/sandboxes", json={}, headers={"X-API-Key": svc.token})
        assert r.status_code == 201, r.text
        body: dict[str, Any] = r.json()
        assert body["envdVersion"] == "0.6.4"
        hdr = {"E2b-Sandbox-Id": body["sandboxID"]}
        assert h.get("/health", headers={**hdr, "X-Access-Token": "wrong"}).status_code == 401
        assert h.get("/health", headers={**hdr, "X-Access-Token": body["envdAccessToken"]}).status_code == 204
        # another token's sandbox is not reachable through the control plane
        assert h.get(f"/sandboxes/{body['sandboxID']}", headers={"X-API-Key": svc.tokens[1]}).status_code == 404
        assert h.delete(f"/sandboxes/{body['sandboxID']}", headers={"X-API-Key": svc.token}).status_code == 204
        paths = h.get("/openapi.json").json()["paths"]
        assert paths and all(p.startswith("/v1/") or p == "/healthz" for p in paths)


def test_sdk_details(e2b_env: dict[str, str], svc: RunningService) -> None:
    """Uploads of every encoding, command timeouts, users, unread background output, a /v1
    sandbox reached through connect, and nothing left on the host after kill."""
    import io

    from e2b import Sandbox
    from e2b.exceptions import TimeoutException
    from e2b.sandbox.commands.command_handle import CommandExitException
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    from sandfleet.server.testing import leftovers

    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    try:
        sbx.files.write("/home/user/gz.txt", "zipped " * 1000, gzip=True)
        assert sbx.files.read("/home/user/gz.txt") == "zipped " * 1000
        sbx.files.write("/home/user/stream.bin", io.BytesIO(b"\x01" * 70_000))
        assert sbx.files.read("/home/user/stream.bin", format="bytes") == b"\x01" * 70_000
        sbx.files.write("/home/user/oct.txt", "octet", use_octet_stream=True)
        assert sbx.files.read("/home/user/oct.txt") == "octet"
        infos = sbx.files.write_files([WriteEntry(path="/home/user/m/one.txt", data="1"),
                                       WriteEntry(path="/home/user/m/sub/two.txt", data=b"2")])
        assert sorted(i.path for i in infos) == ["/home/user/m/one.txt", "/home/user/m/sub/two.txt"]
        assert sbx.files.read("/home/user/m/sub/two.txt") == "2"
        # the E2B user is the sandbox's user; root is root
        assert sbx.commands.run("id -u").stdout.strip() != "0"
        assert sbx.commands.run("id -u", user="root").stdout.strip() == "0"
        assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
        assert sbx.commands.run("echo $X", envs={"X": "per-command"}).stdout == "per-command\n"
        # the command's timeout (Connect-Timeout-Ms) kills it
        t = time.monotonic()
        with pytest.raises((TimeoutException, CommandExitException)):
            sbx.commands.run("sleep 30", timeout=1)
        assert time.monotonic() - t < 15
        # a background command nobody reads is not blocked by its output
        h = sbx.commands.run("head -c 3000000 /dev/zero | tr '\\0' a; echo done > /tmp/bg-done", background=True)
        deadline = time.monotonic() + 30
        while sbx.commands.run("cat /tmp/bg-done 2>/dev/null || true").stdout != "done\n":
            assert time.monotonic() < deadline, "the background command was blocked by its unread output"
            time.sleep(0.2)
        assert len(h.wait().stdout) == 3_000_000
    finally:
        sbx.kill()
    deadline = time.monotonic() + 20
    while leftovers([sid]):
        assert time.monotonic() < deadline, leftovers([sid])
        time.sleep(0.2)
    # a sandbox made through /v1 is reachable through E2B's connect
    r = httpx.post(f"{svc.url}/v1/sandboxes", json={"limits": {"ttl_s": 120}},
                   headers={"Authorization": f"Bearer {svc.token}"}, timeout=60)
    assert r.status_code == 201
    v1 = Sandbox.connect(r.json()["id"])
    assert v1.commands.run("echo via-v1").stdout == "via-v1\n"
    assert v1.kill() is True


def test_raw_envd_stream_and_disconnect(svc: RunningService) -> None:
    """The wire format of Process/Start (exact content type, 5-byte envelopes, end of stream),
    and a client that hangs up after the start event does not kill the process."""
    import json
    import struct

    def frame(msg: dict[str, Any]) -> bytes:
        data = json.dumps(msg).encode()
        return struct.pack(">BI", 0, len(data)) + data

    with httpx.Client(base_url=svc.url, timeout=30) as h:
        body = h.post("/v2/sandboxes", json={"templateID": "base", "envVars": {"V": "1"}},
                      headers={"X-API-Key": svc.token}).json()
        hdr = {"E2b-Sandbox-Id": body["sandboxID"], "X-Access-Token": body["envdAccessToken"],
               "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
        req = frame({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo $V; exit 7"]}, "stdin": False})
        r = h.post("/process.Process/Start", content=req, headers=hdr)
        assert r.status_code == 200 and r.headers["content-type"] == "application/connect+json"
        raw, msgs = r.content, []
        while raw:
            flags, n = struct.unpack(">BI", raw[:5])
            msgs.append((flags, json.loads(raw[5:5 + n])))
            raw = raw[5 + n:]
        assert "start" in msgs[0][1]["event"]
        assert base64_out(msgs) == "1\n"
        assert msgs[-2][1]["event"]["end"] == {"exitCode": 7, "exited": True, "status": "exit status 7"}
        assert msgs[-1] == (2, {})
        # hang up after the start event: the process runs on
        req = frame({"process": {"cmd": "/bin/bash", "args": ["-c", "sleep 1; echo survived > /tmp/flag"]}})
        with h.stream("POST", "/process.Process/Start", content=req, headers=hdr) as s:
            next(s.iter_raw())
        time.sleep(2.5)
        got = h.get("/files", params={"path": "/tmp/flag"}, headers=hdr)
        assert got.status_code == 200 and got.text == "survived\n"
        h.delete(f"/sandboxes/{body['sandboxID']}", headers={"X-API-Key": svc.token})


def base64_out(msgs: list[tuple[int, dict[str, Any]]]) -> str:
    import base64

    return "".join(base64.b64decode(m["event"]["data"]["stdout"]).decode()
                   for f, m in msgs if f == 0 and "data" in m.get("event", {}) and "stdout" in m["event"]["data"])


def test_forgotten_sandbox_url_is_named(svc: RunningService, monkeypatch: pytest.MonkeyPatch) -> None:
    """E2B_API_URL without E2B_SANDBOX_URL: create works, the SDK then sends envd calls to
    https://<port>-<id>.<domain>; its error quotes that URL, whose host name names the variable."""
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    monkeypatch.setenv("E2B_API_URL", svc.url)
    monkeypatch.setenv("E2B_API_KEY", svc.token)
    for k in ("E2B_SANDBOX_URL", "E2B_DEBUG", "E2B_DOMAIN"):
        monkeypatch.delenv(k, raising=False)
    sbx = Sandbox.create(timeout=60)
    try:
        with pytest.raises(SandboxException) as ei:
            sbx.commands.run("true")
        assert "set-e2b_sandbox_url" in str(ei.value).lower()  # a host name's label: lowercased in the URL
        with pytest.raises(Exception) as fe:
            sbx.files.read("/etc/hostname")
        assert "set-e2b_sandbox_url" in str(fe.value).lower(), repr(fe.value)
    finally:
        sbx.kill()


@pytest.mark.waits  # 12 s of wall, 11.5 of them a sleep for the samples (scripts/test.sh: a lane of its own)
def test_metrics_are_a_series(e2b_env: dict[str, str]) -> None:
    """get_metrics: one sample every 5 s over the sandbox's life (E2B's), start/end filter it."""
    import datetime as dt

    from e2b import Sandbox

    sbx = Sandbox.create(timeout=120)
    try:
        sbx.commands.run("head -c 20000000 /dev/zero > /tmp/fill")
        time.sleep(11.5)
        m = sbx.get_metrics()
        assert len(m) >= 2, m
        stamps = [x.timestamp.timestamp() for x in m]
        assert stamps == sorted(stamps)
        assert all(4 <= b - a <= 7 for a, b in zip(stamps, stamps[1:], strict=False)), stamps
        assert all(x.mem_used > 0 and x.disk_total > 0 for x in m)
        late = sbx.get_metrics(start=dt.datetime.fromtimestamp(stamps[-1], dt.UTC))
        assert 1 <= len(late) < len(m)
        early = sbx.get_metrics(end=dt.datetime.fromtimestamp(stamps[0], dt.UTC))
        assert [x.timestamp for x in early] == [m[0].timestamp]
    finally:
        sbx.kill()


def _curl(url: str, *args: str) -> tuple[int, str]:
    """(status, body) of a GET by curl, which resolves *.localhost to loopback itself (this
    host's resolver does not, so Python's clients can't)."""
    r = subprocess.run(["curl", "-sS", "--max-time", "30", "--noproxy", "*", "-w", "\n%{http_code}", *args, url],
                       capture_output=True, text=True, timeout=60)
    body, _, code = r.stdout.rpartition("\n")
    return int(code or 0), body if r.returncode == 0 else r.stderr


def _curl_until(url: str, *args: str) -> tuple[int, str]:
    """:func:`_curl` until the sandbox's web server answers (20 s at most)."""
    deadline = time.monotonic() + 20
    while True:
        got = _curl(url, *args)
        if got[0] != 502 and got[0] != 0 or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def _ifaces(sbx: Any) -> list[str]:
    out: str = sbx.commands.run("tail -n +3 /proc/net/dev | cut -d: -f1").stdout
    return out.split()


def test_internet_by_default_and_off_when_asked(e2b_env: dict[str, str], svc: RunningService) -> None:
    """E2B's default: a create that does not set allow_internet_access has the internet (a
    network device beside lo); allow_internet_access=False has only lo, and get_host still
    reaches its ports (the service relays inside the sandbox's own namespace)."""
    from e2b import Sandbox

    on = Sandbox.create(timeout=60)
    off = Sandbox.create(timeout=60, allow_internet_access=False)
    try:
        assert "lo" in _ifaces(on) and len(_ifaces(on)) > 1, _ifaces(on)
        assert _ifaces(off) == ["lo"]
        off.files.write("/home/user/here.txt", "here")
        off.commands.run("python3 -m http.server 8001 --bind 127.0.0.1 -d /home/user", background=True)
        assert _curl_until(f"http://{off.get_host(8001)}/here.txt") == (200, "here")
    finally:
        on.kill()
        off.kill()


def test_serve_without_e2b_internet(running_services: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """serve --no-e2b-internet: a create that does not say has no network; one that asks has it."""
    from e2b import Sandbox

    svc = running_services.view("--max-ttl", "900", "--no-e2b-internet")
    for k, v in {"E2B_API_URL": svc.url, "E2B_SANDBOX_URL": svc.url, "E2B_API_KEY": svc.token}.items():
        monkeypatch.setenv(k, v)
    for k in ("E2B_DEBUG", "E2B_DOMAIN"):
        monkeypatch.delenv(k, raising=False)
    quiet = Sandbox.create(timeout=60)
    asked = Sandbox.create(timeout=60, allow_internet_access=True)
    try:
        assert _ifaces(quiet) == ["lo"]
        assert len(_ifaces(asked)) > 1, _ifaces(asked)
    finally:
        quiet.kill()
        asked.kill()


def test_file_metadata_and_watch_entries(e2b_env: dict[str, str]) -> None:
    """envd 0.6.2's file metadata (user.e2b.* attributes: written, listed, stat'ed, renamed,
    set out of band) and 0.6.3's watch events with their entry: the SDK refused both while
    sandfleet advertised 0.5.7."""
    from e2b import FileType, InvalidArgumentException, Sandbox

    sbx = Sandbox.create(timeout=120)
    try:
        w = sbx.files.write("/home/user/m/a.txt", "a", metadata={"Owner": "alice", "stage": "2"})
        assert w.metadata == {"owner": "alice", "stage": "2"}
        assert sbx.files.get_info("/home/user/m/a.txt").metadata == {"owner": "alice", "stage": "2"}
        listed = {x.name: x.metadata for x in sbx.files.list("/home/user/m")}
        assert listed == {"a.txt": {"owner": "alice", "stage": "2"}}
        moved = sbx.files.rename("/home/user/m/a.txt", "/home/user/m/b.txt")
        assert moved.metadata == {"owner": "alice", "stage": "2"}
        sbx.files.write("/home/user/m/plain.txt", "p")
        assert sbx.files.get_info("/home/user/m/plain.txt").metadata is None
        sbx.commands.run("python3 -c \"import os; os.setxattr('/home/user/m/plain.txt', 'user.e2b.by', b'hand')\"")
        assert sbx.files.get_info("/home/user/m/plain.txt").metadata == {"by": "hand"}
        with pytest.raises(InvalidArgumentException):
            sbx.files.write("/home/user/m/c.txt", "c", metadata={"bad key": "x"})
        # watch events with their entry (include_entry)
        handle = sbx.files.watch_dir("/home/user/m", include_entry=True)
        try:
            sbx.files.write("/home/user/m/new.txt", "12345", metadata={"k": "v"})
            deadline = time.monotonic() + 20
            seen: list[Any] = []
            while not any(ev.name == "new.txt" and ev.entry is not None for ev in seen):
                assert time.monotonic() < deadline, seen
                time.sleep(0.3)
                seen += handle.get_new_events()
            ev = next(ev for ev in seen if ev.name == "new.txt" and ev.entry is not None)
            assert ev.entry.type == FileType.FILE and ev.entry.size == 5, ev
            assert ev.entry.path == "/home/user/m/new.txt"
        finally:
            handle.stop()
    finally:
        sbx.kill()


def test_get_host_is_a_localhost_name_on_loopback(e2b_env: dict[str, str], svc: RunningService) -> None:
    """On loopback get_host(port) is <port>-<id>.set-E2B_SANDBOX_URL.localhost:<service port>:
    a host name curl and browsers resolve to loopback, routed by the Host header; public by
    default (E2B's allowPublicTraffic), a wrong token is still 401; a sandbox created with
    allow_public_traffic=False needs its token in e2b-traffic-access-token."""
    from e2b import Sandbox

    port = svc.url.rsplit(":", 1)[1]
    sbx = Sandbox.create(timeout=120)
    closed = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    try:
        for s in (sbx, closed):
            s.files.write("/home/user/here.txt", s.sandbox_id)
            s.commands.run("python3 -m http.server 8002 --bind 127.0.0.1 -d /home/user", background=True)
        host = sbx.get_host(8002)
        assert host == f"8002-{sbx.sandbox_id}.set-E2B_SANDBOX_URL.localhost:{port}", host
        assert _curl_until(f"http://{host}/here.txt") == (200, sbx.sandbox_id)
        assert _curl(f"http://{host}/here.txt", "-H", "e2b-traffic-access-token: wrong")[0] == 401
        shut = closed.get_host(8002)
        assert _curl_until(f"http://{shut}/here.txt")[0] == 401
        token = f"e2b-traffic-access-token: {closed.traffic_access_token}"
        # (its own server may come up later than the first's: a 401 without the token says nothing of it)
        assert _curl_until(f"http://{shut}/here.txt", "-H", token) == (200, closed.sandbox_id)
    finally:
        sbx.kill()
        closed.kill()


def test_serve_domain_routes_by_host_name(running_services: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """serve --domain DOMAIN: get_host is <port>-<id>.set-E2B_SANDBOX_URL.DOMAIN:<port> (curl
    --resolve stands in for the wildcard DNS record), and envd's own port by host name is the
    service's envd (what the SDK calls when E2B_SANDBOX_URL is not set, over HTTPS)."""
    from e2b import Sandbox

    svc = running_services.view("--max-ttl", "900", "--domain", "sandfleet.test")
    port = svc.url.rsplit(":", 1)[1]
    for k, v in {"E2B_API_URL": svc.url, "E2B_SANDBOX_URL": svc.url, "E2B_API_KEY": svc.token}.items():
        monkeypatch.setenv(k, v)
    for k in ("E2B_DEBUG", "E2B_DOMAIN"):
        monkeypatch.delenv(k, raising=False)
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/here.txt", "by name")
        sbx.commands.run("python3 -m http.server 8003 --bind 127.0.0.1 -d /home/user", background=True)
        host = sbx.get_host(8003)
        name = host.rsplit(":", 1)[0]
        assert name == f"8003-{sbx.sandbox_id}.set-E2B_SANDBOX_URL.sandfleet.test", host
        resolve = ["--resolve", f"{name}:{port}:127.0.0.1"]
        assert _curl_until(f"http://{host}/here.txt", *resolve) == (200, "by name")
        envd = f"49983-{sbx.sandbox_id}.sandfleet.test"
        r = httpx.get(f"{svc.url}/health", headers={"Host": f"{envd}:{port}", "X-Access-Token": "wrong"}, timeout=30)
        assert r.status_code == 401, r.text  # envd's own check, not a relay into the sandbox
        other = httpx.get(f"{svc.url}/here.txt", headers={"Host": f"8003-{sbx.sandbox_id}.elsewhere.test"}, timeout=30)
        assert other.status_code == 404  # a name outside --domain is the service's own request
    finally:
        sbx.kill()


def test_serve_domain_over_https_routes_by_host_name(running_services: Any, tmp_path: Any) -> None:
    """serve --domain DOMAIN behind --ssl-certfile (a wildcard certificate for *.DOMAIN, from a CA
    the client trusts by SSL_CERT_FILE): the SDK creates over HTTPS; get_host is <port>-<id>.DOMAIN
    (no set-E2B_SANDBOX_URL label over HTTPS) and reaches the port over TLS by host name, and envd's
    own port by name is the service's envd (curl --resolve stands in for the wildcard DNS record:
    the SDK's own transport resolves names itself, so its envd calls here go to E2B_SANDBOX_URL)."""
    ca, ca_key, cert, key = (tmp_path / n for n in ("ca.pem", "ca.key", "cert.pem", "key.pem"))
    csr, ext = tmp_path / "cert.csr", tmp_path / "ext.cnf"
    ext.write_text("subjectAltName=DNS:*.sandfleet.test,DNS:sandfleet.test,IP:127.0.0.1\n"
                   "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    for argv in (  # a CA of the test's, and a wildcard certificate it signs (rustls refuses a CA as a leaf)
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "1",
             "-subj", "/CN=sandfleet test CA"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=sandfleet.test"],
            ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "1",
             "-extfile", ext]):
        subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True)
    svc = running_services.view("--max-ttl", "900", "--domain", "sandfleet.test", "--ssl-certfile", str(cert),
                                "--ssl-keyfile", str(key))
    assert svc.url.startswith("https://127.0.0.1:"), svc.url
    port = svc.url.rsplit(":", 1)[1]
    env = {**os.environ, "E2B_API_URL": svc.url, "E2B_SANDBOX_URL": svc.url, "E2B_API_KEY": svc.token,
           "SSL_CERT_FILE": str(ca)}
    for k in ("E2B_DEBUG", "E2B_DOMAIN"):
        env.pop(k, None)
    # the SDK in a process of its own: its transport keeps the trust store of the first client it made
    # (another test's, without this CA, when the module shares a process)
    made = subprocess.run([sys.executable, "-c", TLS_CLIENT], env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-3000:]
    sbx = json.loads(made.stdout.strip().splitlines()[-1])
    try:
        host = sbx["host"]
        assert host == f"8004-{sbx['id']}.sandfleet.test:{port}", host
        trust = ["--cacert", str(ca)]
        name = host.rsplit(":", 1)[0]
        got = _curl_until(f"https://{host}/here.txt", "--resolve", f"{name}:{port}:127.0.0.1", *trust)
        assert got == (200, "over tls"), got
        envd = f"49983-{sbx['id']}.sandfleet.test"
        resolve = ["--resolve", f"{envd}:{port}:127.0.0.1", *trust]
        assert _curl(f"https://{envd}:{port}/health", *resolve)[0] == 401  # the service's envd's own check
        token = ["-H", f"X-Access-Token: {sbx['token']}"]
        got = _curl(f"https://{envd}:{port}/files?path=/home/user/here.txt", *resolve, *token)
        assert got == (200, "over tls"), got  # envd by name, over TLS
    finally:
        httpx.delete(f"{svc.url}/sandboxes/{sbx['id']}", headers={"X-API-Key": svc.token},
                     verify=ssl.create_default_context(cafile=str(ca)), timeout=60)


TLS_CLIENT = """
import json
from e2b import Sandbox
sbx = Sandbox.create(timeout=120)
sbx.files.write("/home/user/here.txt", "over tls")
sbx.commands.run("python3 -m http.server 8004 --bind 127.0.0.1 -d /home/user", background=True)
print(json.dumps({"id": sbx.sandbox_id, "host": sbx.get_host(8004), "token": sbx._envd_access_token}))
"""


def test_create_snapshot_refuses_processes_it_cannot_keep(e2b_env: dict[str, str]) -> None:
    """E2B's snapshot keeps running processes; sandfleet's on bwrap keeps the filesystem: a
    sandbox with a process running is refused naming it, and snapshots once it is stopped."""
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    sbx = Sandbox.create(timeout=120)
    try:
        h = sbx.commands.run("exec sleep 300", background=True)
        # `bash -l` reads the profile (its `id -u` is a second process) before the exec: wait for
        # the sleep, so that the one process the refusal names is the one the test started
        sleeping = "for c in /proc/[0-9]*/comm; do [ \"$(cat $c 2>/dev/null)\" = sleep ] && echo yes; done; true"
        deadline = time.monotonic() + 10
        while "yes" not in sbx.commands.run(sleeping).stdout:
            assert time.monotonic() < deadline, "the background `sleep 300` never started"
            time.sleep(0.05)
        with pytest.raises(SandboxException) as ei:
            sbx.create_snapshot()
        msg = str(ei.value)
        assert "would not keep its 1 running process(es)" in msg and "sleep 300" in msg, msg
        assert "stop them first" in msg
        h.kill()
        deadline = time.monotonic() + 10
        # until the sleep itself is gone: the command leaves the list once its kill is sent, and
        # on a loaded host the process was still there for the snapshot's check (a 409 naming it)
        while (sbx.commands.list() or "yes" in sbx.commands.run(sleeping).stdout) and time.monotonic() < deadline:
            time.sleep(0.1)
        snap = sbx.create_snapshot()
        assert snap.snapshot_id
        Sandbox.delete_snapshot(snap.snapshot_id)
    finally:
        sbx.kill()


def test_sudo_in_the_base_template_says_what_to_do_instead(e2b_env: dict[str, str]) -> None:
    """E2B's base image gives ``user`` passwordless sudo; a bwrap sandbox can't raise
    privileges (no_new_privs), so the template's sudo says so and names user="root"; as root
    it runs the command."""
    from e2b import Sandbox
    from e2b.sandbox.commands.command_handle import CommandExitException

    sbx = Sandbox.create(timeout=60)
    try:
        with pytest.raises(CommandExitException) as ei:
            sbx.commands.run("sudo whoami")
        assert ei.value.exit_code == 1 and ei.value.stdout == ""
        assert "not available in sandfleet's E2B sandboxes" in ei.value.stderr, ei.value.stderr
        assert 'user="root"' in ei.value.stderr
        assert sbx.commands.run("sudo -u root whoami", user="root").stdout == "root\n"
        assert sbx.commands.run("whoami; sudo -n -- id -u", user="root").stdout == "root\n0\n"
    finally:
        sbx.kill()
