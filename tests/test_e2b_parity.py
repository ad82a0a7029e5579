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

import asyncio
import importlib.util
import os
import re
import threading
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
                                                                  "--swerex-max-output", "64",
                                                                  "--domain", "userinfo"]) as s:
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
        end = sbx.get_info().end_at
        Sandbox.connect(sbx.sandbox_id, timeout=30)  # shorter than the 600 s left: kept
        assert abs((sbx.get_info().end_at - end).total_seconds()) < 5
        Sandbox.connect(sbx.sandbox_id, timeout=700)  # longer: extended
        assert (sbx.get_info().end_at - end).total_seconds() > 60
        row(S, "Sandbox.connect", "works", "class and instance method; timeout only extends the lifetime")
        assert sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]
        row(S, "Sandbox.list", "works", "a paginator; metadata filter (test_e2b.py); no state filter: paused too")
        # users: E2B's `user` with HOME /home/user; root with HOME /root
        r = sbx.commands.run("whoami; echo $HOME; id -u")
        assert r.stdout.split() == ["user", "/home/user", "1000"]
        r = sbx.commands.run("whoami; echo $HOME; cd && pwd", user="root")
        assert r.stdout.split() == ["root", "/root", "/root"]
        row(S, "Sandbox (users)", "works", "default `user` (uid 1000, HOME /home/user); `root` with HOME /root")
        m = sbx.get_metrics()
        assert len(m) >= 1 and m[-1].mem_used > 0 and m[-1].cpu_count >= 1 and m[-1].disk_total > 0
        row(S, "Sandbox.get_metrics", "works",
            "a series of 5 s samples from the sandbox's cgroups (CPU, memory) and df (disk)")
        for name, call in (("pause", sbx.pause), ("beta_pause", sbx.beta_pause)):
            with pytest.raises(SandboxException) as ei:
                call()
            refused(ei.value, "pause with memory")
            row(S, f"Sandbox.{name} (mode=\"full\", the default)", "refused",
                "501 naming the feature; mode=\"filesystem\" works")
        with pytest.raises(SandboxException) as ei:
            sbx.update_network({"deny_out": ["0.0.0.0/0"]})
        refused(ei.value, "update_network")
        row(S, "Sandbox.update_network", "refused", "501: the network is chosen at create")
        # snapshots: a snapshot's id is a template
        sbx.files.write("/home/user/kept.txt", "kept")
        snap = sbx.create_snapshot()
        assert snap.snapshot_id
        row(S, "Sandbox.create_snapshot", "works", "a sandfleet snapshot; its id is a template; running processes "
                                                   "(not kept on bwrap/gvisor) refused by name (test_e2b.py)")
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
        by_host = {"Host": f"8000-{sbx.sandbox_id}.localhost", "e2b-traffic-access-token": sbx.traffic_access_token}
        assert httpx.get(f"{svc.url}/kept.txt", headers=by_host, timeout=30).text == "kept"  # for *.localhost DNS
        row(S, "Sandbox.get_host", "works", "serve --domain userinfo: http://<get_host(port)> reaches the port "
                                            "through the service; a wrong token is 401 (test_e2b.py: *.localhost, "
                                            "--domain DNS names, no network)")
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


