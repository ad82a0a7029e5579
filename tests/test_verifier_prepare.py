"""The verifier's preparation in one process (the guest agent's ``prepare``, agent/prepare.c)
against its shell script (``PREPARE`` in rollout/verifier.py, ``SANDFLEET_NATIVE_HELPERS=0``):
the same agent leaves the same mess, and the tests see the same folders, owners, modes, git
configs, hooks, notes and preload line after either."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import backend_skip
from sandfleet.rollout import ScriptedPolicy
from test_rollout_support import make_task, run

# what an agent (uid 1000, in /app) leaves for the verifier to clear, hand over or note
MESS = [
    # a git folder with a config key off the allowlist and a hook; a pointer out of the workdir
    "mkdir -p /app/.git/hooks /app/.git/objects /app/.git/refs && echo 'ref: refs/heads/main' > /app/.git/HEAD"
    " && printf '[core]\\n\\tbare = false\\n\\tfsmonitor = /app/evil.sh\\n[alias]\\n\\tx = !sh\\n' > /app/.git/config"
    " && printf 'exit 0\\n' > /app/.git/hooks/pre-commit && mkdir -p /app/sub && echo 'gitdir: /tmp/elsewhere' >"
    " /app/sub/.git",
    # names git uses, not in a git folder: left alone
    "mkdir -p /app/config/hooks /app/site && echo a > /app/config/config && echo b > /app/site/config",
    # conftest at depth 1, 2 and 4 (not noted), a .pth of a virtual environment, tool configuration
    "mkdir -p /app/a/b/c /app/venv/lib/python3.11/site-packages && touch /app/conftest.py /app/a/conftest.py"
    " /app/a/b/c/conftest.py && echo 'import os' > /app/venv/lib/python3.11/site-packages/evil.pth"
    " && printf '[pytest]\\n  addopts = -p evil\\n' > /app/pytest.ini && touch /app/.npmrc /app/tox.ini",
    # modules: a standard library name, a package, a folder named like a module, a dangling link
    "mkdir -p /app/pkg /app/dir.py && touch /app/json.py /app/b.py /app/pkg/__init__.py && ln -s /nowhere /app/gone.py"
    " && ln -s /etc /app/etc-link",
    # the shared temporary folders: the agent's files four levels down are handed over, deeper not
    "mkdir -p /tmp/d1/d2/d3/d4/d5 /dev/shm/s && touch /tmp/f /tmp/d1/d2/d3/four /tmp/d1/d2/d3/d4/five"
    " /var/tmp/v /dev/shm/s/x",
    # the reward folder: a planted reward, a folder and a link in it
    "mkdir -p /logs/verifier/sub && echo 1 > /logs/verifier/reward.txt && ln -s /etc /logs/verifier/link",
    # links into the tests' and the reward folders (removed: round XVII's answer-key-link), directly, relative,
    # through a link in /tmp and through /proc/self/root; one through /proc/self/cwd (removed: what it names is
    # the reader's); links elsewhere (kept)
    "ln -s /tests/expected.txt /app/out-link && ln -s ../logs/verifier/reward.txt /app/r-link && ln -s /tests/x"
    " /tmp/key && ln -s /tmp/key /app/chain && mkdir -p /home/agent/d && ln -s /proc/self/root/tests /home/agent/d/t"
    " && ln -s /tmp /app/tmp-link && ln -s /logs /app/logs-link && ln -s /proc/self/cwd/expected.txt /app/cwd-link"
    " && mkdir -p /logs/agent && ln -s /tests/expected.txt /logs/agent/k",
    # a way into the reward folder and out again through another link of the agent's (removed, both: round
    # XVIII's answer-key-climb), a chain of 11 links that three links enter and that ends elsewhere, and a
    # loop (kept)
    "ln -s /logs/verifier/a /tmp/work && ln -s /tmp/work/../../tests/expected.txt /app/climb && mkdir -p /tmp/c"
    " && for i in $(seq 0 9); do ln -s /tmp/c/$((i + 1)) /tmp/c/$i; done && ln -s /etc /tmp/c/10"
    " && for i in 1 2 3; do ln -s /tmp/c/0 /app/c$i; done && ln -s /tmp/loop2 /tmp/loop1 && ln -s /tmp/loop1"
    " /tmp/loop2 && ln -s /tmp/loop1/x /app/loop",
]

DUMP = r"""#!/bin/bash
echo "HOME=$HOME uid=$(id -u)"
for d in /logs /tests /app /tmp /var/tmp /dev/shm /home/agent; do find "$d" -printf '%p %U %G %m %y\n' 2>/dev/null
done |
  LC_ALL=C sort
