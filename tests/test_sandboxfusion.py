"""SandboxFusion's own client (``sandbox-fusion``) against ``/sandbox-fusion/<token>/`` of a real
``sandfleet serve`` on loopback: right and wrong answers, a compile error, a timeout, a bad
token, an unsupported language, limits that map, and nothing left behind."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                       reason="the service needs the server extra (pip install -e '.[server]')"),
    pytest.mark.skipif(importlib.util.find_spec("sandbox_fusion") is None,
                       reason="needs the test extra (pip install -e '.[test]': sandbox-fusion)"),
]

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.server.testing import RunningService, leftovers, running_service


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    with running_service(tmp_path_factory.mktemp("fusion"), args=["--access-log"],
                         env={"SANDFLEET_LOG_LEVEL": "INFO"}) as s:
        yield s


def endpoint(svc: RunningService) -> str:
    return f"{svc.url}/sandbox-fusion/{svc.token}"


def live(svc: RunningService) -> list[str]:
    r = httpx.get(f"{svc.url}/v1/sandboxes", headers={"Authorization": f"Bearer {svc.token}"}, timeout=30)
    return [s["id"] for s in r.json()["sandboxes"]]


SOLUTION = "n = int(input())\nprint(sum(range(n + 1)))\n"
WRONG = "n = int(input())\nprint(sum(range(n)))\n"


def test_python_right_wrong_and_failing(svc: RunningService) -> None:
    from sandbox_fusion import RunCodeRequest, RunStatus, SummaryMapping, run_code, summary_run_code_result

    ep = endpoint(svc)
    right = run_code(RunCodeRequest(code=SOLUTION, language="python", stdin="10"), endpoint=ep, max_attempts=1)
    assert right.status == RunStatus.Success, right
    assert right.run_result is not None and right.run_result.stdout == "55\n"
    assert right.run_result.return_code == 0 and right.run_result.status == "Finished"
    assert right.compile_result is None and right.files == {} and right.message == ""
    assert right.run_result.execution_time is not None and right.run_result.execution_time > 0

    wrong = run_code(RunCodeRequest(code=WRONG, language="python", stdin="10"), endpoint=ep, max_attempts=1)
    assert wrong.status == RunStatus.Success and wrong.run_result is not None
    assert wrong.run_result.stdout == "45\n"  # the grader (verl) compares: a wrong answer, not an error

    # a failing assertion: Failed with the return code, never SandboxError (the client would raise)
    failing = run_code(RunCodeRequest(code="assert 1 + 1 == 3, 'arithmetic'\n", language="python"),
                       endpoint=ep, max_attempts=1)
    assert failing.status == RunStatus.Failed and failing.run_result is not None
    assert failing.run_result.return_code == 1 and "AssertionError: arithmetic" in (failing.run_result.stderr or "")
    mapping = SummaryMapping(RunFailed="run_failed", RunTimeout="run_timeout", CompileFailed="compile_failed")
    assert summary_run_code_result(failing, mapping) == "run_failed"
    assert summary_run_code_result(right, mapping) == "Success"

    bash = run_code(RunCodeRequest(code="echo out; echo err >&2; exit 7", language="bash"), endpoint=ep,
                    max_attempts=1)
    assert bash.status == RunStatus.Failed and bash.run_result is not None
    assert (bash.run_result.return_code, bash.run_result.stdout, bash.run_result.stderr) == (7, "out\n", "err\n")
    assert live(svc) == []


def test_cpp_compile_error_and_run(svc: RunningService) -> None:
    from sandbox_fusion import RunCodeRequest, RunStatus, SummaryMapping, run_code, summary_run_code_result

    ep = endpoint(svc)
    good = "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b << '\\n'; }\n"
    res = run_code(RunCodeRequest(code=good, language="cpp", stdin="2 40", compile_timeout=60), endpoint=ep,
                   max_attempts=1)
    assert res.status == RunStatus.Success, res
    assert res.compile_result is not None and res.compile_result.return_code == 0
    assert res.run_result is not None and res.run_result.stdout == "42\n"

    bad = run_code(RunCodeRequest(code="int main() { return undeclared; }\n", language="cpp", compile_timeout=60),
                   endpoint=ep, max_attempts=1)
    assert bad.status == RunStatus.Failed and bad.run_result is None
    assert bad.compile_result is not None and bad.compile_result.status == "Finished"
    assert bad.compile_result.return_code != 0 and "undeclared" in (bad.compile_result.stderr or "")
    assert summary_run_code_result(bad, SummaryMapping(CompileFailed="compile_failed")) == "compile_failed"
    assert live(svc) == []


def test_timeout(svc: RunningService) -> None:
    from sandbox_fusion import RunCodeRequest, RunStatus, SummaryMapping, run_code, summary_run_code_result

    res = run_code(RunCodeRequest(code="import time\nprint('started', flush=True)\ntime.sleep(60)\n",
                                  language="python", run_timeout=1), endpoint=endpoint(svc), max_attempts=1)
    assert res.status == RunStatus.Failed and res.run_result is not None
    assert res.run_result.status == "TimeLimitExceeded" and res.run_result.return_code is None
    assert res.run_result.stdout == "started\n"
    assert 0.9 < (res.run_result.execution_time or 0) < 30
    assert summary_run_code_result(res, SummaryMapping(RunTimeout="run_timeout")) == "run_timeout"
    assert live(svc) == []


def test_bad_token_and_unsupported(svc: RunningService) -> None:
    from sandbox_fusion import RunCodeRequest, run_code

    with pytest.raises(Exception, match="401"):
        run_code(RunCodeRequest(code="print(1)", language="python"),
                 endpoint=f"{svc.url}/sandbox-fusion/{'x' * 32}", max_attempts=1)
    for path in ("run_code", "run_jupyter", "submit", "anything/else"):
        r = httpx.post(f"{svc.url}/sandbox-fusion/not-a-token-of-this-service/{path}", json={}, timeout=30)
        assert r.status_code == 401, (path, r.text)
    with pytest.raises(Exception, match="language 'go' is not supported by sandfleet.*python, bash, cpp"):
        run_code(RunCodeRequest(code="package main", language="go"), endpoint=endpoint(svc), max_attempts=1)
    r = httpx.post(f"{endpoint(svc)}/submit", json={}, timeout=30)
    assert r.status_code == 501 and "submit is not supported by sandfleet" in r.json()["detail"]
    r = httpx.post(f"{endpoint(svc)}/run_code", json={"code": 1, "language": "python"}, timeout=30)
    assert r.status_code == 400 and "code and language" in r.json()["detail"]
    r = httpx.post(f"{endpoint(svc)}/run_code", json={"code": "1", "language": "python", "run_timeout": -1},
                   timeout=30)
    assert r.status_code == 400 and "run_timeout" in r.json()["detail"]


# what each malformed body answers, pinned before the request models replaced the hand checks
# (issue 43): the same detail, in the same order of checks, through the models
MALFORMED = [
    ("run_code", {"code": "x", "language": "ruby", "stdin": 5},
     "language 'ruby' is not supported by sandfleet's SandboxFusion dialect (it runs python, bash, cpp)"),
    ("run_code", {"code": "x", "language": "python", "stdin": 5, "run_timeout": "x"}, "stdin must be a string or null"),
    ("run_code", {"code": "x", "language": "python", "run_timeout": True},
     "run_timeout must be a number from 0.001 to 86400, not True"),
    ("run_code", {"code": "x", "language": "python", "run_timeout": 10**9},
     "run_timeout must be a number from 0.001 to 86400, not 1000000000"),
    ("run_code", {"code": "x", "language": "python", "memory_limit_MB": "big"},
     "memory_limit_MB must be a number from 16 to 1.67772e+07, not 'big'"),
    ("run_code", {"code": "x", "language": "python", "files": {"a": 5}}, "files['a'] is not base64 text"),
    ("run_code", {"code": "x", "language": "python", "fetch_files": [1]},
     "files must be an object of path -> base64 text, fetch_files a list of paths"),
    ("run_jupyter", {"cells": 3, "kernel": 5}, "cells is a required list of strings"),
    ("run_jupyter", {"cells": ["1"], "kernel": 5}, "kernel 5 is not supported by sandfleet (python3)"),
    ("run_jupyter", {"cells": ["1"], "cell_timeout": -1}, "cell_timeout must be a number from 0 to 86400, not -1"),
]


@pytest.mark.parametrize(("path", "body", "detail"), MALFORMED)
def test_a_malformed_body_is_a_400_naming_the_field(svc: RunningService, path: str, body: dict[str, Any],
                                                     detail: str) -> None:
    r = httpx.post(f"{endpoint(svc)}/{path}", json=body, timeout=30)
    assert (r.status_code, r.json()) == (400, {"detail": detail})


def test_extra_fields_limits_and_files(svc: RunningService) -> None:
    """What verl sends (memory_limit_MB and all) is accepted; the memory limit is the
    sandbox's; files go in, fetch_files come back."""
    ep = endpoint(svc)
    hog = "x = bytearray(200 << 20)\nx[::4096] = b'1' * len(x[::4096])\nprint('allocated')\n"
    base: dict[str, Any] = {"compile_timeout": 10, "run_timeout": 20, "stdin": None, "files": {}, "fetch_files": [],
            "language": "python", "some_future_field": {"ignored": True}}
    small = httpx.post(f"{ep}/run_code", json={**base, "code": hog, "memory_limit_MB": 64}, timeout=120).json()
    assert small["status"] == "Failed", small
    assert small["run_result"]["return_code"] == 137 and "allocated" not in small["run_result"]["stdout"]
    big = httpx.post(f"{ep}/run_code", json={**base, "code": hog, "memory_limit_MB": 512}, timeout=120).json()
    assert big["status"] == "Success" and big["run_result"]["stdout"] == "allocated\n", big

    files = {"data/in.txt": base64.b64encode(b"3 4\n").decode(), "skipped": None}
    code = "a, b = map(int, open('data/in.txt').read().split())\nopen('out/sum.txt', 'w').write(str(a * b))\n"
    res = httpx.post(f"{ep}/run_code", json={**base, "code": "import os\nos.makedirs('out')\n" + code,
                                            "files": files, "fetch_files": ["out/sum.txt", "missing.txt"]},
                     timeout=120).json()
    assert res["status"] == "Success", res
    assert res["files"] == {"out/sum.txt": base64.b64encode(b"12").decode()}
    assert live(svc) == []