def test_sync_pause_filesystem(e2b_env: dict[str, str]) -> None:
    """pause(mode="filesystem") keeps the files under the same id; connect resumes it cold."""
    from e2b import Sandbox, SandboxQuery, SandboxState

    sbx = Sandbox.create(metadata={"suite": "pause"}, timeout=300)
    try:
        sbx.files.write("/home/user/state.txt", "before")
        sbx.commands.run("sleep 600", background=True)
        assert sbx.pause(mode="filesystem") is True
        assert sbx.pause(mode="filesystem") is False  # paused already
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED], metadata={"suite": "pause"}))
        assert [s.sandbox_id for s in paused.next_items()] == [sbx.sandbox_id]
        assert sbx.get_info().state == SandboxState.PAUSED
        running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING], metadata={"suite": "pause"}))
        assert sbx.sandbox_id not in [s.sandbox_id for s in running.next_items()]
        both = Sandbox.list(query=SandboxQuery(metadata={"suite": "pause"})).next_items()  # no state: both
        assert [(s.sandbox_id, s.state) for s in both] == [(sbx.sandbox_id, SandboxState.PAUSED)]
        row(S, "Sandbox.pause (mode=\"filesystem\")", "works",
            "a snapshot; the id stays, listed and get_info'd as paused; again: False")
        back = Sandbox.connect(sbx.sandbox_id)
        assert back.sandbox_id == sbx.sandbox_id and back.get_info().state == SandboxState.RUNNING
        assert back.files.read("/home/user/state.txt") == "before"
        assert back.commands.list() == []  # resumed cold: files kept, processes not
        assert back.commands.run("whoami").stdout == "user\n"
        row(S, "Sandbox.connect (resume)", "works", "the same id, its files, no processes (a cold resume)")
        assert back.beta_pause(mode="filesystem") is True
        back = Sandbox.connect(sbx.sandbox_id)
        assert back.files.read("/home/user/state.txt") == "before"
        row(S, "Sandbox.beta_pause (mode=\"filesystem\")", "works", "as pause")
        back.pause(mode="filesystem")
    finally:
        assert Sandbox.kill(sbx.sandbox_id) is True  # a paused sandbox is killed too
    assert Sandbox.kill(sbx.sandbox_id) is False


def _pty_reader(handle: Any, out: list[bytes]) -> threading.Thread:
    def run() -> None:
        try:
            handle.wait(on_pty=out.append)
        except Exception:
            pass  # ended by disconnect, kill or a non-zero exit: the test checks what it needs

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def _get(url: str) -> httpx.Response | None:
    try:
        r = httpx.get(url, timeout=30)
    except httpx.HTTPError:
        return None
    return r if r.status_code == 200 else None


