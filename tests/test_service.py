"""The sandbox service through its HTTP API and its client, against a real ``sandfleet serve``
on loopback: auth and ownership, bad input of every kind, streaming and disconnects,
idempotency, labels and TTLs, sessions, files, archives, snapshots."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import io
import json
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandfleet.errors import AuthError, ConfigError, SandboxClosedError, ServiceError
from support import running, until

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                                reason="the service needs the server extra (pip install -e '.[server]')")

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.client import ServiceClient, connect
    from sandfleet.server.testing import RunningService, leftovers, running_service, start_service, write_tokens


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    with running_service(tmp_path_factory.mktemp("svc"), args=["--max-body-mib", "1", "--max-ttl", "900"]) as s:
        yield s


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def http(svc: RunningService) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=svc.url, headers=bearer(svc.token), timeout=60) as h:
        yield h


@pytest.fixture
async def client(svc: RunningService) -> AsyncIterator[ServiceClient]:
    async with await connect(svc.url, svc.token) as c:
        yield c


async def gauge(h: httpx.AsyncClient, name: str) -> float:
    text = (await h.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


# -- auth and ownership


async def test_missing_and_wrong_tokens_are_refused(svc: RunningService) -> None:
    async with httpx.AsyncClient(base_url=svc.url, timeout=30) as h:
        assert (await h.get("/healthz")).json() == {"ok": True, "draining": False}
        assert (await h.get("/openapi.json")).status_code == 200
        for headers in ({}, bearer("x" * 32), {"Authorization": "Basic " + svc.token}, {"Authorization": "Bearer"}):
            for method, path in (("GET", "/v1/info"), ("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"),
                                 ("GET", "/metrics"), ("POST", "/v1/sandboxes/x/exec")):
                r = await h.request(method, path, headers=headers, json={})
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.json()["code"] == "unauthorized" and r.headers["www-authenticate"] == "Bearer"
    with pytest.raises(AuthError):
        await connect(svc.url, "y" * 32)


async def test_another_tokens_sandbox_is_not_found(svc: RunningService) -> None:
    async with await connect(svc.url, svc.tokens[0]) as a, await connect(svc.url, svc.tokens[1]) as b:
        sb = await a.create_sandbox(ttl_s=120, labels={"who": "a"})
        try:
            async with httpx.AsyncClient(base_url=svc.url, headers=bearer(svc.tokens[1]), timeout=30) as hb:
                for method, path, body in (
                    ("GET", "", None), ("DELETE", "", None), ("POST", "/exec", {"cmd": ["true"]}),
                    ("GET", "/files?path=x", None), ("POST", "/snapshot", None), ("POST", "/ttl", {"ttl_s": 5}),
                    ("POST", "/kill", {"user": "agent"}), ("GET", "/archive?path=.", None),
                ):
                    r = await hb.request(method, f"/v1/sandboxes/{sb.id}{path}", json=body)
                    assert (r.status_code, r.json()["code"]) == (404, "sandbox_not_found"), (method, path, r.text)
                assert (await hb.delete("/v1/sandboxes", params={"all": "true"})).json() == {"deleted": []}
            assert [s["id"] for s in await b.find()] == []
            with pytest.raises(ServiceError) as err:
                await b.sandbox(sb.id)
            assert err.value.status == 404
            assert (await sb.exec("echo still-mine")).stdout == "still-mine\n"
            assert [s["id"] for s in await a.find({"who": "a"})] == [sb.id]
        finally:
            await sb.close()


def test_token_file_must_be_private_and_sane(tmp_path: Path) -> None:
    from sandfleet.server.auth import Tokens

    f = tmp_path / "tokens"
    write_tokens(f)
    f.chmod(0o644)
    r = subprocess.run([sys.executable, "-m", "sandfleet", "serve", "--port", "0", "--token-file", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "chmod 600" in r.stderr and "listening" not in r.stdout, r.stderr
    cases = [(0o640, None, "chmod 600"), (0o604, None, "chmod 600"), (0o600, "short\n", "at least 16"),
             (0o600, "# only a comment\n", "holds no token")]
    for mode, text, want in cases:
        write_tokens(f)
        if text is not None:
            f.write_text(text)
        f.chmod(mode)
        with pytest.raises(ConfigError, match=want):
            Tokens(f)
    (tmp_path / "link").symlink_to(f)
    with pytest.raises(ConfigError):
        Tokens(tmp_path / "link")  # not followed
    with pytest.raises(ConfigError, match="No such file"):
        Tokens(tmp_path / "missing")


async def test_sighup_rereads_the_token_file(tmp_path: Path) -> None:
    svc = start_service(tmp_path)
    try:
        old, gone = svc.tokens
        new = "n" * 8 + uuid.uuid4().hex
        f = tmp_path / "tokens"
        f.write_text(f"{old}\n{new}\n")
        svc.proc.send_signal(signal.SIGHUP)
        async with httpx.AsyncClient(base_url=svc.url, timeout=30) as h:

            async def status(token: str) -> int:
                return (await h.get("/v1/info", headers=bearer(token))).status_code

            end = time.monotonic() + 10
            while await status(new) != 200 and time.monotonic() < end:
                await asyncio.sleep(0.05)
            assert (await status(new), await status(old), await status(gone)) == (200, 200, 401)
            f.write_text("z" * 40 + "\n")
            f.chmod(0o644)  # a bad file is refused: the tokens in force stay
            svc.proc.send_signal(signal.SIGHUP)
            await asyncio.sleep(0.5)
            assert (await status(new), await status("z" * 40)) == (200, 401)
        assert "token file not reloaded" in svc.log
    finally:
        assert svc.stop() == 0


# -- bad input


def tar_of(*members: tuple[str, bytes | None, str | None], hard: bool = False) -> bytes:
    """(name, data or None, link target or None) -> an uncompressed tar (symlinks, or hard links)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.LNKTYPE if hard else tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(data or b"")
                tar.addfile(info, io.BytesIO(data or b""))
    return buf.getvalue()


