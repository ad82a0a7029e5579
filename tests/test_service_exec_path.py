"""The service's exec fast path (sandfleet.server.app.FastExec) answers as the FastAPI route
does. A body sent as ``application/json`` is answered by the fast path; the same body as
``application/json; charset=utf-8`` goes to the FastAPI route: both must give the same
status, headers and records, refusals included, against a real ``sandfleet serve``."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandfleet.errors import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                                reason="the service needs the server extra (pip install -e '.[server]')")

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.server.testing import RunningService, running_service

FAST = "application/json"
ROUTE = "application/json; charset=utf-8"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    with running_service(tmp_path_factory.mktemp("svc"), args=["--max-body-mib", "1"]) as s:
        yield s


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def answer(r: httpx.Response) -> tuple[int, dict[str, str], Any]:
    """Status, headers and the records (the date and durations left out: they differ run
    to run, and so does the length they are part of)."""
    headers = {k: v for k, v in r.headers.items() if k not in ("date", "content-length")}
    if headers.get("content-type") == "application/x-ndjson":
        recs = [json.loads(x) for x in r.text.splitlines()]
        for rec in recs:
            rec.pop("duration_s", None)
        return r.status_code, headers, recs
    return r.status_code, headers, r.json()


async def test_fast_path_answers_as_the_route(svc: RunningService) -> None:
    auth = {"Authorization": f"Bearer {svc.token}"}
    async with httpx.AsyncClient(base_url=svc.url, headers=auth, timeout=60) as h:
        r = await h.post("/v1/sandboxes", json={"limits": {"ttl_s": 120}})
        assert r.status_code == 201
        sid = r.json()["id"]
        ex = f"/v1/sandboxes/{sid}/exec"
        before = await h.get("/metrics")
        cases: list[tuple[str, dict[str, str], Any]] = [
            (ex, auth, {"cmd": ["sh", "-c", "echo out; echo err >&2; exit 3"]}),
            (ex, auth, {"cmd": "printf %s \"$X\"; pwd; cat", "env": {"X": "é"}, "cwd": "/tmp", "stdin_b64": "aGk=",
                        "max_output": 3, "timeout": 30}),
            (ex, auth, {"cmd": ["no-such-program"]}),  # 200, then an error record
            (ex, auth, {"cmd": ["true"], "user": "no such user!"}),
            (ex, auth, {"cmd": "sleep 5", "timeout": 0.2}),
            (ex, auth, {"cmd": [""]}),  # refused by the service's checks (400)
            (ex, auth, {"cmd": "true", "env": {"": "x"}}),
            (ex, auth, {"cmd": "true", "stdin_b64": "!!!"}),
            (ex, auth, {"cmd": "true", "cwd": "a\x00"}),
            (ex, auth, {"cmd": []}),  # refused by the schema (FastAPI's answer on both)
            (ex, auth, {"cmd": "true", "bogus": 1}),
            (ex, auth, {"cmd": "true", "max_output": -1}),
            (ex, {"Authorization": "Bearer " + "x" * 30}, {"cmd": "true"}),  # a wrong token: 401
            (ex, {"Authorization": ""}, {"cmd": "true"}),
            ("/v1/sandboxes/sf-bwrap-000000000000/exec", auth, {"cmd": "true"}),  # 404
            (ex, {**auth, "X-Deadline-Ms": "soon"}, {"cmd": "true"}),  # a bad admission deadline: 400
        ]
        for path, headers, body in cases:
            raw = json.dumps(body).encode()
            got = [answer(await h.post(path, content=raw, headers={**headers, "content-type": ct}))
                   for ct in (FAST, ROUTE)]
            assert got[0] == got[1], (body, got)
            assert got[0][0] != 500, (body, got)
        fast = answer(await h.post(ex, content=json.dumps(cases[0][2]), headers={"content-type": FAST}))
        assert fast[0] == 200 and fast[2][-1]["type"] == "exit" and fast[2][-1]["exit_code"] == 3
        assert fast[2][-1]["stdout_b64"] == "b3V0Cg==" and fast[2][-1]["stderr"] == "err\n"
        # malformed JSON: the route's answer, whichever content type
        for ct in (FAST, ROUTE):
            r = await h.post(ex, content=b"{bad", headers={"content-type": ct})
            assert (r.status_code, r.json()["code"]) == (400, "invalid_request")
            assert "malformed JSON" in r.json()["message"]
        # streamed commands go to the route (NDJSON chunks)
        r = await h.post(ex, json={"cmd": "echo a", "stream": True})
        assert [x["type"] for x in map(json.loads, r.text.splitlines())] == ["stdout", "exit"]
        # the fast path's answers are counted as the route's are
        after = (await h.get("/metrics")).text
        assert metric(after, "sandfleet_exec_seconds_count") > metric(before.text, "sandfleet_exec_seconds_count")
        assert metric(after, 'sandfleet_http_requests_total{status="2xx"}') > metric(
            before.text, 'sandfleet_http_requests_total{status="2xx"}')
        # documented as before
        doc = (await h.get("/openapi.json")).json()
        op = doc["paths"]["/v1/sandboxes/{sid}/exec"]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ExecRequest")
        assert (await h.delete(f"/v1/sandboxes/{sid}")).status_code == 204


async def test_client_paths(svc: RunningService, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's commands go straight to its own transport; through httpx's whole client
    with an injected transport, or where a proxy is configured; all three work alike."""
    from sandfleet.client import connect
    from sandfleet.client._transport import FastTransport

    async def check(client: Any) -> Any:
        async with await client.create_sandbox(ttl_s=120) as sb:
            r = await sb.exec(["sh", "-c", "echo out; echo err >&2; exit 4"])
            assert (r.exit_code, r.stdout, r.stderr) == (4, "out\n", "err\n")
            chunks: list[tuple[str, bytes]] = []
            r = await sb.exec("echo a; echo b >&2", on_output=lambda k, b: chunks.append((k, b)))
            assert r.exit_code == 0 and sorted(chunks) == [("stderr", b"b\n"), ("stdout", b"a\n")]
            with pytest.raises(ConfigError, match="timeout"):  # an error answer maps as on every path
                await sb.exec("true", timeout=1e9)
            return sb.runtime._direct

    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    async with await connect(svc.url, svc.token) as c:
        assert isinstance(await check(c), FastTransport)
    async with await connect(svc.url, svc.token, transport=httpx.AsyncHTTPTransport()) as c:
        assert await check(c) is None
    # a proxy in the environment (not for loopback): httpx's client decides, as it always did
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    async with await connect(svc.url, svc.token) as c:
        assert await check(c) is None