def test_sync_commands_and_pty(e2b_env: dict[str, str]) -> None:
    from e2b import CommandExitException, PtySize, Sandbox

    sbx = Sandbox.create(timeout=300)
    try:
        seen: list[str] = []
        r = sbx.commands.run("echo out; echo err >&2", on_stdout=seen.append)
        assert (r.stdout, r.stderr, r.exit_code, seen) == ("out\n", "err\n", 0, ["out\n"])
        with pytest.raises(CommandExitException) as ei:
            sbx.commands.run("exit 3")
        assert ei.value.exit_code == 3
        row(S, "commands.run", "works", "foreground, streaming callbacks, non-zero exit raises")
        # stdin for a command started with stdin=True
        h = sbx.commands.run("read a; echo got:$a; cat", background=True, stdin=True)
        sbx.commands.send_stdin(h.pid, "one\n")
        h.send_stdin("two\n")
        row(S, "commands.send_stdin", "works", "while the command runs (commands. and handle.)")
        sbx.commands.close_stdin(h.pid)
        res = h.wait()
        assert res.stdout == "got:one\ntwo\n", res.stdout
        row(S, "commands.close_stdin", "works", "EOF: `cat` ends")
        h = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.stream_input(h.pid, ["a", "b\n"])
        h.close_stdin()
        assert h.wait().stdout == "ab\n"
        row(S, "commands.stream_input", "works", "a client stream of chunks")
        # list, connect to a running process, kill
        h = sbx.commands.run("for i in $(seq 1 200); do echo tick$i; sleep 0.05; done", background=True)
        procs = sbx.commands.list()
        assert h.pid in [p.pid for p in procs]
        row(S, "commands.list", "works", "running processes with their cmd and args")
        h.disconnect()
        row(S, "commands (handle.disconnect)", "works", "the process runs on; connect reattaches")
        again = sbx.commands.connect(h.pid)
        got: list[str] = []
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                again.wait(on_stdout=got.append)
            except BaseException as err:  # the kill below ends it with CommandExitException
                errors.append(err)

        th = threading.Thread(target=reader)
        th.start()
        _until(lambda: any(x.startswith("tick") for x in "".join(got).split()), "new output on the connected stream")
        assert sbx.commands.kill(h.pid) is True
        th.join(30)
        assert not th.is_alive() and isinstance(errors[0], CommandExitException)
        assert sbx.commands.kill(h.pid) is False
        row(S, "commands.connect", "works", "a Connect stream of a running process's new output")
        row(S, "commands.kill", "works", "True, then False once it is gone")
        # a pseudo-terminal
        out: list[bytes] = []
        t = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
        first = _pty_reader(t, out)
        sbx.pty.send_stdin(t.pid, b"tty; stty size\n")
        _until(lambda: b"24 80" in b"".join(out), "stty size in the pty")
        assert b"/dev/pts/" in b"".join(out)
        row(S, "pty.create", "works", "a real terminal (tty: /dev/pts/N), bash -i -l as the SDK starts it")
        row(S, "pty.send_stdin", "works", "keystrokes reach the shell")
        sbx.pty.resize(t.pid, PtySize(rows=40, cols=120))
        sbx.pty.send_stdin(t.pid, b"stty size\n")
        _until(lambda: b"40 120" in b"".join(out), "the new size")
        row(S, "pty.resize", "works", "stty size sees the new size")
        sbx.pty.stream_input(t.pid, [b"echo stre", b"amed\n"])
        _until(lambda: b"streamed" in b"".join(out).replace(b"echo stre", b""), "streamed input")
        row(S, "pty.stream_input", "works", "a client stream of keystrokes")
        t2 = sbx.pty.connect(t.pid)  # a second stream of the same terminal
        sbx.pty.send_stdin(t.pid, b"exit 5\n")
        with pytest.raises(CommandExitException) as ei:
            t2.wait()
        assert ei.value.exit_code == 5
        first.join(30)
        assert not first.is_alive()
        row(S, "pty.connect", "works", "attach another stream; it sees the shell's exit code")
        t = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
        assert sbx.pty.kill(t.pid) is True and sbx.pty.kill(t.pid) is False
        row(S, "pty.kill", "works", "True, then False")
    finally:
        sbx.kill()