async def test_bad_input_gets_a_4xx_and_leaks_nothing(svc: RunningService, http: httpx.AsyncClient) -> None:
    r = await http.post("/v1/sandboxes", json={"limits": {"ttl_s": 120}})
    assert r.status_code == 201
    sid = r.json()["id"]
    sbx = f"/v1/sandboxes/{sid}"
    big = b"x" * ((1 << 20) + 1)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b"y" * (600 << 10)

    json_headers = {"content-type": "application/json"}
    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        ("POST", "/v1/sandboxes", {"json": {"image": "no-such-image"}}, 400, "unknown_image"),
        ("POST", "/v1/sandboxes", {"json": {"image": ""}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"image": "../../etc"}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"limits": {"memory_mib": 10_000_000}}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"limits": {"cpus": 100_000}}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"limits": {"cpus": -1}}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"limits": {"ttl_s": 1e9}}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"limits": {"ttl_s": 5000}}}, 400, "invalid_request"),  # > --max-ttl
        ("POST", "/v1/sandboxes", {"json": {"limits": {"disk_mib": 16 << 20}}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"limits": {"pids": 0}}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"limits": {"network": True, "forward": [22]}}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"writable_dirs": ["/../../etc"]}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"root_dirs": ["/etc"]}}, 400, "invalid_request"),  # not writable
        ("POST", "/v1/sandboxes", {"json": {"workdir": "relative"}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"env": {"A=B": "c"}}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {"bogus": 1}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"content": b"{bad", "headers": json_headers}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"content": b"[1, 2]", "headers": json_headers}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {}, "headers": {"X-Deadline-Ms": "soon"}}, 400, "invalid_request"),
        ("POST", "/v1/sandboxes", {"json": {}, "headers": {"X-Deadline-Ms": "-5"}}, 400, "invalid_request"),
        ("GET", "/v1/sandboxes/sf-bwrap-000000000000", {}, 404, "sandbox_not_found"),
        ("POST", "/v1/sandboxes/%2e%2e/exec", {"json": {"cmd": ["true"]}}, 404, "sandbox_not_found"),
        ("POST", "/v1/snapshots/snap-nope/fork", {"json": {"n": 1}}, 404, "snapshot_not_found"),
        ("GET", "/v1/nothing-here", {}, 404, "not_found"),
        ("DELETE", "/v1/sandboxes", {}, 400, "invalid_request"),  # a bulk delete names labels or all=true
        ("GET", "/v1/sandboxes", {"params": {"label": "no-equals-sign"}}, 400, "invalid_request"),
        ("GET", f"{sbx}/files", {"params": {"path": "../../../../etc/passwd"}}, 400, "bad_path"),
        ("GET", f"{sbx}/files", {"params": {"path": "/../x"}}, 400, "bad_path"),
        ("GET", f"{sbx}/files", {"params": {"path": "missing.txt"}}, 422, "guest_error"),
        ("GET", f"{sbx}/files", {"params": {"path": "x", "user": "no such user!"}}, 400, "invalid_request"),
        ("PUT", f"{sbx}/files", {"params": {"path": "../../x"}, "content": b"x"}, 400, "bad_path"),
        ("PUT", f"{sbx}/files", {"params": {"path": "x", "mode": 99999}, "content": b"x"}, 400, "invalid_request"),
        ("PUT", f"{sbx}/files", {"params": {"path": "big"}, "content": big}, 413, "too_large"),
        ("PUT", f"{sbx}/files", {"params": {"path": "big"}, "content": chunks()}, 413, "too_large"),
        ("PUT", f"{sbx}/archive", {"params": {"path": "up"}, "content": big}, 413, "too_large"),
        ("PUT", f"{sbx}/archive", {"params": {"path": "up"}, "content": tar_of(("../evil", b"x", None))},
         400, "bad_path"),
        ("PUT", f"{sbx}/archive", {"params": {"path": "up"}, "content": tar_of(("h", None, "../../etc/passwd"),
                                                                                 hard=True)}, 400, "bad_path"),
        ("PUT", f"{sbx}/archive", {"params": {"path": "up"}, "content": tar_of(("l", None, "/etc"))}, 400, "bad_path"),
        ("PUT", f"{sbx}/archive", {"params": {"path": "up"}, "content": tar_of(("l", None, "../../.."))},
         400, "bad_path"),
        ("PUT", f"{sbx}/archive", {"params": {"path": "up"}, "content": b"not a tar"}, 400, "invalid_request"),
        ("PUT", f"{sbx}/archive", {"params": {"path": "../.."}, "content": tar_of(("a", b"x", None))},
         400, "bad_path"),
        ("GET", f"{sbx}/archive", {"params": {"path": "../../.."}}, 400, "bad_path"),
        ("POST", f"{sbx}/exec", {"json": {"cmd": []}}, 400, "invalid_request"),
        ("POST", f"{sbx}/exec", {"json": {"cmd": [""]}}, 400, "invalid_request"),
        ("POST", f"{sbx}/exec", {"json": {"cmd": ["echo", "a\x00b"]}}, 400, "invalid_request"),
        ("POST", f"{sbx}/exec", {"json": {"cmd": "true", "env": {"": "x"}}}, 400, "invalid_request"),
        ("POST", f"{sbx}/exec", {"json": {"cmd": "true", "stdin_b64": "!!!"}}, 400, "invalid_request"),
        ("POST", f"{sbx}/exec", {"json": {"cmd": "true", "timeout": -1}}, 400, "invalid_request"),
        ("POST", f"{sbx}/exec", {"json": {"cmd": "true", "max_output": 1 << 40}}, 400, "invalid_request"),
        ("POST", f"{sbx}/exec", {"json": {"cmd": "true", "cwd": "a\x00"}}, 400, "bad_path"),
        ("POST", f"{sbx}/ttl", {"json": {"ttl_s": 0}}, 400, "invalid_request"),
        ("POST", f"{sbx}/ttl", {"json": {"ttl_s": 10_000}}, 400, "invalid_request"),
        ("POST", f"{sbx}/kill", {"json": {"user": "-1"}}, 400, "invalid_request"),
        ("POST", f"{sbx}/sessions/sess-nope/run", {"json": {"command": "true"}}, 404, "session_not_found"),
        ("POST", f"{sbx}/sessions", {"json": {"env": {"A\x00": "x"}}}, 400, "invalid_request"),
    ]
    for method, path, kw, status, code in cases:
        r = await http.request(method, path, **kw)
        assert r.headers.get("content-type") == "application/json", (method, path, r.status_code, r.text)
        assert (r.status_code, r.json().get("code")) == (status, code), (method, path, kw.get("json"), r.text)
        assert r.json()["message"]
    # an exec that fails in the guest: 200, then an error record
    r = await http.post(f"{sbx}/exec", json={"cmd": ["no-such-program"]})
    recs = [json.loads(x) for x in r.text.splitlines()]
    assert recs[-1]["type"] == "error" and recs[-1]["code"] == "guest_error" and recs[-1]["guest_type"] == "ExecError"
    r = await http.post(f"{sbx}/exec", json={"cmd": "ls -R up /etc/evil 2>&1"})
    out = base64.b64decode(json.loads(r.text.splitlines()[-1])["stdout_b64"])
    assert b"No such file" in out and b"evil\n" not in out  # nothing was unpacked
    assert not Path("/.sandfleet-upload").exists() and not Path("/etc/evil").exists()
    assert (await http.get("/healthz")).json()["ok"]
    assert (await http.delete(sbx)).status_code == 204
    assert (await http.get(sbx)).json()["code"] == "sandbox_closed"  # 410 once deleted
    assert await gauge(http, "sandfleet_sandboxes") == 0
    assert leftovers([sid]) == []