echo "--- git config"; cat /app/.git/config
echo "--- hooks"; ls -A /app/.git/hooks
echo "--- sub"; ls -A /app/sub
echo "--- preload"; cat /etc/ld.so.preload 2>/dev/null
mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt
"""

# a PATH with folders the agent could write (its home's, one it may make in /tmp) and ones it could not
# (missing where only root may make it, the system's): the first two are flagged (round XVII)
AGENT_PATH_IMAGE = ("FROM python:3.11-slim-bookworm\nWORKDIR /app\nENV PATH=/home/agent/bin:/tmp/tools:/opt/nothing:"
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n")

# the names each run makes fresh: mktemp's suffixes, the homes' tokens
RANDOM = re.compile(r"(sandfleet-verifier-(?:home|py)\.|sandfleet-(?:code|tests)-home\.|sandfleet-tests-python\."
                    r"|-session-)[A-Za-z0-9]+")


def normal(text: str) -> str:
    return RANDOM.sub(r"\1X", text)


def on(backend: str) -> str:
    why = backend_skip(backend)
    if why:
        pytest.skip(why)
    return backend


@pytest.mark.parametrize("backend", ["bwrap", "gvisor", pytest.param("microvm", marks=pytest.mark.slow)])
async def test_the_agents_prepare_leaves_what_the_script_leaves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                backend: str) -> None:
    task = make_task(tmp_path, test_sh=DUMP, solve="true", dockerfile=AGENT_PATH_IMAGE)
    rows = {}
    for how in ("agent", "script"):
        monkeypatch.setenv("SANDFLEET_NATIVE_HELPERS", "1" if how == "agent" else "0")
        r = (await run([task], ScriptedPolicy(MESS), backend=on(backend))).results[0]
        assert r.status == "completed" and r.reward == 1.0, (r.error, r.verifier_output[-2000:])
        spans = [s for s in r.spans if s.get("what") == "clear tests and rewards"]
        assert [s.get("by") for s in spans] == [how]
        rows[how] = r
    agent, script = rows["agent"], rows["script"]
    out_a, out_s = normal(agent.verifier_output), normal(script.verifier_output)
    assert out_a == out_s
    # what the two found, and what they did with it
    assert agent.info["verifier_risks"] == script.info["verifier_risks"]
    risks = "\n".join(agent.info["verifier_risks"])
    for note in ("git: removed /app/sub/.git (leads to /tmp/elsewhere)", "fsmonitor", "emptied /app/.git/hooks",
                 "/app/conftest.py", "/app/a/conftest.py", "evil.pth", "/app/pytest.ini", "/app/.npmrc",
                 "'json'"):
        assert note in risks, note
    assert "/app/a/b/c/conftest.py" not in risks and "/app/tox.ini" not in risks and "/app/site/config" not in risks
    assert "fsmonitor" not in out_a.split("--- git config")[1].split("---")[0]
    assert "pre-commit" not in out_a.split("--- hooks")[1].split("---")[0]
    lines = set(out_a.splitlines())
    # the reward folder's parent root's and closed (it was the agent's, 0777); the folder root's, for the
    # tests' user to write (0777), or root's alone where the tests run as root (gVisor: no Landlock, the split)
    assert "/logs 0 0 755 d" in lines and ({"/logs/verifier 0 0 777 d", "/logs/verifier 0 0 755 d"} & lines), out_a
    if backend != "microvm":  # where the agent is a user (on microvm every command is root)
        assert "/tmp/d1/d2/d3/four 1001 1000 644 f" in lines, out_a  # handed to the tests' user
        assert "/tmp/d1/d2/d3/d4/five 1000 1000 644 f" in lines  # five levels down: left
    assert not any(line.startswith("/logs/verifier/sub") or line.startswith("/logs/verifier/link") for line in lines)
    names = {line.split(" ")[0] for line in lines}
    gone = {"/app/out-link", "/app/r-link", "/app/chain", "/tmp/key", "/home/agent/d/t", "/app/cwd-link",
            "/logs/agent/k", "/app/climb", "/tmp/work"}
    assert not gone & names, out_a
    assert {"/app/tmp-link", "/app/logs-link", "/home/agent/d", "/app/c1", "/app/c2", "/app/c3", "/tmp/c/0",
            "/tmp/c/10", "/tmp/loop1", "/tmp/loop2", "/app/loop"} <= names, out_a
    for removed in sorted(gone):
        assert f"removed before the tests: {removed}" in risks, (removed, risks)
    flagged = {r.rsplit(": ", 1)[1] for r in agent.info["verifier_risks"] if "the tests' PATH" in r}
    # (on microvm every command is root: a root agent's case, nothing is flagged)
    assert flagged == (set() if backend == "microvm" else {"/home/agent/bin", "/tmp/tools"}), flagged


async def test_what_the_agents_prepare_gives_up_on_the_script_does_from_the_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A workdir deeper than the agent's walk goes (200 levels): it stops at its first walk,
    after it cleared the folders, and the script prepares everything again; the tests see
    what they see after the script alone."""
    deep = "d=/app/deep; for i in $(seq 210); do d=$d/x; done; mkdir -p $d && touch $d/conftest.py"
    task = make_task(tmp_path, test_sh=DUMP, solve="true")
    outs = {}
    for native in ("1", "0"):
        monkeypatch.setenv("SANDFLEET_NATIVE_HELPERS", native)
        r = (await run([task], ScriptedPolicy([*MESS, deep]), backend=on("bwrap"))).results[0]
        assert r.status == "completed" and r.reward == 1.0, (r.error, r.verifier_output[-2000:])
        assert [s.get("by") for s in r.spans if s.get("what") == "clear tests and rewards"] == ["script"]
        outs[native] = (normal(r.verifier_output), r.info["verifier_risks"])
    assert outs["1"] == outs["0"]
    assert "/app/deep" + "/x" * 200 in outs["1"][0]
