"""The quick tier's guard (``scripts/test.sh --quick``; tests/conftest.py): a test the quick tier
runs must start no sandbox and no server. With ``SANDFLEET_QUICK_GUARD=1`` tests/conftest.py
installs :func:`install` in the pytest process and puts this directory on ``PYTHONPATH``, so that
every Python the tests start (``sandfleet ...`` CLI runs) imports this file as its
``sitecustomize`` and is guarded too; a child writes what it refused to ``SANDFLEET_QUICK_GUARD_LOG``
(the test that started it fails at teardown).

Refused: starting bwrap, runsc, QEMU, the guest agent (``sandfleet-agent``), crun, runc, podman or
unshare (also behind env/setpriv/timeout/...), starting ``sandfleet serve`` or chromedriver, and
listen() on a TCP socket (a server). A refusal raises :class:`QuickGuardError` where it happens and is recorded,
so the test fails even if it swallows the error. Tests that do these things belong to the
``sandbox`` marker (tests/conftest.py classifies them; add ``@pytest.mark.sandbox`` by hand to one
it misses)."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from collections.abc import Callable
from typing import Any

FORBIDDEN = frozenset({"bwrap", "runsc", "qemu-system-x86_64", "qemu-system-aarch64", "sandfleet-agent", "crun", "runc",
                       "podman", "unshare"})
"""Executables (basenames) that start a sandbox (unshare: new namespaces, a sandbox by hand)."""
SERVERS = frozenset({"chromedriver", "chromium", "chromium-browser", "google-chrome"})
"""Executables (basenames) that start a server (chromedriver: a WebDriver server, and the browser it drives)."""
WRAPPERS = frozenset({"env", "setpriv", "nsenter", "timeout", "nice", "ionice", "taskset", "chrt", "sudo",
                      "stdbuf", "prlimit", "nohup", "setsid", "systemd-run", "exec", "command"})
"""Commands that run the command after their options: the guard looks past them."""
PROBES = frozenset({"--version", "-version", "version", "--help"})
"""The one argument with which a FORBIDDEN executable only says what it is (doctor's probes)."""


def _base(path: str) -> str:
    return path.rsplit("/", 1)[-1]


class QuickGuardError(RuntimeError):
    """A test in the quick tier started a sandbox or a server."""


def _command(argv: list[str]) -> list[str]:
    """``argv`` past leading wrappers (env VAR=x, timeout 5, setpriv --reuid=1 ...)."""
    i = 0
    while i < len(argv) and _base(argv[i]) in WRAPPERS:
        i += 1
        while i < len(argv) and (argv[i].startswith("-") or "=" in argv[i] or argv[i].replace(".", "").isdigit()):
            i += 1
    return argv[i:]


def refusal(args: Any, executable: Any = None, shell: bool = False) -> str | None:
    """Why the quick tier refuses to start this command (``Popen``'s arguments), or None."""
    if isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(args)
        if shell:
            try:
                words = shlex.split(text, posix=True)
            except ValueError:
                words = text.split()
            # sh -c "a; b | c": each command after a separator
            cmds, cur = [], []
            for w in words:
                if w in {";", "&&", "||", "|", "&", "(", ")"}:
                    cmds.append(cur)
                    cur = []
                elif w.endswith(";"):
                    cur.append(w[:-1])
                    cmds.append(cur)
                    cur = []
                else:
                    cur.append(w)
            cmds.append(cur)
        else:
            cmds = [[text]]
    else:
        cmds = [[os.fsdecode(a) for a in args]]
    cmds = [_command(c) for c in cmds]
    names = {_base(c[0]) for c in cmds if c}
    if executable is not None:
        names.add(_base(os.fsdecode(executable)))
    hit = names & FORBIDDEN
    if hit and all(len(c) == 2 and c[1] in PROBES for c in cmds if c and _base(c[0]) in hit):
        return None  # bwrap --version: a probe, no sandbox
    if hit:
        return f"starts {sorted(hit)[0]} (a sandbox)"
    hit = names & SERVERS
    if hit:
        return f"starts {sorted(hit)[0]} (a server)"
    for c in cmds:
        base = [_base(x) for x in c[:4]]
        if "serve" in base and any(x.startswith("sandfleet") for x in base):
            return "starts sandfleet serve (a server)"
    return None


def install(on_refusal: Callable[[str], None]) -> None:
    """Refuse sandboxes and servers in this process: ``on_refusal(message)``, then raise."""
    if getattr(subprocess.Popen, "_quickguard", False):
        return

    def refuse(why: str, what: str) -> None:
        msg = (f"quick tier: this test {why}: {what[:300]}. A test that starts a sandbox or a server is not "
               "quick: mark it @pytest.mark.sandbox (or teach tests/conftest.py's classifier)")
        on_refusal(msg)
        raise QuickGuardError(msg)

    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def guarded_execute_child(self: subprocess.Popen[Any], args: Any, executable: Any, *rest: Any, **kw: Any) -> Any:
        shell = bool(rest[7]) if len(rest) > 7 else bool(kw.get("shell", False))
        why = refusal(args, executable, shell)
        if why:
            refuse(why, repr(args))
        return execute_child(self, args, executable, *rest, **kw)

    subprocess.Popen._execute_child = guarded_execute_child  # type: ignore[attr-defined]
    subprocess.Popen._quickguard = True  # type: ignore[attr-defined]

    for name in ("posix_spawn", "posix_spawnp"):
        orig = getattr(os, name, None)
        if orig is None:
            continue

        def guarded_spawn(path: Any, argv: Any, *a: Any, _orig: Any = orig, **kw: Any) -> Any:
            why = refusal(list(argv), path)
            if why:
                refuse(why, repr(list(argv)))
            return _orig(path, argv, *a, **kw)

        setattr(os, name, guarded_spawn)

    listen = socket.socket.listen

    def guarded_listen(self: socket.socket, *a: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            try:
                where = repr(self.getsockname())
            except OSError:
                where = "?"
            refuse("listens on a TCP socket (a server)", where)
        listen(self, *a)

    socket.socket.listen = guarded_listen  # type: ignore[method-assign]


def _child() -> None:
    log = os.environ.get("SANDFLEET_QUICK_GUARD_LOG")
    if os.environ.get("SANDFLEET_QUICK_GUARD") != "1" or not log:
        return

    def record(msg: str) -> None:
        try:
            with open(log, "a") as f:
                f.write(f"(in a child process, pid {os.getpid()}) {msg}\n")
        except OSError:
            pass

    install(record)


if __name__ == "sitecustomize":
    _child()