# -- commands


async def test_exec_streams_ndjson(client: ServiceClient, http: httpx.AsyncClient) -> None:
    async with await client.create_sandbox(ttl_s=120) as sb:
        t0 = time.monotonic()
        firsts: list[float] = []
        async with http.stream("POST", f"/v1/sandboxes/{sb.id}/exec",
                               json={"cmd": "echo a; sleep 0.5; echo b >&2; exit 3", "stream": True}) as r:
            assert r.headers["content-type"].startswith("application/x-ndjson")
            recs = []
            async for line in r.aiter_lines():
                recs.append(json.loads(line))
                firsts.append(time.monotonic() - t0)
        assert [x["type"] for x in recs] == ["stdout", "stderr", "exit"]
        assert firsts[0] < firsts[-1] - 0.3  # the first chunk came while the command ran
        assert recs[-1]["exit_code"] == 3 and "stdout_b64" not in recs[-1]
        r2 = await sb.exec("head -c 5000 /dev/zero; echo err >&2", max_output=100,
                           on_output=lambda s, b: None)
        assert r2.stdout_dropped == 4900 and r2.truncated and r2.stderr == "err\n"
        r3 = await sb.exec("cat; echo -n é >&2", stdin=b"\x00\xffbin", user="root")
        assert r3.stdout_bytes == b"\x00\xffbin" and r3.stderr == "é"


