""":class:`sandfleet.interpreter.Kernel` on real sandboxes of each backend the host has: state
across cells, streamed output, errors, contexts, interrupts, a kernel that dies, and
matplotlib figures as PNGs."""

from __future__ import annotations

import base64
import importlib.util
import sys
from typing import Any

import pytest

from sandfleet.interpreter import Kernel, KernelError
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox


async def test_state_output_and_errors(sb: Sandbox) -> None:
    if not (await sb.exec(["sh", "-c", "command -v python3"])).ok:
        with pytest.raises(KernelError, match="python3"):  # said so, not a hang
            await Kernel(sb).run("1")
        pytest.skip(f"this {sb.backend} sandbox's image has no python3")
    k = Kernel(sb, cwd="/tmp")
    try:
        assert (await k.run("x = 1")).text is None
        ex = await k.run("x += 1; x")
        assert ex.text == "2" and ex.error is None and ex.execution_count == 2
        seen: list[dict[str, Any]] = []
        ex = await k.run("import os, sys\nprint('a')\nprint('b', file=sys.stderr)\nos.system('echo c')\nx",
                         on_event=seen.append)
        assert ex.stdout == ["a\n", "c\n"] and ex.stderr == ["b\n"] and ex.text == "2"
        assert [e["type"] for e in seen] == ["stdout", "stderr", "stdout", "result", "end"]
        ex = await k.run("def f():\n    raise ValueError('bad')\nf()")
        assert ex.error is not None and (ex.error["name"], ex.error["value"]) == ("ValueError", "bad")
        assert "raise ValueError('bad')" in ex.error["traceback"] and "<cell 4>" in ex.error["traceback"]
        ex = await k.run("def g(:")
        assert ex.error is not None and ex.error["name"] == "SyntaxError"
        # contexts: separate globals, each with its own working directory
        here = (await k.run("import os; os.getcwd()")).text
        assert here is not None and here.endswith("/tmp'")  # the process backend maps paths under its root
        there = (await k.run("import os; os.chdir('..'); os.getcwd()", context="c2", cwd="/tmp")).text
        assert there is not None and not there.endswith("/tmp'")
        assert (await k.run("x", context="c2")).error["name"] == "NameError"
        assert (await k.run("os.getcwd()", context="c2")).text == there  # a context keeps its chdir
        assert (await k.run("import os; os.getcwd()")).text == here
        await k.reset()
        assert (await k.run("x")).error["name"] == "NameError"
        # env for one cell
        ex = await k.run("import os; os.environ.get('K_ONLY')", env={"K_ONLY": "1"})
        assert ex.text == "'1'" and (await k.run("os.environ.get('K_ONLY')")).text is None
        # past its timeout a cell is interrupted; the state stays
        await k.run("y = 7")
        ex = await k.run("import time\ntime.sleep(30)", timeout=0.5)
        assert ex.error is not None and ex.error["name"] == "KeyboardInterrupt"
        assert (await k.run("y")).text == "7"
        # a cell that kills its interpreter: an error, and a new kernel on the next cell
        ex = await k.run("import os; os._exit(3)")
        assert ex.error is not None and ex.error["name"] == "KernelDied" and "exit code 3" in ex.error["value"]
        assert (await k.run("1 + 1")).text == "2"
    finally:
        await k.close()


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed")
async def test_matplotlib_figure_is_png() -> None:
    """On the process backend with this interpreter (which has matplotlib): the figures open
    at a cell's end come back as PNG display results, and a Figure as a value is one too."""
    sb = await create_sandbox(backend="process", ttl_s=120)
    k = Kernel(sb, python=sys.executable)
    try:
        ex = await k.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.title('t')")
        assert ex.error is None, ex.error
        pngs = [r for r in ex.results if r.get("png")]
        assert len(pngs) == 1 and not pngs[0]["is_main_result"]
        assert base64.b64decode(pngs[0]["png"]).startswith(b"\x89PNG\r\n\x1a\n")
        ex = await k.run("fig = plt.figure(); fig.add_subplot().plot([0, 1]); plt.close(fig); fig")
        assert ex.results[0]["is_main_result"] and ex.results[0]["png"]
    finally:
        await k.close()
        await sb.close()


async def test_bash_contexts(sb: Sandbox) -> None:
    """``language="bash"``: a long-lived bash per context. State lasts; a failed cell's error has
    no name and its exit status as value; an interrupt stops the cell and keeps the shell; a
    cell that exits the shell gets its status, and the next cell a fresh shell; a cell's stdin
    is /dev/null (it never reads the kernel's requests)."""
    if not (await sb.exec(["sh", "-c", "command -v python3 && command -v bash"])).ok:
        pytest.skip(f"this {sb.backend} sandbox's image has no python3 or no bash")
    k = Kernel(sb, cwd="/tmp")
    try:
        ex = await k.run("X=7; cd /; echo $X", context="sh", language="bash")
        assert ex.stdout == ["7\n"] and ex.error is None and ex.results == []
        ex = await k.run("echo $X; pwd; echo e >&2; cat; printf tail", context="sh", language="bash")
        assert "".join(ex.stdout) == "7\n/\ntail" and ex.stderr == ["e\n"] and ex.error is None  # in pieces as read
        assert (await k.run("false", context="sh", language="bash")).error == {"name": "", "value": "1",
                                                                               "traceback": ""}
        assert (await k.run("echo ${E:-no}", context="sh", env={"E": "yes"}, language="bash")).stdout == ["yes\n"]
        assert (await k.run("echo ${E:-no}", context="sh", language="bash")).stdout == ["no\n"]
        ex = await k.run("sleep 30; echo not-here", context="sh", timeout=1, language="bash")
        assert ex.error is not None and ex.error["value"] == "130" and ex.stdout == []
        assert (await k.run("echo $X", context="sh", language="bash")).stdout == ["7\n"]
        ex = await k.run("exit 4", context="sh", language="bash")
        assert ex.error is not None and ex.error["value"] == "4" and "next cell starts a fresh shell" in ex.stderr[0]
        assert (await k.run("echo ${X:-fresh}", context="sh", language="bash")).stdout == ["fresh\n"]
        ex = await k.run("sleep 60 >/dev/null 2>&1 & exit 5", context="sh", timeout=20, language="bash")
        assert ex.error is not None and ex.error["value"] == "5"  # a job left behind does not hold the cell
        await k.reset("sh")
        [cwd] = (await k.run("pwd", context="sh", language="bash")).stdout
        assert cwd.endswith("/tmp\n")  # back at its cwd (the process backend's /tmp is a host path)
        assert (await k.run("1 + 1")).text == "2"  # python's default context is unaffected
    finally:
        await k.close()
