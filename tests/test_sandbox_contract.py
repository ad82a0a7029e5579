"""The sandbox contract, run against every backend this host has, and against the remote
backend: a real ``sandfleet serve`` on loopback (its default backend), through sandfleet.client."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conftest import BACKENDS, backend_skip
from sandfleet.errors import ConfigError, GuestError, GuestFileNotFoundError, SandboxClosedError, SandboxPathError
from sandfleet.sandbox import create_sandbox, fork
from sandfleet.sandbox.base import Sandbox, Snapshot
from sandfleet.sandbox.state import state_root
from support import running, until

REMOTE = "remote"


@pytest.fixture(scope="module")
def service(running_services: Any) -> Any:
    """The session's shared service, with two tokens of this module's own (tests/conftest.py)."""
    return running_services.view()


@pytest.fixture(params=[*BACKENDS, REMOTE])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == REMOTE:
        if importlib.util.find_spec("fastapi") is None:
            pytest.skip("the service needs the server extra (pip install -e '.[server]')")
        return REMOTE
    why = backend_skip(request.param)
    if why:
        pytest.skip(why)
    return str(request.param)


@pytest.fixture
async def remote(backend: str, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A client of the module's service when the backend is remote, else None."""
    if backend != REMOTE:
        yield None
        return
    from sandfleet.client import connect

    svc = request.getfixturevalue("service")
    async with await connect(svc.url, svc.token) as client:
        yield client


async def _create(backend: str, remote: Any, **kw: Any) -> Sandbox:
    if remote is not None:
        box: Sandbox = await remote.create_sandbox(**kw)
        return box
    return await create_sandbox(backend=backend, **kw)


async def _fork(snap: Snapshot, n: int) -> list[Sandbox]:
    own = getattr(snap, "fork", None)  # a remote snapshot forks on its service
    return list(await own(n)) if own is not None else await fork(snap, n)


@pytest.fixture
async def sb(backend: str, remote: Any) -> AsyncIterator[Sandbox]:
    box = await _create(backend, remote, ttl_s=300)
    try:
        yield box
    finally:
        await box.close()