async def test_client_disconnect_kills_the_command(client: ServiceClient, svc: RunningService) -> None:
    async with await client.create_sandbox(ttl_s=120) as sb:
        # the raw HTTP way, streamed (the headers come at once) and not: hang up mid-command
        tag = f"300.{uuid.uuid4().int % 10**9}"
        async with httpx.AsyncClient(base_url=svc.url, headers=bearer(svc.token), timeout=30) as h:
            req = h.build_request("POST", f"/v1/sandboxes/{sb.id}/exec", json={"cmd": f"sleep {tag}", "stream": True})
            resp = await h.send(req, stream=True)
            await until(lambda: running(tag))
            await resp.aclose()
        await until(lambda: not running(tag))
        tag = f"302.{uuid.uuid4().int % 10**9}"
        async with httpx.AsyncClient(base_url=svc.url, headers=bearer(svc.token), timeout=30) as h:
            pending = asyncio.create_task(h.post(f"/v1/sandboxes/{sb.id}/exec", json={"cmd": f"sleep {tag}"}))
            await until(lambda: running(tag))
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
        await until(lambda: not running(tag))
        # the client way: cancel the exec
        tag2 = f"301.{uuid.uuid4().int % 10**9}"
        task = asyncio.create_task(sb.exec(f"sleep {tag2}"))
        await until(lambda: running(tag2))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: not running(tag2))
        assert (await sb.exec("echo alive")).stdout == "alive\n"
        r = await sb.exec("sleep 30", timeout=0.3)
        assert r.timed_out and r.exit_code == 137


# -- lifecycle of sandboxes


