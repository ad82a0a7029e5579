"""The real, unmodified ``e2b-code-interpreter`` SDK (sync and async) against a real
``sandfleet serve`` on loopback, through E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY:
``run_code`` in a stateful kernel (no Jupyter), and code contexts."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                       reason="the service needs the server extra (pip install -e '.[server]')"),
    pytest.mark.skipif(importlib.util.find_spec("e2b_code_interpreter") is None,
                       reason="the e2b-code-interpreter SDK is not installed (pip install e2b-code-interpreter)"),
]

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.server.testing import RunningService, running_service


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


def test_run_code_state_output_errors(e2b_env: dict[str, str]) -> None:
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create(timeout=120)  # template code-interpreter-v1, the SDK's default
    try:
        assert sbx.get_info().template_id == "code-interpreter-v1"
        # state persists across calls; the last expression is the cell's result
        first = sbx.run_code("x = 1")
        assert first.text is None and first.error is None and first.results == []
        ex = sbx.run_code("x += 1; x")
        assert ex.text == "2" and ex.error is None
        assert ex.results[0].is_main_result and ex.execution_count == 2
        # stdout / stderr stream to the callbacks, subprocesses' output too
        out: list[str] = []
        err: list[str] = []
        ex = sbx.run_code("import os, sys\nprint('one')\nprint('two', file=sys.stderr)\nos.system('echo three')",
                          on_stdout=lambda m: out.append(m.line), on_stderr=lambda m: err.append(m.line))
        assert "".join(out) == "one\nthree\n" and "".join(err) == "two\n"
        assert ex.logs.stdout == out and ex.logs.stderr == err
        # an error: name, value and a traceback that names the cell's line
        errors: list[Any] = []
        ex = sbx.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
        assert ex.error is not None and ex.error.name == "ZeroDivisionError"
        assert ex.error.value == "division by zero"
        assert "return 1 / 0" in ex.error.traceback and errors == [ex.error]
        # env_vars for one cell, the sandbox's working directory and user
        ex = sbx.run_code("import os; (os.environ.get('ONLY_HERE'), os.getcwd())", envs={"ONLY_HERE": "yes"})
        assert ex.text == "('yes', '/home/user')"
        assert sbx.run_code("import os; os.environ.get('ONLY_HERE')").text is None
        # rich forms of a result
        ex = sbx.run_code("class H:\n    def _repr_html_(self):\n        return '<b>hi</b>'\nH()")
        assert ex.results[0].html == "<b>hi</b>"
        # the kernel and commands share the sandbox
        sbx.run_code("open('/home/user/from_kernel.txt', 'w').write('k')")
        assert sbx.files.read("/home/user/from_kernel.txt") == "k"
    finally:
        sbx.kill()


def test_contexts(e2b_env: dict[str, str]) -> None:
    from e2b.exceptions import NotFoundException, SandboxException
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create(timeout=120)
    try:
        sbx.run_code("y = 'default'")
        ctx = sbx.create_code_context(cwd="/tmp")
        assert ctx.language == "python" and ctx.cwd == "/tmp"
        assert [c.id for c in sbx.list_code_contexts()] == [ctx.id]
        ex = sbx.run_code("import os; y = 'other'; os.getcwd()", context=ctx)
        assert ex.text == "'/tmp'"
        assert sbx.run_code("y").text == "'default'"  # contexts are separate globals
        assert sbx.run_code("y", context=ctx).text == "'other'"
        sbx.restart_code_context(ctx)
        assert sbx.run_code("y", context=ctx).error.name == "NameError"
        sbx.remove_code_context(ctx.id)
        assert sbx.list_code_contexts() == []
        with pytest.raises(NotFoundException):
            sbx.run_code("1", context=ctx)
        with pytest.raises(SandboxException):
            sbx.run_code("1", language="r")
    finally:
        sbx.kill()


def test_bash_contexts(e2b_env: dict[str, str]) -> None:
    """The SDK sends ``{"language": "bash"}`` to ``/execute`` and ``/contexts``: a long-lived
    bash per context, as E2B's Jupyter bash kernel (state across cells, ``envs`` for one cell,
    a failed cell's error with no name and its exit status as value)."""
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create(timeout=120, envs={"FROM_SANDBOX": "yes"})
    try:
        seen: list[str] = []
        ex = sbx.run_code("X=5; echo $X $FROM_SANDBOX", language="bash", on_stdout=lambda m: seen.append(m.line))
        assert ex.logs.stdout == ["5 yes\n"] == seen and ex.error is None and ex.results == []
        # the default bash context keeps variables, functions and the working directory
        sbx.run_code("cd /tmp; twice() { echo $(( $1 * 2 )); }", language="bash")
        assert "".join(sbx.run_code("echo $X; pwd; twice 21", language="bash").logs.stdout) == "5\n/tmp\n42\n"
        # envs for one cell only (E2B's own test)
        assert sbx.run_code("echo $FOO", language="bash", envs={"FOO": "bar"}).logs.stdout == ["bar\n"]
        assert sbx.run_code("echo ${FOO:-default}", language="bash").logs.stdout == ["default\n"]
        # a failed cell: stderr, and the error Jupyter's bash kernel gives (no name, the status)
        ex = sbx.run_code("echo oops >&2; false", language="bash")
        assert ex.logs.stderr == ["oops\n"] and ex.error is not None
        assert (ex.error.name, ex.error.value, ex.error.traceback) == ("", "1", "")
        # a bash context of its own, with its cwd, apart from the default one; restart empties it
        ctx = sbx.create_code_context(language="bash", cwd="/home")
        assert ctx.language == "bash" and ctx.cwd == "/home"
        assert "".join(sbx.run_code("pwd; Y=1; echo ${X:-none}", context=ctx).logs.stdout) == "/home\nnone\n"
        assert sbx.run_code("echo ${Y:-none}", language="bash").logs.stdout == ["none\n"]
        sbx.restart_code_context(ctx)
        assert sbx.run_code("echo ${Y:-gone}", context=ctx).logs.stdout == ["gone\n"]
        assert [c.language for c in sbx.list_code_contexts()] == ["bash"]
        # python's default context is its own
        assert sbx.run_code("X").error.name == "NameError"
    finally:
        sbx.kill()