def test_async_client_concurrent_and_no_leak(svc: RunningService) -> None:
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code_async

    async def main() -> list[str]:
        reqs = [RunCodeRequest(code=SOLUTION, language="python", stdin=str(n)) for n in range(6)]
        out = await asyncio.gather(*(run_code_async(r, endpoint=endpoint(svc), max_attempts=1) for r in reqs))
        assert all(o.status == RunStatus.Success for o in out)
        return [o.run_result.stdout if o.run_result else "" for o in out]

    assert asyncio.run(main()) == [f"{sum(range(n + 1))}\n" for n in range(6)]
    assert live(svc) == []


def test_token_not_logged_and_metrics(svc: RunningService) -> None:
    from sandbox_fusion import RunCodeRequest, run_code

    run_code(RunCodeRequest(code="print(1)", language="python"), endpoint=endpoint(svc), max_attempts=1)
    httpx.post(f"{endpoint(svc)}/run_code", json={"code": "", "language": "cobol"}, timeout=30)
    m = httpx.get(f"{svc.url}/metrics", headers={"Authorization": f"Bearer {svc.token}"}, timeout=30).text
    assert svc.token not in m
    assert 'sandfleet_sandbox_fusion_runs_total{language="python",status="Success"}' in m
    assert 'sandfleet_sandbox_fusion_runs_total{language="other",status="400"}' in m
    log = svc.log
    assert "/sandbox-fusion/***/run_code" in log  # the access log is on: the line is there, redacted
    assert svc.token not in log