def test_sync_files(e2b_env: dict[str, str]) -> None:
    from e2b import FileType, Sandbox
    from e2b.exceptions import NotFoundException, SandboxException

    sbx = Sandbox.create(timeout=300)
    try:
        info = sbx.files.write("/home/user/a/b.txt", "alpha")
        assert info.path == "/home/user/a/b.txt"
        row(S, "files.write", "works", "str, bytes; parents made; as the given user")
        infos = sbx.files.write_files([{"path": "x.txt", "data": "x"}, {"path": "/home/user/y.bin", "data": b"\0y"}])
        assert len(infos) == 2
        row(S, "files.write_files", "works", "several files in one request")
        assert sbx.files.read("/home/user/a/b.txt") == "alpha"
        assert sbx.files.read("y.bin", format="bytes") == b"\0y"
        assert b"".join(sbx.files.read("x.txt", format="stream")) == b"x"
        row(S, "files.read", "works", "text, bytes, stream; missing: FileNotFoundException")
        names = {e.name for e in sbx.files.list("/home/user")}
        assert {"a", "x.txt", "y.bin"} <= names
        row(S, "files.list", "works", "entries with type, size, mode, owner")
        assert sbx.files.exists("x.txt") and not sbx.files.exists("nope")
        row(S, "files.exists", "works", "Stat")
        gi = sbx.files.get_info("/home/user/a")
        assert gi.type == FileType.DIR and gi.owner == "user"
        row(S, "files.get_info", "works", "type, owner `user`")
        assert sbx.files.make_dir("/home/user/d") is True and sbx.files.make_dir("/home/user/d") is False
        row(S, "files.make_dir", "works", "True, then False when it exists")
        moved = sbx.files.rename("/home/user/a/b.txt", "/home/user/d/c.txt")
        assert moved.path == "/home/user/d/c.txt" and sbx.files.read("/home/user/d/c.txt") == "alpha"
        with pytest.raises(NotFoundException):
            sbx.files.rename("/home/user/a/b.txt", "/home/user/d/e.txt")
        row(S, "files.rename", "works", "Move; a missing source is FileNotFoundException")
        sbx.files.remove("/home/user/d")
        assert not sbx.files.exists("/home/user/d")
        row(S, "files.remove", "works", "files and directories")
        w = sbx.files.watch_dir("/home/user")
        sbx.files.write("/home/user/new.txt", "n")
        events = _until(lambda: [e for e in w.get_new_events() if e.name == "new.txt"], "a watch event")
        assert events[0].type.name in ("CREATE", "WRITE")
        w.stop()
        row(S, "files.watch_dir", "works", "CreateWatcher + GetWatcherEvents (polled listings)")
        # permissions are the user's: the default user can't write into /root; root can
        with pytest.raises(SandboxException):
            sbx.files.write("/root/nope.txt", "x")
        sbx.files.write("/root/ok.txt", "x", user="root")
        sbx.commands.run("chmod 600 /root/ok.txt", user="root")
        with pytest.raises(SandboxException):
            sbx.files.read("/root/ok.txt")
        assert sbx.files.read("/root/ok.txt", user="root") == "x"
        row(S, "files (permissions)", "works", "checked as the user: `user` is denied in /root, `root` is not")
    finally:
        sbx.kill()


A = "e2b async"