async def test_idempotency_key(client: ServiceClient) -> None:
    key = uuid.uuid4().hex
    first, again = await asyncio.gather(client.create_sandbox(ttl_s=60, labels={"k": key}, idempotency_key=key),
                                        client.create_sandbox(ttl_s=60, labels={"k": key}, idempotency_key=key))
    try:
        assert first.id == again.id
        assert [s["id"] for s in await client.find({"k": key})] == [first.id]
        with pytest.raises(ServiceError) as err:
            await client.create_sandbox(ttl_s=61, labels={"k": key}, idempotency_key=key)
        assert (err.value.status, err.value.code) == (422, "idempotency_conflict")
    finally:
        await first.close()


async def test_root_dirs_reach_the_backend(client: ServiceClient) -> None:
    """``SandboxSpec.root_dirs`` over the API: the service's sandbox starts with them root's,
    mode 0755, and says so in its spec (the verifier then runs no command for them)."""
    sb = await client.create_sandbox(ttl_s=60, root_dirs=("/tests",))
    try:
        assert sb.spec.root_dirs == ("/tests",)
        res = await sb.exec(["stat", "-c", "%u:%g:%a", "/tests", "/solution"], cwd="/", user="agent")
        assert res.stdout.split() == ["0:0:755", "1000:1000:755"], res.output
    finally:
        await sb.close()


async def test_labels_ttl_and_bulk_delete(client: ServiceClient) -> None:
    run = uuid.uuid4().hex
    boxes = [await client.create_sandbox(ttl_s=60, labels={"run": run, "i": str(i)}) for i in range(3)]
    other = await client.create_sandbox(ttl_s=60, labels={"run": "other-" + run})
    try:
        assert {s["id"] for s in await client.find({"run": run})} == {b.id for b in boxes}
        assert [s["id"] for s in await client.find({"run": run, "i": "1"})] == [boxes[1].id]
        await boxes[0].extend(600)
        info = (await client.sandbox(boxes[0].id)).runtime.expires - time.monotonic()
        assert 590 < info <= 600
        with pytest.raises(ConfigError, match="max-ttl"):
            await boxes[0].extend(10_000)
        assert sorted(await client.delete_where({"run": run})) == sorted(b.id for b in boxes)
        with pytest.raises(SandboxClosedError):  # 410 sandbox_closed, as a local sandbox after close()
            await boxes[1].exec("true")
        assert not boxes[1].alive
        assert (await other.exec("echo kept")).stdout == "kept\n"
    finally:
        for b in [*boxes, other]:
            await b.close()
    assert leftovers([b.id for b in [*boxes, other]]) == []


async def test_ttl_is_enforced_by_the_service(http: httpx.AsyncClient) -> None:
    sid = (await http.post("/v1/sandboxes", json={"limits": {"ttl_s": 0.5}})).json()["id"]
    await asyncio.sleep(1.2)
    r = await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": ["true"]})
    assert (r.status_code, r.json()["code"]) == (410, "sandbox_expired")
    await until(lambda: leftovers([sid]) == [], timeout=5)


# -- sessions, files, archives, snapshots over HTTP


