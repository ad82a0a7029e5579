"""The quick tier's guard (tests/quickguard/sitecustomize.py) and classifier (tests/conftest.py):
what they refuse and what they let through. Starts nothing."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _guard() -> object:
    mod = sys.modules.get("sandfleet_quickguard")
    if mod is None:
        spec = importlib.util.spec_from_file_location("sandfleet_quickguard", HERE / "quickguard" / "sitecustomize.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("args", "shell", "why"), [
    (["/usr/bin/bwrap", "--ro-bind", "/", "/", "true"], False, "bwrap"),
    (["env", "A=1", "timeout", "5", "runsc", "run", "x"], False, "runsc"),
    (["setpriv", "--reuid=1000", "--", "/root/.cache/sandfleet/agent/x/sandfleet-agent", "launch"], False,
     "sandfleet-agent"),
    ("echo hi; exec qemu-system-x86_64 -m 64", True, "qemu-system-x86_64"),
    ([sys.executable, "-m", "sandfleet", "serve", "--port", "0"], False, "sandfleet serve"),
    (["sandfleet", "serve"], False, "sandfleet serve"),
    (["unshare", "--pid", "--fork", "/tmp/agent-asan"], False, "unshare"),
    (["/usr/bin/chromedriver", "--port=0"], False, "chromedriver"),
    (["/usr/bin/bwrap", "--version"], False, None),  # a probe
    (["echo", "bwrap"], False, None),
    ([sys.executable, "-m", "sandfleet", "tasks", "ls"], False, None),
    ("git status", True, None),
])  # fmt: skip
def test_refusal_names_what_starts_a_sandbox_or_a_server(args: object, shell: bool, why: str | None) -> None:
    got = _guard().refusal(args, None, shell)  # type: ignore[attr-defined]
    assert (got is None) if why is None else (got is not None and why in got), got


def test_the_guard_refuses_in_process_and_records(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = _guard()
    if getattr(subprocess.Popen, "_quickguard", False):
        pytest.skip("the guard is installed in this process already (scripts/test.sh --quick)")
    monkeypatch.setattr(subprocess.Popen, "_execute_child", subprocess.Popen._execute_child)  # type: ignore[attr-defined]
    monkeypatch.setattr(socket.socket, "listen", socket.socket.listen)
    monkeypatch.setattr(subprocess.Popen, "_quickguard", False, raising=False)
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, getattr(os, name))
    seen: list[str] = []
    guard.install(seen.append)  # type: ignore[attr-defined]
    with pytest.raises(guard.QuickGuardError, match="starts bwrap"):  # type: ignore[attr-defined]
        subprocess.run(["bwrap", "--unshare-all", "true"], check=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        with pytest.raises(guard.QuickGuardError, match="listens on a TCP socket"):  # type: ignore[attr-defined]
            s.listen()
    assert len(seen) == 2 and "@pytest.mark.sandbox" in seen[0]
    assert subprocess.run(["true"], check=False).returncode == 0  # everything else runs



def test_the_classifier_follows_helpers_within_a_module_and_across_test_modules(tmp_path: Path) -> None:
    import conftest

    (tmp_path / "helpers_x.py").write_text("def boot():\n    return create_sandbox()\n\n\ndef plain():\n    return 1\n")
    (tmp_path / "test_x.py").write_text(
        "from helpers_x import boot, plain\n\n\n"
        "def _indirect():\n    return boot()\n\n\n"
        "def _twice():\n    return _indirect()\n\n\n"
        "def _pure():\n    return plain()\n")  # fmt: skip
    conftest.TESTS, old = tmp_path.resolve(), conftest.TESTS  # find() looks for helpers under tests/
    try:
        module = conftest._Module.of(tmp_path / "test_x.py")
    finally:
        conftest.TESTS = old
    assert module.flagged == {"boot", "_indirect", "_twice"}