def test_async_sdk(e2b_env: dict[str, str], svc: RunningService) -> None:
    from e2b import AsyncSandbox, CommandExitException, PtySize
    from e2b.exceptions import NotFoundException, SandboxException

    async def until(pred: Any, what: str, timeout: float = 20.0) -> None:
        t_end = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > t_end:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.05)

    async def main() -> None:
        sbx = await AsyncSandbox.create(envs={"K": "v"}, metadata={"suite": "async"}, timeout=300)
        row(A, "AsyncSandbox.create", "works", "envs, metadata, timeout")
        try:
            assert await sbx.is_running()
            row(A, "AsyncSandbox.is_running", "works", "True while alive, False after kill")
            assert (await sbx.get_info()).metadata == {"suite": "async"}
            row(A, "AsyncSandbox.get_info", "works", "id, metadata")
            await sbx.set_timeout(600)
            row(A, "AsyncSandbox.set_timeout", "works", "the TTL moves")
            other = await AsyncSandbox.connect(sbx.sandbox_id)
            assert (await other.commands.run("echo $K")).stdout == "v\n"
            row(A, "AsyncSandbox.connect", "works", "by id")
            pager = AsyncSandbox.list()
            assert sbx.sandbox_id in [s.sandbox_id for s in await pager.next_items()]
            row(A, "AsyncSandbox.list", "works", "a paginator")
            m = await sbx.get_metrics()
            assert m and m[0].mem_used > 0
            row(A, "AsyncSandbox.get_metrics", "works", "cgroups and df")
            for name in ("pause", "beta_pause"):
                with pytest.raises(SandboxException) as ei:
                    await getattr(sbx, name)()
                refused(ei.value, "pause with memory")
                row(A, f"AsyncSandbox.{name} (mode=\"full\", the default)", "refused", "501 naming the feature")
            with pytest.raises(SandboxException) as ei:
                await sbx.update_network({"deny_out": ["0.0.0.0/0"]})
            refused(ei.value, "update_network")
            row(A, "AsyncSandbox.update_network", "refused", "501 naming the feature")
            await sbx.files.write("/home/user/k.txt", "kept")
            snap = await sbx.create_snapshot()
            row(A, "AsyncSandbox.create_snapshot", "works", "its id is a template")
            assert snap.snapshot_id in [s.snapshot_id for s in await AsyncSandbox.list_snapshots().next_items()]
            row(A, "AsyncSandbox.list_snapshots", "works", "this token's snapshots")
            kids = await sbx.fork(count=1)
            assert isinstance(kids[0], AsyncSandbox)
            assert await kids[0].files.read("/home/user/k.txt") == "kept"
            await kids[0].kill()
            row(A, "AsyncSandbox.fork", "works", "a child with the parent's files")
            assert await AsyncSandbox.delete_snapshot(snap.snapshot_id) is True
            row(A, "AsyncSandbox.delete_snapshot", "works", "True")
            # commands
            got: list[str] = []
            r = await sbx.commands.run("echo a; echo b >&2", on_stdout=got.append)
            assert (r.stdout, r.stderr, got) == ("a\n", "b\n", ["a\n"])
            row(A, "commands.run", "works", "foreground and background, callbacks")
            h = await sbx.commands.run("read x; echo got:$x; cat", background=True, stdin=True)  # cat: until EOF
            await sbx.commands.send_stdin(h.pid, "in\n")
            row(A, "commands.send_stdin", "works", "while it runs")
            await sbx.commands.close_stdin(h.pid)
            assert (await h.wait()).stdout == "got:in\n"
            row(A, "commands.close_stdin", "works", "EOF")
            h = await sbx.commands.run("cat", background=True, stdin=True)
            ih = sbx.commands.stream_input(h.pid)
            await ih.send("x")
            await ih.send("y\n")
            await ih.close()
            await h.close_stdin()
            assert (await h.wait()).stdout == "xy\n"
            row(A, "commands.stream_input", "works", "a client stream")
            h = await sbx.commands.run("while :; do echo tick; sleep 0.05; done", background=True)
            assert h.pid in [p.pid for p in await sbx.commands.list()]
            row(A, "commands.list", "works", "running processes")
            seen: list[str] = []
            again = await sbx.commands.connect(h.pid, on_stdout=seen.append)
            await until(lambda: "tick" in "".join(seen), "output on the connected stream")
            row(A, "commands.connect", "works", "a Connect stream with callbacks")
            assert await sbx.commands.kill(h.pid) is True and await sbx.commands.kill(h.pid) is False
            with pytest.raises(CommandExitException):
                await again.wait()
            row(A, "commands.kill", "works", "True, then False")
            # pty
            out: list[bytes] = []
            t = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=out.append, timeout=60)
            await sbx.pty.send_stdin(t.pid, b"stty size\n")
            await until(lambda: b"24 80" in b"".join(out), "the pty's size")
            row(A, "pty.create", "works", "a real terminal, output through on_data")
            row(A, "pty.send_stdin", "works", "keystrokes reach the shell")
            await sbx.pty.resize(t.pid, PtySize(rows=30, cols=100))
            await sbx.pty.send_stdin(t.pid, b"stty size\n")
            await until(lambda: b"30 100" in b"".join(out), "the new size")
            row(A, "pty.resize", "works", "stty size sees it")
            async with sbx.pty.stream_input(t.pid) as keys:
                await keys.send(b"echo str")
                await keys.send(b"eam\n")
            await until(lambda: b"stream" in b"".join(out).replace(b"echo str", b""), "streamed keystrokes")
            row(A, "pty.stream_input", "works", "a client stream")
            more: list[bytes] = []
            t2 = await sbx.pty.connect(t.pid, on_data=more.append)
            await sbx.pty.send_stdin(t.pid, b"echo again\n")
            await until(lambda: b"again" in b"".join(more), "output on the second stream")
            row(A, "pty.connect", "works", "a second stream of the terminal")
            assert await sbx.pty.kill(t.pid) is True and await sbx.pty.kill(t.pid) is False
            for handle in (t, t2):
                with pytest.raises(CommandExitException):
                    await handle.wait()
            row(A, "pty.kill", "works", "True, then False")
            # files
            await sbx.files.write("/home/user/f/a.txt", "A")
            row(A, "files.write", "works", "parents made")
            await sbx.files.write_files([{"path": "/home/user/f/b.txt", "data": "B"}])
            row(A, "files.write_files", "works", "several files")
            assert await sbx.files.read("/home/user/f/a.txt") == "A"
            row(A, "files.read", "works", "text")
            assert {e.name for e in await sbx.files.list("/home/user/f")} == {"a.txt", "b.txt"}
            row(A, "files.list", "works", "entries")
            assert await sbx.files.exists("/home/user/f/a.txt")
            row(A, "files.exists", "works", "Stat")
            assert (await sbx.files.get_info("/home/user/f/a.txt")).size == 1
            row(A, "files.get_info", "works", "size, type")
            assert await sbx.files.make_dir("/home/user/g") is True
            row(A, "files.make_dir", "works", "True for a new directory")
            assert (await sbx.files.rename("/home/user/f/b.txt", "/home/user/g/b.txt")).path == "/home/user/g/b.txt"
            with pytest.raises(NotFoundException):
                await sbx.files.rename("/home/user/f/b.txt", "/home/user/g/c.txt")
            row(A, "files.rename", "works", "Move")
            await sbx.files.remove("/home/user/g")
            assert not await sbx.files.exists("/home/user/g")
            row(A, "files.remove", "works", "a directory")
            events: list[Any] = []
            w = await sbx.files.watch_dir("/home/user/f", on_event=events.append)
            await sbx.files.write("/home/user/f/new.txt", "n")
            await until(lambda: any(e.name == "new.txt" for e in events), "a WatchDir event")
            await w.stop()
            row(A, "files.watch_dir", "works", "a WatchDir stream (polled listings)")
            with pytest.raises(SandboxException):
                await sbx.files.write("/root/nope.txt", "x")
            row(A, "files (permissions)", "works", "as the user: `user` is denied in /root")
            # ports, signed URLs, git
            await sbx.commands.run("python3 -m http.server 8001 --bind 127.0.0.1 -d /home/user/f", background=True)
            host = sbx.get_host(8001)
            async with httpx.AsyncClient(timeout=30) as client:
                body = b""
                t_end = time.monotonic() + 20
                while body != b"A":
                    assert time.monotonic() < t_end, "the sandbox's web server did not answer"
                    try:
                        body = (await client.get(f"http://{host}/a.txt")).content
                    except httpx.HTTPError:
                        await asyncio.sleep(0.1)
                row(A, "AsyncSandbox.get_host", "works", "reaches the port through the service")
                assert (await client.get(sbx.download_url("/home/user/f/a.txt"))).content == b"A"
                row(A, "AsyncSandbox.download_url", "works", "a signed URL")
                up = await client.post(sbx.upload_url("/home/user/f/u.txt"), files={"file": ("u.txt", b"U")})
                assert up.status_code == 200 and await sbx.files.read("/home/user/f/u.txt") == "U"
                row(A, "AsyncSandbox.upload_url", "works", "a signed URL")
            await sbx.git.init("/home/user/repo")
            assert not (await sbx.git.status("/home/user/repo")).file_status
            row(A, "AsyncSandbox.git", "works", "git.init, git.status")
            h = await sbx.commands.run("sleep 3; echo late", background=True)
            await h.disconnect()
            again = await sbx.commands.connect(h.pid)
            assert (await again.wait()).exit_code == 0
            row(A, "commands (handle.disconnect)", "works", "the process runs on; connect reattaches")
        finally:
            assert await sbx.kill() is True
        assert not await sbx.is_running()
        row(A, "AsyncSandbox.kill", "works", "True")

    asyncio.run(main())