async def test_exec_argv_and_shell(sb: Sandbox) -> None:
    r = await sb.exec(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
    r = await sb.exec("x=41; echo $((x+1))")
    assert r.stdout == "42\n" and r.ok


async def test_exec_cwd_env_stdin(sb: Sandbox) -> None:
    await sb.exec("mkdir -p sub")
    r = await sb.exec("pwd; echo $FOO; cat", cwd="sub", env={"FOO": "bar"}, stdin="piped")
    lines = r.stdout.splitlines()
    assert lines[0].endswith("/work/sub") and lines[1:] == ["bar", "piped"]


async def test_exec_bad_cwd_and_program(sb: Sandbox) -> None:
    with pytest.raises(GuestError, match="nope"):
        await sb.exec(["true"], cwd="/work/nope")
    with pytest.raises(GuestError, match="no-such-program"):
        await sb.exec(["no-such-program"])
    assert (await sb.exec(["true"])).ok  # the sandbox carries on


async def test_a_program_is_found_on_the_commands_own_path_as_execvp_finds_it(sb: Sandbox) -> None:
    """The guest searches PATH itself (asking each directory before an exec: issue 46), with
    execvp's rules: the command's PATH, the first executable match, a match that may not be run
    skipped but remembered (EACCES when nothing else matches), an empty element for the working
    folder, and a name with a slash not searched."""
    await sb.exec("mkdir -p a b c && printf '#!/bin/sh\\necho a\\n' > a/tool && printf '#!/bin/sh\\necho b\\n' > b/tool"
                  " && cp b/tool c/tool && chmod +x b/tool c/tool && printf '#!/bin/sh\\necho here\\n' > here"
                  " && chmod +x here")
    work = (await sb.exec("pwd")).stdout.strip()
    path = f"{work}/nope:{work}/a:{work}/b:{work}/c"
    r = await sb.exec(["tool"], env={"PATH": path})  # a/tool is not executable: b's runs
    assert (r.exit_code, r.stdout) == (0, "b\n")
    with pytest.raises(GuestError, match="(?i)permission denied"):  # only a/tool, not executable
        await sb.exec(["tool"], env={"PATH": f"{work}/nope:{work}/a"})
    with pytest.raises(GuestError, match="(?i)no such file"):
        await sb.exec(["tool"], env={"PATH": f"{work}/nope"})
    assert (await sb.exec(["here"], env={"PATH": f"{work}/nope:"})).stdout == "here\n"  # "" is the cwd
    assert (await sb.exec(["./here"], env={"PATH": f"{work}/nope"})).stdout == "here\n"
    assert (await sb.exec([f"{work}/c/tool"], env={"PATH": ""})).stdout == "b\n"


async def test_exec_unknown_option_is_named(sb: Sandbox) -> None:
    """exec takes its options as one bundle (ExecOptions): a misspelt one from an untyped caller
    is refused by name, never dropped."""
    opts: dict[str, Any] = {"timout": 5}
    with pytest.raises(ConfigError, match="no option timout .*timeout"):
        await sb.exec(["true"], **opts)
    assert (await sb.exec(["true"], **{"timeout": 5})).ok


async def test_timeout_kills_whole_tree(sb: Sandbox) -> None:
    # a child that escapes the process group with setsid and ignores SIGTERM must die too
    r = await sb.exec("trap '' TERM; setsid sh -c 'trap \"\" TERM; sleep 300.417' & sleep 300.417", timeout=0.5)
    assert r.timed_out and r.exit_code == 137
    left = await sb.exec("ps -eo args | grep -c '[s]leep 300.417' || true")
    assert left.stdout.strip() == "0"


async def test_output_cap_truncates_and_says_so(sb: Sandbox) -> None:
    # 300 MB through the pipe; 3 MB on a microVM, where TCG emulation makes pipes ~100x slower, and
    # 30 MB on gvisor, whose ptrace platform makes them ~10x slower (300 MB took 30 s of a 2-core
    # host's fast pass; the cap is the guest agent's, the same on every backend: issue 43)
    size = {"microvm": 3_000_000, "gvisor": 30_000_000}.get(sb.backend, 300_000_000)
    r = await sb.exec(f"head -c {size} /dev/zero | tr '\\0' x", max_output=1000, timeout=60)
    assert r.exit_code == 0 and r.truncated
    assert r.stdout_dropped == size - 1000
    assert r.stdout.startswith("x" * 1000) and "truncated" in r.stdout


async def test_streaming_output(sb: Sandbox) -> None:
    chunks: list[tuple[str, bytes]] = []
    r = await sb.exec("echo a; sleep 0.2; echo b >&2", on_output=lambda s, b: chunks.append((s, b)))
    assert r.ok
    assert b"".join(b for s, b in chunks if s == "stdout") == b"a\n"
    assert b"".join(b for s, b in chunks if s == "stderr") == b"b\n"


async def test_session_keeps_state_and_survives_timeout(sb: Sandbox) -> None:
    s = sb.session()
    await s.run("mkdir -p d && cd d && export A=1 && B=2 && f() { echo fn$1; }")
    r = await s.run("pwd; echo $A $B; f 3")
    out = r.stdout.splitlines()
    assert out[0].endswith("/work/d") and out[1:] == ["1 2", "fn3"]
    r = await s.run("cd /; C=9; sleep 30", timeout=0.5)
    assert r.timed_out and s.usable
    r = await s.run("pwd; echo ${C:-unset} $A")
    assert r.stdout.splitlines()[0].endswith("/work/d") and r.stdout.splitlines()[1] == "unset 1"
    await s.close()


async def test_files_roundtrip(sb: Sandbox) -> None:
    await sb.write_file("a/b/c.txt", b"hello\x00bytes", mode=0o600)
    assert await sb.read_file("a/b/c.txt") == b"hello\x00bytes"
    # stat, else find (gVisor 20221219's statx refuses stat's flags; busybox find has no -printf)
    r = await sb.exec("stat -c %a a/b/c.txt 2>/dev/null || find a/b/c.txt -printf %m")
    assert r.stdout.strip() == "600"
    with pytest.raises(GuestFileNotFoundError):
        await sb.read_file("missing.txt")


async def test_upload_download_dirs(sb: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "inner").mkdir(parents=True)
    (src / "inner" / "x.txt").write_text("x")
    (src / "top.txt").write_text("top")
    await sb.upload(src, "dest")
    r = await sb.exec("cat dest/top.txt dest/inner/x.txt")
    assert r.stdout == "topx"
    out = await sb.download("dest", tmp_path / "back")
    assert (out / "inner" / "x.txt").read_text() == "x"


async def test_download_refuses_links_out(sb: Sandbox, tmp_path: Path) -> None:
    await sb.exec("mkdir evil && ln -s /etc/passwd evil/link && ln -s ../../../../outside evil/up")
    with pytest.raises(SandboxPathError):
        await sb.download("evil", tmp_path / "dl")
    assert not (tmp_path / "outside").exists()


async def test_paths_that_escape(sb: Sandbox) -> None:
    for bad in ("../../../../etc/passwd", "/../../x", "a\x00b", ""):
        with pytest.raises(SandboxPathError):
            await sb.read_file(bad)


async def test_snapshot_and_fork(sb: Sandbox) -> None:
    await sb.write_file("state.txt", "prepared")
    snap = await sb.snapshot()
    try:
        kids = await _fork(snap, 3)
        try:
            outs = await asyncio.gather(*(k.exec("cat state.txt; echo $$ > mine") for k in kids))
            assert [o.stdout for o in outs] == ["prepared"] * 3
            assert len({k.id for k in kids}) == 3
            await kids[0].write_file("state.txt", "changed")
            assert (await kids[1].read_file("state.txt")) == b"prepared"
        finally:
            for k in kids:
                await k.close()
    finally:
        snap.delete()


def _running(pid: int) -> bool:
    """Whether host process ``pid`` runs (a zombie left to init, which reaps it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def _close_leaves_nothing(backend: str, expect_cgroup: bool | None = None, remote: Any = None) -> None:
    box = await _create(backend, remote)
    tag = f"{uuid.uuid4().int % 10**6}.{uuid.uuid4().int % 10**6}"  # a unique sleep length
    try:
        await box.exec(f"sleep {tag} > /dev/null 2>&1 &")
        await box.exec(f"(setsid sleep {tag}1 > /dev/null 2>&1 &)")  # its own session, orphaned
        d = state_root() / box.id
        cg = getattr(box, "cgroup", None)
        dirs = list(cg.dirs) if cg is not None else []
        if expect_cgroup is not None:
            assert (cg is not None) == expect_cgroup
        assert d.exists() and all(x.is_dir() for x in dirs)
        host_procs = cg.pids() if backend == "gvisor" and cg is not None else set()
        if backend == "gvisor":  # its commands are the Sentry's, not host processes: runsc's own are
            assert host_procs
        if backend not in ("microvm", "gvisor"):
            # both are alive before close (so the check below can fail); a backgrounded child
            # may still be a forked shell, not yet sleep, when exec returns
            await until(lambda: len(running(tag)) == 2)
    except BaseException:
        await box.close()  # a failed check must not leak the sandbox into later tests
        raise
    await box.close()
    assert not d.exists()
    assert not [x for x in dirs if x.exists()]  # the sandbox's own cgroups, wherever they are
    assert not [p for p in host_procs if _running(p)], "runsc's processes outlived close()"
    if backend not in ("microvm", "gvisor"):
        deadline = asyncio.get_running_loop().time() + 2
        while running(tag) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)  # killed ones may linger a moment as zombies of init
        assert running(tag) == [], "background children outlived close()"
    with pytest.raises(SandboxClosedError):
        await box.exec("true")


async def test_close_leaves_nothing(backend: str, remote: Any) -> None:
    await _close_leaves_nothing(backend, remote=remote)


async def test_close_leaves_nothing_without_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process backend as a user without cgroups (here: cgroups turned off, limits
    waived): close() still kills every process the sandbox started."""
    monkeypatch.setenv("SANDFLEET_CGROUPS", "off")
    monkeypatch.setenv("SANDFLEET_NO_LIMITS", "1")
    await _close_leaves_nothing("process", expect_cgroup=False)


async def test_ttl_expiry(backend: str, remote: Any) -> None:
    box = await _create(backend, remote, ttl_s=1)
    try:
        await asyncio.sleep(1.0)
        # gone soon after its TTL: a fixed 1.5 s failed on gvisor at a load of 70 (issue 43)
        await until(lambda: not box.alive, timeout=20)
        # the guest ends itself at its TTL ("died"); a service's reaper may get there first ("expired")
        with pytest.raises(Exception, match="died|closed|expired"):
            await box.exec("true")
    finally:
        await box.close()


async def test_download_checks_size_and_leaves_no_partial_result(sb: Sandbox, tmp_path: Path) -> None:
    await sb.exec("mkdir big && head -c 300000 /dev/urandom > big/a && head -c 300000 /dev/urandom > big/b")
    with pytest.raises(SandboxPathError, match="larger than 400000 bytes"):
        await sb.download("big", tmp_path / "dl", max_bytes=400_000)
    assert not (tmp_path / "dl").exists() or list((tmp_path / "dl").iterdir()) == []  # nothing half-extracted
    out = await sb.download("big", tmp_path / "dl", max_bytes=1_000_000)
    assert (out / "a").stat().st_size == 300_000 and (out / "b").stat().st_size == 300_000
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["big"]




async def test_a_failed_batch_raises_its_first_error_and_closes_what_it_made() -> None:
    """create_many (behind fork): the first creation error itself (its type is what the
    service maps to an HTTP answer; a TaskGroup's ExceptionGroup was a 500), and every
    sandbox the batch did make is closed."""
    from sandfleet.errors import SandboxDiedError
    from sandfleet.sandbox.base import create_many
    from sandfleet.sandbox.spec import SandboxSpec

    made: list[Sandbox] = []

    async def good() -> Sandbox:
        sb = await create_sandbox(SandboxSpec(backend="process"))
        made.append(sb)
        return sb

    async def bad() -> Sandbox:
        await until(lambda: len(made) == 2, timeout=30)  # after the good ones exist: they must be closed
        # (a fixed 0.2 s was not enough at a load of 14: issue 43)
        raise SandboxDiedError("no room")

    with pytest.raises(SandboxDiedError, match="no room"):
        await create_many([good, good, bad, bad])
    assert len(made) == 2 and not any(sb.alive for sb in made)
    with pytest.raises(SandboxClosedError):
        await made[0].exec("true")


async def test_posix_shared_memory_works_for_a_non_root_user(backend: str, sb: Sandbox) -> None:
    """/dev/shm is world-writable with the sticky bit, as in Docker: a semaphore (what
    multiprocessing's locks and pools are made of) works for the non-root 'agent' user."""
    if backend == "microvm":
        pytest.skip(f"known gap on {backend}: a non-root semaphore in /dev/shm is refused (EACCES)")
    probe = "import multiprocessing as m; m.Lock(); print('ok')"
    res = await sb.exec(["python3", "-c", probe], user="agent", timeout=60)
    assert res.exit_code == 0 and res.stdout.strip() == "ok", res.stderr
    # (Python's stat, not coreutils': Debian's runsc refuses the statx flag coreutils passes)
    mode = await sb.exec(["python3", "-c", "import os; print(oct(os.stat('/dev/shm').st_mode & 0o7777))"], timeout=30)
    assert mode.stdout.strip() == "0o1777", mode.output


def _upload_tree(src: Path) -> None:
    """A folder with what an upload must carry: modes, float times, a long and a non-ASCII name."""
    (src / "sub" / ("n" * 120)).mkdir(parents=True)
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o755)
    (src / "secret").write_text("s")
    (src / "secret").chmod(0o600)
    (src / "sub" / "data.bin").write_bytes(bytes(range(256)) * 700)
    (src / "sub" / ("n" * 120) / "fé.txt").write_text("long")
    (src / "empty").write_text("")
    (src / "sub").chmod(0o750)
    # whole seconds (busybox's tar, on microvm, takes the header's rounded time where GNU tar and the
    # agent take the pax header's), but one: .25 rounds down either way
    for p in [*src.rglob("*")]:
        os.utime(p, (1.6e9, 1.6e9))
    os.utime(src / "run.sh", (1.5e9, 1.5e9 + 0.25))