def test_other_languages_are_refused_naming_what_to_use(e2b_env: dict[str, str]) -> None:
    """javascript, typescript, r and java: 400 at once, naming what to use instead."""
    from e2b.exceptions import SandboxException
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create(timeout=120)
    try:
        for call in (lambda: sbx.create_code_context(language="r"),
                     lambda: sbx.run_code("1", language="javascript")):
            with pytest.raises(SandboxException) as e:
                call()
            msg = str(e.value)
            assert msg.startswith("400") and "is not supported by sandfleet's code interpreter" in msg
            assert "python and bash" in msg and "sbx.commands.run(...)" in msg
        assert sbx.list_code_contexts() == []  # the refused context was not made
    finally:
        sbx.kill()


def test_matplotlib_png(e2b_env: dict[str, str], tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A figure comes back as a PNG display result. The host image's python3 has no
    matplotlib, so this runs on a process-backend service, in a sandbox whose PATH (envVars)
    starts with this interpreter's bin directory: the kernel's python3 is this one."""
    from e2b_code_interpreter import Sandbox

    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed here")
    bindir = str(Path(sys.executable).parent)
    with running_service(tmp_path, args=["--backend", "process"]) as s:
        for k, v in {"E2B_API_URL": s.url, "E2B_SANDBOX_URL": s.url, "E2B_API_KEY": s.token}.items():
            monkeypatch.setenv(k, v)
        sbx = Sandbox.create(timeout=120, envs={"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin"})
        try:
            if sbx.run_code("import matplotlib").error is not None:
                pytest.skip("the process backend's python3 is not this interpreter")
            ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
            assert ex.error is None
            pngs = [r.png for r in ex.results if r.png]
            assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")
            assert "png" in list(ex.results[0].formats())
        finally:
            sbx.kill()


def test_async_sdk(e2b_env: dict[str, str]) -> None:
    from e2b_code_interpreter import AsyncSandbox

    async def main() -> None:
        sbx = await AsyncSandbox.create(timeout=120)
        try:
            await sbx.run_code("n = 40")
            seen: list[str] = []
            ex = await sbx.run_code("print('hi'); n + 2", on_stdout=lambda m: seen.append(m.line))
            assert ex.text == "42" and seen == ["hi\n"]
        finally:
            await sbx.kill()

    asyncio.run(main())


def test_client_timeout_interrupts_the_cell(e2b_env: dict[str, str]) -> None:
    """The SDK's ``timeout`` hangs up; the cell is interrupted, the kernel's state stays and
    the next cell runs at once (not after the sleep)."""
    import time

    from e2b.exceptions import TimeoutException
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create(timeout=120)
    try:
        sbx.run_code("kept = 5")
        with pytest.raises(TimeoutException):
            sbx.run_code("import time; time.sleep(60)", timeout=1)
        t = time.monotonic()
        assert sbx.run_code("kept").text == "5"
        assert time.monotonic() - t < 15
    finally:
        sbx.kill()


def test_dead_sandbox_and_bad_token(e2b_env: dict[str, str], svc: RunningService) -> None:
    import httpx
    from e2b.exceptions import TimeoutException
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create(timeout=60)
    sbx.run_code("1")
    r = httpx.post(f"{svc.url}/execute", json={"code": "1"},
                   headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": "wrong"})
    assert r.status_code == 401
    sbx.kill()
    with pytest.raises(TimeoutException):  # 502 "was not found": the SDK's "sandbox timeout"
        sbx.run_code("1")


def test_v1_run_code_shares_the_kernel(e2b_env: dict[str, str], svc: RunningService) -> None:
    """sandfleet's own client (``RemoteSandbox.run_code``, ``POST /v1/sandboxes/{id}/run_code``)
    and the E2B SDK reach one kernel per sandbox."""
    from e2b_code_interpreter import Sandbox

    from sandfleet.client import connect
    from sandfleet.errors import ConfigError

    async def main() -> None:
        async with await connect(svc.url, svc.token) as c, await c.create_sandbox(ttl_s=120) as sb:
            assert (await sb.run_code("shared = 41")).error is None
            ex = await sb.run_code("print('out'); shared + 1")
            assert ex.text == "42" and ex.stdout == ["out\n"] and ex.execution_count == 2
            ex = await sb.run_code("import time; time.sleep(30)", timeout=0.5)
            assert ex.error is not None and ex.error["name"] == "KeyboardInterrupt"
            assert (await sb.run_code("shared", context="other")).error["name"] == "NameError"
            with pytest.raises(ConfigError):
                await sb.run_code("1", env={"A=B": "x"})
            sbx = await asyncio.to_thread(Sandbox.connect, sb.id)
            assert (await asyncio.to_thread(sbx.run_code, "shared")).text == "41"

    asyncio.run(main())