R = "swe-rex"


def test_swerex_runtime(svc: RunningService, tmp_path: Path) -> None:
    from swerex.exceptions import CommandTimeoutError, NonZeroExitCodeError, SwerexException
    from swerex.runtime.abstract import (
        BashAction,
        BashInterruptAction,
        CloseBashSessionRequest,
        Command,
        CreateBashSessionRequest,
        ReadFileRequest,
        UploadRequest,
        WriteFileRequest,
    )
    from swerex.runtime.remote import RemoteRuntime

    r = httpx.post(f"{svc.url}/v1/sandboxes", json={"limits": {"ttl_s": 300}},
                   headers={"Authorization": f"Bearer {svc.token}"}, timeout=60)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    (tmp_path / "up.txt").write_text("uploaded\n")

    async def main() -> None:
        rt = RemoteRuntime(host=f"{svc.url}/swerex/{sid}", port=None, auth_token=svc.token)
        assert (await rt.is_alive()).is_alive
        row(R, "RemoteRuntime.is_alive", "works", "True while the sandbox lives")
        await rt.create_session(CreateBashSessionRequest())
        row(R, "RemoteRuntime.create_session", "works", "a bash session (startup_source too)")
        obs = await rt.run_in_session(BashAction(command="cd /tmp && export X=1"))
        obs = await rt.run_in_session(BashAction(command="pwd; echo $X"))
        assert obs.output.split() == ["/tmp", "1"]
        with pytest.raises(NonZeroExitCodeError):
            await rt.run_in_session(BashAction(command="false", check="raise"))
        with pytest.raises(CommandTimeoutError):
            await rt.run_in_session(BashAction(command="sleep 30", timeout=1))
        row(R, "RemoteRuntime.run_in_session", "works", "cwd and variables persist; check; timeout")
        # an interrupt reaches the session's running command
        long = asyncio.create_task(rt.run_in_session(BashAction(
            command="trap 'echo caught-int; exit 130' INT; touch /tmp/ready; while :; do sleep 0.1; done",
            timeout=60, check="ignore")))
        t_end = time.monotonic() + 30
        while (await rt.execute(Command(command=["test", "-f", "/tmp/ready"]))).exit_code != 0:
            assert time.monotonic() < t_end, "the session's command did not start"
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        iobs = await rt.run_in_session(BashInterruptAction())
        done = await asyncio.wait_for(long, 30)
        assert "caught-int" in done.output and iobs.failure_reason == "", (done.output, iobs)
        assert time.monotonic() - t0 < 10
        row(R, "RemoteRuntime.run_in_session (BashInterruptAction)", "works",
            "SIGINT to the running command (its trap runs)")
        # output over --swerex-max-output (64 KiB here) is cut, and the response says so
        big = await rt.run_in_session(BashAction(command="head -c 200000 /dev/zero | tr '\\0' x", check="ignore"))
        assert len(big.output) < 70_000 and "truncated by sandfleet" in big.output
        assert "output truncated" in big.failure_reason and "--swerex-max-output" in big.failure_reason
        row(R, "RemoteRuntime.run_in_session (long output)", "works",
            "cut at --swerex-max-output; failure_reason and the output's last line say so")
        # interactive commands: a program on a pty, typed into, read up to an expect string
        obs = await rt.run_in_session(BashAction(command="python3 -q", is_interactive_command=True,
                                                 expect=[">>> "], timeout=30))
        assert obs.expect_string == ">>> "
        obs = await rt.run_in_session(BashAction(command="print(6 * 7)", is_interactive_command=True,
                                                 expect=[">>> "], timeout=30))
        assert (obs.output, obs.expect_string) == ("42", ">>> "), obs
        with pytest.raises(SwerexException):  # a plain command while the program runs: refused, named
            await rt.run_in_session(BashAction(command="ls"))
        obs = await rt.run_in_session(BashAction(command="exit()", is_interactive_quit=True, timeout=30))
        assert (await rt.run_in_session(BashAction(command="echo back; pwd"))).output.split() == ["back", "/tmp"]
        row(R, "RemoteRuntime.run_in_session (interactive)", "works",
            "python3 on a pty: prompt, input, quit; the session goes on")
        obs = await rt.run_in_session(BashAction(command='read -p "Name? " n; echo "hi $n"', expect=["Name? "],
                                                 timeout=30))
        assert obs.expect_string == "Name? " and obs.exit_code is None
        obs = await rt.run_in_session(BashAction(command="bob", is_interactive_command=True, expect=["never"],
                                                 timeout=30))
        assert obs.output.endswith("hi bob") and obs.expect_string == "", obs
        row(R, "RemoteRuntime.run_in_session (expect)", "works",
            "a command stops at an expect string; its answer is typed in")
        await rt.close_session(CloseBashSessionRequest())
        row(R, "RemoteRuntime.close_session", "works", "the session is gone")
        res = await rt.execute(Command(command=["sh", "-c", "echo o; echo e >&2; exit 2"]))
        assert (res.stdout, res.stderr, res.exit_code) == ("o\n", "e\n", 2)
        row(R, "RemoteRuntime.execute", "works", "stdout, stderr, exit code")
        await rt.write_file(WriteFileRequest(path="/tmp/w/f.txt", content="hello"))
        row(R, "RemoteRuntime.write_file", "works", "parents made")
        assert (await rt.read_file(ReadFileRequest(path="/tmp/w/f.txt"))).content == "hello"
        row(R, "RemoteRuntime.read_file", "works", "text")
        await rt.upload(UploadRequest(source_path=str(tmp_path / "up.txt"), target_path="/tmp/up.txt"))
        assert (await rt.read_file(ReadFileRequest(path="/tmp/up.txt"))).content == "uploaded\n"
        row(R, "RemoteRuntime.upload", "works", "a file, or a directory as a zip")
        await rt.close()
        async with httpx.AsyncClient(timeout=30) as h:
            r = await h.get(f"{svc.url}/v1/sandboxes/{sid}", headers={"Authorization": f"Bearer {svc.token}"})
        assert r.status_code in (404, 410)
        row(R, "RemoteRuntime.close", "works", "ends the sandbox (SWE-agent's remote deployment stops so)")

    asyncio.run(main())