# find's -printf, else (busybox's find, on microvm) stat -c
LISTING = ("cd {d} && {{ find . -mindepth 1 -printf '%p %m %U %s %y %T@\\n' 2>/dev/null || "
           "find . -mindepth 1 -exec stat -c '%n %a %u %s %F %Y' {{}} +; }} | LC_ALL=C sort && md5sum sub/data.bin")


@pytest.mark.parametrize("user", ["root", "agent"])
async def test_upload_by_the_guest_agent_lands_as_tar_lands_it(isolated_backend: str, tmp_path: Path, user: str,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """The guest agent's untar (agent/untar.c) against tar (SANDFLEET_NATIVE_HELPERS=0): the same
    names, modes, owners, sizes, times and bytes, over a file and a link that were there."""
    _upload_tree(tmp_path / "src")
    listings = []
    # a sandbox of its own, with the default limits (this test runs about twenty commands)
    async with await create_sandbox(backend=isolated_backend, ttl_s=300) as isb:
        await _both_uploads(isb, tmp_path, user, monkeypatch, caplog, listings)
    # a folder's time after its contents: GNU tar and the agent set it last, busybox's tar (microvm) first
    assert re.search(r"^\./sub 750 \S+ \S+ (d|directory) 1600000000", listings[0], re.M), listings[0]
    folders = re.compile(r"^(\S+ \d+ \d+ \d+ (?:d|directory)) \S+$", re.M)
    assert folders.sub(r"\1", listings[0]) == folders.sub(r"\1", listings[1])
    assert "./run.sh 755" in listings[0] and " 1500000000" in listings[0] and "./secret 600" in listings[0]
    assert "./empty 644" in listings[0] and f"./sub/{'n' * 120}/fé.txt" in listings[0]


async def _both_uploads(isb: Sandbox, tmp_path: Path, user: str, monkeypatch: pytest.MonkeyPatch,
                        caplog: pytest.LogCaptureFixture, listings: list[str]) -> None:
    for native, d in (("1", "/tmp/by-agent"), ("0", "/tmp/by-tar")):
        monkeypatch.setenv("SANDFLEET_NATIVE_HELPERS", native)
        await isb.exec(f"mkdir -p {d} && echo old > {d}/empty && ln -s /etc/hostname {d}/secret", user=user)
        with caplog.at_level(logging.DEBUG, logger="sandfleet.sandbox.base"):
            await isb.upload(tmp_path / "src", d, user=user)
        r = await isb.exec(LISTING.format(d=d), user=user)
        assert r.exit_code == 0, r.output
        listings.append(r.stdout)
        if native == "1":
            assert "left" not in caplog.text  # the agent did it, not tar


async def test_an_upload_the_guest_agent_leaves_to_tar(isb: Sandbox, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A link in the folder: the guest agent's untar leaves the archive to tar, which lands all of it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    (src / "link").symlink_to("a.txt")
    with caplog.at_level(logging.DEBUG, logger="sandfleet.sandbox.base"):
        await isb.upload(src, "/tmp/linked")
    assert "left /tmp/linked to tar" in caplog.text
    r = await isb.exec("readlink /tmp/linked/link && cat /tmp/linked/a.txt")
    assert r.stdout == "a.txt\na"