def test_nothing_left_after_the_service(tmp_path: Path) -> None:
    """Sandboxes of calls cut short (the client gone mid-run) are closed; none outlive the service."""
    with running_service(tmp_path / "svc", args=["--max-body-mib", "1"]) as s:
        r = httpx.post(f"{endpoint(s)}/run_code", json={"code": "#" * (2 << 20), "language": "python"}, timeout=60)
        assert r.status_code == 413 and "cap" in r.text
        chunked = httpx.post(f"{endpoint(s)}/run_code", content=iter([b"x" * (1 << 20)] * 3),
                             headers={"content-type": "application/json"}, timeout=60)  # no length: read, then cut
        assert chunked.status_code == 413 and "cap" in chunked.json()["detail"]
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{endpoint(s)}/run_code", json={"code": "import time; time.sleep(30)", "language": "python",
                                                       "run_timeout": 30}, timeout=3)
        ids = live(s)
    assert leftovers(ids) == []


def test_sandbox_lost_is_sandbox_error(svc: RunningService) -> None:
    """A sandbox killed from the host mid-run is the host's fault: SandboxError with the cause,
    which the client retries and then raises; never a Failed the code would be blamed for."""
    import threading
    from types import SimpleNamespace

    from sandbox_fusion import RunCodeRequest, RunCodeResponse, RunStatus, run_code

    from sandfleet.testing.faultpolicies import kill_from_host

    got: dict[str, Any] = {}

    def call() -> None:
        got["r"] = httpx.post(f"{endpoint(svc)}/run_code", json={
            "code": "import time\nprint('started', flush=True)\ntime.sleep(30)\n", "language": "python",
            "run_timeout": 60}, timeout=120)

    t = threading.Thread(target=call)
    t.start()
    try:
        for _ in range(600):
            ids = live(svc)
            if ids:
                break
            t.join(0.05)
        assert len(ids) == 1
        t.join(1.0)  # the command is running by now
        kill_from_host(SimpleNamespace(id=ids[0]))
    finally:
        t.join(120)
    r = got["r"]
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "SandboxError" and body["run_result"] is None, body
    assert "the sandbox failed during the call" in body["message"]
    assert RunCodeResponse(**body).status == RunStatus.SandboxError  # the client's model reads it so
    assert run_code(RunCodeRequest(code="print(2)", language="python"), endpoint=endpoint(svc),
                    max_attempts=1).status == "Success"  # the service goes on
    assert live(svc) == []