def test_background_processes_hold_no_busy_slot(e2b_env: dict[str, str], svc: RunningService) -> None:
    """--max-busy 2 here: 8 background processes (sleeping, listening) in 4 sandboxes hold no
    slot, and a foreground command in another sandbox runs (before: it waited, then 429)."""
    from e2b import Sandbox

    boxes = [Sandbox.create(timeout=120) for _ in range(4)]
    probe = Sandbox.create(timeout=120)
    try:
        for i, sb in enumerate(boxes):
            sb.commands.run("sleep 300", background=True)
            sb.commands.run(f"python3 -m http.server {9000 + i} --bind 127.0.0.1", background=True)
        _until(lambda: all(len(sb.commands.list()) == 2 for sb in boxes), "8 running background processes")

        def info() -> dict[str, Any]:
            r = httpx.get(f"{svc.url}/v1/info", headers={"Authorization": f"Bearer {svc.token}"}, timeout=30)
            return dict(r.json())

        # each start takes a slot for a moment; once all 8 run, none is held
        _until(lambda: info()["busy"] == 0, "no busy slot held by the 8 running background processes")
        assert info()["max_busy"] == 2 and all(len(sb.commands.list()) == 2 for sb in boxes)
        for _ in range(5):
            assert probe.commands.run("echo ok", timeout=30).stdout == "ok\n"
    finally:
        for sb in [*boxes, probe]:
            sb.kill()