async def test_sessions_files_archives_snapshots(http: httpx.AsyncClient, tmp_path: Path) -> None:
    sid = (await http.post("/v1/sandboxes", json={"limits": {"ttl_s": 120}})).json()["id"]
    base = f"/v1/sandboxes/{sid}"
    try:
        sess = (await http.post(f"{base}/sessions", json={"env": {"Z": "9"}})).json()["id"]

        async def run(cmd: str) -> dict[str, Any]:
            r = await http.post(f"{base}/sessions/{sess}/run", json={"command": cmd})
            return dict(json.loads(r.text.splitlines()[-1]))

        await run("mkdir -p d && cd d && export A=1")
        rec = await run("pwd; echo $A $Z")
        assert base64.b64decode(rec["stdout_b64"]) == b"/work/d\n1 9\n"
        assert (await http.delete(f"{base}/sessions/{sess}")).status_code == 204
        assert (await http.post(f"{base}/sessions/{sess}/run", json={"command": "true"})).status_code == 404

        assert (await http.put(f"{base}/files", params={"path": "dir/f.bin", "mode": 0o600},
                               content=b"\x00\x01")).status_code == 204
        assert (await http.get(f"{base}/files", params={"path": "dir/f.bin"})).content == b"\x00\x01"
        up = tar_of(("u/one.txt", b"one", None), ("link", None, "u/one.txt"))
        assert (await http.put(f"{base}/archive", params={"path": "inbox"}, content=up)).status_code == 204
        r = await http.get(f"{base}/archive", params={"path": "inbox"})
        assert r.headers["content-type"] == "application/x-tar"
        with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
            assert sorted(tar.getnames()) == ["inbox", "inbox/link", "inbox/u", "inbox/u/one.txt"]
        r = await http.get(f"{base}/archive", params={"path": "inbox", "max_bytes": 100})
        assert (r.status_code, r.json()["code"]) == (413, "too_large")

        snap = (await http.post(f"{base}/snapshot")).json()["id"]
        kids = (await http.post(f"/v1/snapshots/{snap}/fork", json={"n": 2, "labels": {"kid": "1"}})).json()
        kid_ids = [k["id"] for k in kids["sandboxes"]]
        assert len(set(kid_ids)) == 2 and all(k["spec"]["labels"] == {"kid": "1"} for k in kids["sandboxes"])
        for k in kid_ids:
            assert (await http.get(f"/v1/sandboxes/{k}/files", params={"path": "inbox/u/one.txt"})).content == b"one"
        assert snap in [s["id"] for s in (await http.get("/v1/snapshots")).json()]
        assert (await http.delete(f"/v1/snapshots/{snap}")).status_code == 204
        assert (await http.post(f"/v1/snapshots/{snap}/fork", json={"n": 1})).status_code == 404
        assert sorted((await http.delete("/v1/sandboxes", params={"label": "kid=1"})).json()["deleted"]) == \
            sorted(kid_ids)
    finally:
        await http.delete(base)
    assert leftovers([sid]) == []


def test_openapi_documents_v1(svc: RunningService) -> None:
    doc = httpx.get(svc.url + "/openapi.json", timeout=30).json()
    paths = doc["paths"]
    for p in ("/v1/sandboxes", "/v1/sandboxes/{sid}", "/v1/sandboxes/{sid}/exec", "/v1/sandboxes/{sid}/files",
              "/v1/sandboxes/{sid}/archive", "/v1/sandboxes/{sid}/sessions", "/v1/sandboxes/{sid}/snapshot",
              "/v1/snapshots/{snap}/fork", "/v1/sandboxes/{sid}/ttl", "/healthz"):
        assert p in paths, p
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "429" in paths["/v1/sandboxes"]["post"]["responses"]
    assert all(t not in json.dumps(doc) for t in svc.tokens)


def test_served_openapi_is_the_golden_one(svc: RunningService) -> None:
    """The running service answers the schema tests/golden/openapi.json keeps (tests/test_golden.py
    asks the app in-process, in the quick tier; this is the same document over a real socket)."""
    from test_golden import OPENAPI, openapi_text

    served = httpx.get(svc.url + "/openapi.json", timeout=30).json()
    assert openapi_text(served) == OPENAPI.read_text(), "tests/golden/README.md says how to regenerate it"


async def test_run_code_runs_python_and_bash_cells(client: ServiceClient) -> None:
    """``/v1 run_code``'s ``language``: a bash cell of the default context runs in the sandbox's
    one bash (``default-bash``), whose state lasts, beside python's own default context; a
    context's first cell sets its language, and a cell of the other one is a clear 400."""
    sb = await client.create_sandbox(ttl_s=120)
    try:
        if not (await sb.exec(["sh", "-c", "command -v python3 && command -v bash"])).ok:
            pytest.skip("this service's image has no python3 or no bash")
        assert (await sb.run_code("x = 2; x")).text == "2"
        ex = await sb.run_code("Y=5; cd /; echo $Y", language="bash")
        assert ex.stdout == ["5\n"] and ex.error is None
        # (its chunks are as the pipe gave them: one, or one per echo on a loaded host)
        assert "".join((await sb.run_code("echo $Y; pwd", language="bash")).stdout) == "5\n/\n"
        assert (await sb.run_code("x")).text == "2"  # python's default context is another
        assert (await sb.run_code("false", context="sh", language="bash")).error == {"name": "", "value": "1",
                                                                                     "traceback": ""}
        with pytest.raises(ConfigError, match="context 'sh' .* runs bash, not python"):
            await sb.run_code("1", context="sh")
    finally:
        await sb.close()