def test_run_jupyter(svc: RunningService) -> None:
    from sandbox_fusion import RunJupyterRequest, run_jupyter

    cells = ["a = 123", "a", "print(a)", 'import sys; sys.stderr.write("stderr message")',
             'raise RuntimeError("error message")', "a + 1"]
    before = live(svc)
    resp = run_jupyter(RunJupyterRequest(cells=cells, files={"data.txt": base64.b64encode(b"42").decode()},
                                         fetch_files=["out.txt"]),
                       endpoint=endpoint(svc), max_attempts=1)
    assert resp.status == "Failed" and resp.driver is not None and resp.driver.status == "Finished"
    got = [(c.stdout, c.stderr, c.display, [e["ename"] for e in c.error]) for c in resp.cells]
    assert got[:4] == [("", "", [], []), ("", "", [{"text/plain": "123"}], []), ("123\n", "", [], []),
                       ("", "stderr message", [{"text/plain": "14"}], [])]
    assert got[4][3] == ["RuntimeError"] and resp.cells[4].error[0]["evalue"] == "error message"
    assert any("error message" in line for line in resp.cells[4].error[0]["traceback"])
    assert got[5][2] == [{"text/plain": "124"}]  # cells after an error still run, in the same kernel
    ok = run_jupyter(RunJupyterRequest(cells=["open('out.txt', 'w').write(open('data.txt').read())", "1 + 1"],
                                       files={"data.txt": base64.b64encode(b"42").decode()},
                                       fetch_files=["out.txt"]), endpoint=endpoint(svc), max_attempts=1)
    assert ok.status == "Success" and ok.cells[1].display == [{"text/plain": "2"}]
    assert base64.b64decode(ok.files["out.txt"]) == b"42"
    # a cell past cell_timeout is interrupted; no later cell runs
    slow = run_jupyter(RunJupyterRequest(cells=["import time; time.sleep(30)", "1"], cell_timeout=1),
                       endpoint=endpoint(svc), max_attempts=1)
    assert slow.status == "Failed" and slow.driver.status == "TimeLimitExceeded" and len(slow.cells) == 1
    assert slow.cells[0].error[0]["ename"] == "KeyboardInterrupt"
    assert live(svc) == before  # each call's sandbox is closed


@pytest.mark.parametrize("path", ["run_code", "run_jupyter"])
def test_a_client_that_hangs_up_leaves_no_sandbox(svc: RunningService, path: str) -> None:
    """Both endpoints run their work in_sandbox: a client gone mid-run cancels it and its
    sandbox is deleted at once (not at its TTL)."""
    import time

    body = ({"code": "import time; time.sleep(60)", "language": "python", "run_timeout": 120} if path == "run_code"
            else {"cells": ["import time; time.sleep(60)"], "total_timeout": 120})
    before = set(live(svc))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{endpoint(svc)}/{path}", json=body, timeout=httpx.Timeout(30, read=4))
    deadline = time.monotonic() + 20
    while set(live(svc)) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(live(svc)) - before == set()
