"""Fuzzing both ends of the guest-agent protocol (findings 26 and 29).

Host side: random and mutated reply frames go through a real socket and asyncio
StreamReader into an AgentClient with calls in flight. Every call ends, with a result or a
sandfleet error (ProtocolError, SandboxDiedError, a guest error): never another exception,
never a hang, and the client counts as dead once the stream is broken.

Guest side: agent.c built with AddressSanitizer and UBSan serves batches of valid, mutated,
truncated, oversized and unknown frames on stdin (one process per batch, in its own pid
namespace, as an unprivileged user, in a scratch directory). No sanitizer report, exit code
0/70/71, every valid request answered, a ProtocolError frame and exit 71 for malformed
framing, and no hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandfleet.agent.build import SOURCE
from sandfleet.agent.client import AgentClient, ExecResult, FrameReader
from sandfleet.agent.protocol import MAX_FRAME, F, Frame, T, decode, encode
from sandfleet.errors import ProtocolError, SandfleetError


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))

# -- value strategies ------------------------------------------------------------------------

garbage = st.binary(max_size=12)
numbers = st.one_of(
    st.integers(-(2**70), 2**70).map(lambda i: str(i).encode()),
    st.sampled_from([b"0", b"1", b"-1", b"4294967296", b"99999999999999999999", b"", b" 1", b"1x"]),
)
int_like = st.one_of(numbers, garbage)


@st.composite
def mutate(draw: st.DrawFn, frame: bytes) -> bytes:
    """A few random edits of an encoded frame: flip, cut, insert, delete, or a new length."""
    b = bytearray(frame)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "delete", "length", "field_length"]))
        if op == "flip" and b:
            i = draw(st.integers(0, len(b) - 1))
            b[i] = draw(st.integers(0, 255))
        elif op == "cut":
            del b[draw(st.integers(0, len(b))):]
        elif op == "insert":
            i = draw(st.integers(0, len(b)))
            b[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and b:
            i = draw(st.integers(0, len(b) - 1))
            del b[i : i + draw(st.integers(1, 8))]
        elif op == "length" and len(b) >= 4:
            n = draw(st.one_of(
                st.sampled_from([0, 1, 4, 5, 6, len(b) - 5, len(b) - 3, MAX_FRAME, MAX_FRAME + 1, 2**32 - 1]),
                st.integers(0, 2**32 - 1),
            ))
            b[0:4] = struct.pack(">I", max(0, n))
        elif op == "field_length" and len(b) >= 14:
            i = draw(st.integers(10, len(b) - 4))  # somewhere past the first field's tag
            b[i : i + 4] = struct.pack(">I", draw(st.integers(0, 2**32 - 1)))
    return bytes(b)


# -- host side -------------------------------------------------------------------------------

REPLY_TYPES = [T.R_HELLO, T.R_STARTED, T.R_OUTPUT, T.R_EXIT, T.R_DATA, T.R_OK, T.R_ERROR]
HOST_IDS = st.one_of(st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**32 - 1))  # mostly a call in flight
REPLY_TAGS = [F.ERRNO, F.PID, F.TIME, F.CODE, F.SIGNAL, F.TIMED_OUT, F.DURATION_US, F.DROPPED_OUT, F.DROPPED_ERR,
              F.STREAM_NO, F.DATA, F.STDOUT, F.VERSION, F.ETYPE, F.MESSAGE]
reply_field = st.tuples(
    st.one_of(st.sampled_from(REPLY_TAGS), st.sampled_from(list(F)), st.integers(0, 255)),
    st.one_of(st.binary(max_size=40), int_like, st.sampled_from([b"1", b"FileNotFoundError", b"ProtocolError"])),
)
reply = st.builds(
    lambda t, i, fs: encode(t, i, fs),
    st.one_of(st.sampled_from(REPLY_TYPES), st.integers(0, 255)),
    HOST_IDS,
    st.lists(reply_field, max_size=6),
)


@st.composite
def reply_stream(draw: st.DrawFn) -> bytes:
    parts = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.integers(0, 9))
        frame = draw(reply)
        if kind < 6:
            parts.append(frame)
        elif kind < 9:
            parts.append(draw(mutate(frame)))
        else:
            parts.append(draw(st.binary(max_size=64)))
    return b"".join(parts)


HUNG = "hung"


async def _outcome(aw: Any, within: float) -> Any:
    try:
        async with asyncio.timeout(within):
            return await aw
    except Exception as e:
        if type(e) is TimeoutError and not str(e):
            return HUNG
        return e


async def _connect(sock: socket.socket, framed: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client's stream over ``sock``: through a :class:`FrameReader`, or a plain StreamReader."""
    if not framed:
        return await asyncio.open_connection(sock=sock)
    loop = asyncio.get_running_loop()
    reader = FrameReader(loop=loop)
    transport, protocol = await loop.create_connection(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                                       sock=sock)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def feed_host(stream: bytes, framed: bool = False) -> tuple[list[Any], AgentClient]:
    """Five calls in flight (ids 1..5), then ``stream`` from the guest, then EOF. ``framed``:
    through a :class:`FrameReader` (frames handed over in the transport's callback, as a local
    sandbox's stream), else a plain StreamReader read by the client's task (a microVM's)."""
    a, b = socket.socketpair()
    b.setblocking(False)
    reader, writer = await _connect(a, framed)
    client = AgentClient(reader, writer, name="fuzz")
    try:
        tasks = [
            asyncio.create_task(_outcome(c, 10))
            for c in (
                client.read_file("/a"),
                client.write_file("/b", b"x"),
                client.exec(["true"]),
                client.hello(),
                client.call(T.KILL, [(F.TARGET, 0)]),
            )
        ]
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(b, stream)
        b.shutdown(socket.SHUT_WR)
        results = await asyncio.gather(*tasks)
        # the read loop ends by itself at EOF, whatever came before
        done = await _outcome(asyncio.shield(client._reader_task), 10)
        assert done is not HUNG, "the read loop did not end at EOF"
        assert done is None, f"the read loop ended with {done!r}"
        return results, client
    finally:
        await client.close()
        writer.close()
        b.close()


def check_host(stream: bytes) -> None:
    for framed in (False, True):
        check_host_once(stream, framed)


def check_host_once(stream: bytes, framed: bool) -> None:
    results, client = asyncio.run(feed_host(stream, framed))
    for r in results:
        assert r is not HUNG, f"a call hung on stream {stream!r}"
        ok = r is None or isinstance(r, bytes | str | ExecResult | Frame | SandfleetError)
        assert ok, f"a call ended with {type(r).__name__}: {r!r} on stream {stream!r}"
    assert not client.alive


@fuzz(400)
@given(reply_stream())
def test_host_parser_fuzz(stream: bytes) -> None:
    check_host(stream)


@fuzz(800)
@given(st.one_of(st.binary(max_size=80), reply.map(lambda f: f[4:]), reply.flatmap(mutate).map(lambda f: f[4:])))
def test_decode_fuzz(body: bytes) -> None:
    """decode() gives a Frame whose fields re-encode to the same body, or a ProtocolError."""
    try:
        frame = decode(body)
    except ProtocolError:
        return
    assert encode(frame.type, frame.id, frame.fields)[4:] == body  # type: ignore[arg-type]
    for tag, _ in frame.fields:
        try:
            frame.int(tag)  # type: ignore[arg-type]
        except ProtocolError:
            pass
        except Exception as e:
            raise AssertionError(f"Frame.int raised {type(e).__name__}, not ProtocolError: {e}") from None


@pytest.mark.parametrize(
    ("stream", "which"),
    [
        (encode(T.R_HELLO, 4, [(F.VERSION, "1"), (F.PID, "abc")]), 3),  # lying PID
        (encode(T.R_HELLO, 4, [(F.VERSION, "7"), (F.PID, "2")]), 3),  # another version
        (encode(T.R_OK, 1, []), 0),  # READ answered with OK
        (encode(T.R_STARTED, 3, []) + encode(T.R_STARTED, 3, []), 2),  # STARTED twice
        (encode(T.R_STARTED, 3, []) + encode(T.R_EXIT, 3, [(F.CODE, "zero")]), 2),
        (encode(T.R_STARTED, 3, []) + encode(T.R_DATA, 3, []), 2),
        (encode(T.R_ERROR, 1, [(F.ETYPE, "OSError"), (F.ERRNO, "x")]), 0),
        (encode(T.R_DATA, 1, [(F.DATA, b"x" * 10)]) + b"\x00", 0),
    ],
    ids=["bad-pid", "bad-version", "wrong-type", "started-twice", "bad-code", "data-for-exec", "bad-errno", "torn"],
)
@pytest.mark.parametrize("framed", [False, True], ids=["read", "framed"])
def test_lying_guest_gets_protocol_error(stream: bytes, which: int, framed: bool) -> None:
    """Replies that break the protocol fail the call with ProtocolError (not ValueError)."""
    results, client = asyncio.run(feed_host(stream, framed))
    if which == 0 and stream.endswith(b"\x00"):
        assert results[0] == b"x" * 10  # a good reply, then a torn header: the read stands
        return
    assert isinstance(results[which], ProtocolError), results[which]
    assert not client.alive


@pytest.mark.parametrize("framed", [False, True], ids=["read", "framed"])
def test_an_exec_without_on_start_asks_for_no_started_and_takes_exit_alone(framed: bool) -> None:
    """Issue 46: an exec nothing here needs the pid of sends NOSTART=1, and the guest's EXIT alone
    answers it (one frame, one wake-up); with ``on_start`` the host asks for STARTED, and an EXIT
    before it is a lie."""

    async def main() -> tuple[Any, Any, list[Frame]]:
        a, b = socket.socketpair()
        b.setblocking(False)
        loop = asyncio.get_running_loop()
        reader, writer = await _connect(a, framed)
        client = AgentClient(reader, writer, name="nostart")
        try:
            quiet = asyncio.create_task(_outcome(client.exec(["true"]), 10))
            handed: list[Any] = []
            loud = asyncio.create_task(_outcome(client.exec(["true"], on_start=handed.append), 10))
            await asyncio.sleep(0.05)
            sent = (await loop.sock_recv(b, 1 << 16))
            frames = []
            while sent:
                n = int.from_bytes(sent[:4], "big")
                frames.append(decode(sent[4:4 + n]))
                sent = sent[4 + n:]
            await loop.sock_sendall(b, encode(T.R_EXIT, 1, [(F.CODE, "3")]) + encode(T.R_EXIT, 2, [(F.CODE, "0")]))
            return await quiet, await loud, frames
        finally:
            await client.close()
            writer.close()
            b.close()

    quiet, loud, frames = asyncio.run(main())
    assert [f.type for f in frames] == [T.EXEC, T.EXEC]
    assert frames[0].int(F.NOSTART) == 1 and frames[1].get(F.NOSTART) is None
    assert isinstance(quiet, ExecResult) and quiet.exit_code == 3
    assert isinstance(loud, ProtocolError), loud


# -- guest side: agent.c under AddressSanitizer and UBSan -----------------------------------


@dataclass
class Agent:
    argv: list[str]
    cwd: Path
    work: Path


SAN_ENV = {
    "PATH": "/usr/bin:/bin",
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=99:print_summary=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=98",
}
SAN_MARKS = ("Sanitizer", "runtime error:", "AddressSanitizer", "LeakSanitizer")


def _confine() -> list[str] | None:
    """A prefix that runs the fuzzed agent in its own pid namespace, unprivileged: what it
    execs or kills (random frames ask for both) can't touch the host's processes or files."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if not unshare:
        return None
    base = [unshare, "--pid", "--fork", "--kill-child", "--mount-proc"]
    if os.geteuid() == 0 and setpriv:
        prefix = [*base, setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    else:
        prefix = [unshare, "--user", "--map-root-user", *base[1:]]
    ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    return prefix if ok.returncode == 0 else None


@pytest.fixture(scope="module")
def asan_agent() -> Iterator[Agent]:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler")
    prefix = _confine()
    if prefix is None:
        pytest.skip("can't confine the fuzzed agent (needs unshare: a pid namespace, and root or user namespaces)")
    work = Path(tempfile.mkdtemp(prefix="sandfleet-fuzz-"))
    try:
        work.chmod(0o755)
        flags = ["-g", "-O1", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
        (work / "probe.c").write_text("int main(void) { return 0; }\n")
        probe = subprocess.run([cc, *flags, "-o", str(work / "probe"), str(work / "probe.c")], capture_output=True)
        if probe.returncode != 0 or subprocess.run([str(work / "probe")]).returncode != 0:
            pytest.skip(f"{cc} can't build with -fsanitize=address,undefined: {probe.stderr.decode()[-300:]}")
        binary = work / "agent-asan"
        built = subprocess.run([cc, *flags, "-o", str(binary), str(SOURCE)], capture_output=True, text=True)
        assert built.returncode == 0, f"agent.c does not build with sanitizers:\n{built.stderr[-3000:]}"
        binary.chmod(0o755)
        cwd = work / "cwd"
        cwd.mkdir()
        cwd.chmod(0o777)
        (cwd / "f1").write_text("hello\n")
        (cwd / "f1").chmod(0o666)
        yield Agent([*prefix, str(binary), "--ttl", "60"], cwd, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_agent(agent: Agent, stream: bytes, timeout: float = 20) -> tuple[int, bytes, str]:
    proc = subprocess.Popen(
        agent.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=agent.cwd, env=SAN_ENV, start_new_session=True,
    )
    try:
        out, err = proc.communicate(stream, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        save = agent.work.parent / f"sandfleet-fuzz-hang-{os.getpid()}.bin"
        save.write_bytes(stream)
        pytest.fail(f"the agent hung for {timeout}s on a {len(stream)}-byte stream (saved as {save}): {stream[:400]!r}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything left in its session
    return proc.returncode, out, err.decode(errors="replace")


def parse_replies(out: bytes) -> list[Frame]:
    frames, off = [], 0
    while off < len(out):
        assert len(out) - off >= 4, f"the agent's output ends in a torn header: {out[off:]!r}"
        n = struct.unpack_from(">I", out, off)[0]
        assert n <= MAX_FRAME + 65536, f"the agent sent a {n}-byte frame"
        assert len(out) - off - 4 >= n, "the agent's output ends in a torn frame"
        frames.append(decode(out[off + 4 : off + 4 + n]))  # a ProtocolError here fails the test
        off += 4 + n
    return frames


SAFE_ARGV = [
    ["/bin/true"],
    ["/bin/echo", "hi"],
    ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"],
    ["/bin/cat"],
    ["/bin/sh", "-c", "sleep 5"],
    ["/nonexistent/prog"],
    [""],
]
PATHS = ["f1", "f2", "d/e/f3", "/etc/hostname", "/nonexistent/x", ".", "/proc/self/status", ""]
USERS = [b"65534", b"nobody", b"root", b"0", b"no-such-user", b"", b"\xff"]
VALID_TYPES = {int(t) for t in T if t < 0x80}


@st.composite
def request(draw: st.DrawFn, rid: int) -> tuple[bytes, str]:
    """A well-framed request (its field values may still be nonsense) and its kind."""
    k = draw(st.integers(0, 99))
    fields: list[tuple[int, bytes | str | int]] = []
    opt = lambda tag, strat: fields.append((tag, draw(strat))) if draw(st.booleans()) else None  # noqa: E731
    if k < 15:
        kind, t = "hello", T.HELLO
        opt(F.TIME, st.one_of(int_like, st.sampled_from([b"1.5", b"0.999999999999", b"."])))
    elif k < 40:
        kind, t = "exec", T.EXEC
        fields += [(F.ARGV, a) for a in draw(st.sampled_from(SAFE_ARGV))]
        opt(F.ENV, st.sampled_from([b"A=1", b"=", b"NOEQ", b"PATH=/bin"]))
        opt(F.CWD, st.sampled_from([".", "/", "/nonexistent", "f1", ""]))
        opt(F.TIMEOUT_MS, st.one_of(st.sampled_from([b"1", b"200", b"0", b"-5"]), int_like))
        opt(F.MAX_OUTPUT, st.one_of(st.sampled_from([b"0", b"3", b"1048576", b"-1"]), int_like))
        opt(F.STREAM, st.sampled_from([b"1", b"0", b"x"]))
        opt(F.STDIN_MODE, st.sampled_from([b"pipe", b"", b"zz"]))
        opt(F.DATA, st.binary(min_size=1, max_size=32))  # empty: a known report, see KNOWN_REPORTS
        opt(F.USER, st.sampled_from(USERS))
    elif k < 55:
        kind, t = "read", T.READ
        opt(F.PATH, st.sampled_from(PATHS))
        opt(F.MAX, st.one_of(st.sampled_from([b"0", b"3", b"100"]), int_like))
        opt(F.NOFOLLOW, st.sampled_from([b"1", b"0", b""]))
        opt(F.USER, st.sampled_from(USERS))
    elif k < 68:
        kind, t = "write", T.WRITE
        opt(F.PATH, st.sampled_from([p for p in PATHS if not p.startswith("/")]))
        opt(F.DATA, st.binary(max_size=32))
        opt(F.MODE, st.one_of(st.sampled_from([b"420", b"0", b"4095", b"511"]), int_like))
        opt(F.MKDIRS, st.sampled_from([b"1", b"0", b"x"]))
        opt(F.USER, st.sampled_from(USERS))
    elif k < 78:
        kind, t = "kill", T.KILL
        opt(F.TARGET, st.one_of(st.integers(1000, 1040).map(lambda i: str(i).encode()), int_like))
        opt(F.SIGNAL, st.sampled_from([b"9", b"15", b"0", b"-1", b"99999", b"x"]))
    elif k < 86:
        kind, t = "stdin", T.STDIN
        opt(F.TARGET, st.one_of(st.integers(1000, 1040).map(lambda i: str(i).encode()), int_like))
        opt(F.DATA, st.binary(max_size=16))
    elif k < 99:
        kind = "unknown"
        t = draw(st.integers(0, 255).filter(lambda x: x not in VALID_TYPES))
        fields += draw(st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=16)), max_size=4))
    else:
        kind, t = "shutdown", T.SHUTDOWN
    if draw(st.integers(0, 9)) == 0:  # an unknown tag now and then
        fields.append((draw(st.integers(31, 255)), draw(st.binary(max_size=8))))
    return encode(t, rid, fields), kind  # type: ignore[arg-type]


@st.composite
def batch(draw: st.DrawFn) -> tuple[bytes, dict[int, tuple[bytes, str]]]:
    """A byte stream of frames, and which offsets hold which untouched requests."""
    stream = bytearray()
    known: dict[int, tuple[bytes, str]] = {}
    n = draw(st.integers(1, 40))
    for i in range(n):
        k = draw(st.integers(0, 99))
        if k < 93:  # mostly valid: a malformed frame ends the batch (the agent exits 71)
            frame, kind = draw(request(1000 + i))
            known[len(stream)] = (frame, kind)
            stream += frame
        elif k < 98:
            frame, _ = draw(request(5000 + i))
            stream += draw(mutate(frame))
        elif k < 99:
            stream += draw(st.binary(max_size=64))
        else:
            stream += struct.pack(">I", draw(st.integers(MAX_FRAME + 1, 2**32 - 1))) + draw(st.binary(max_size=16))
    return bytes(stream), known


def model(stream: bytes, known: dict[int, tuple[bytes, str]]) -> tuple[dict[int, str], str | None, bool]:
    """Walk the stream as the agent must: the requests it will answer (id -> kind), whether
    it must stop at malformed framing, and whether a SHUTDOWN ends it first."""
    expect: dict[int, str] = {}
    off = 0
    while len(stream) - off >= 4:
        n = struct.unpack_from(">I", stream, off)[0]
        if n > MAX_FRAME:
            return expect, "frame too large", False
        if len(stream) - off - 4 < n:
            break  # torn at EOF: the agent just sees its input close
        try:
            frame = decode(stream[off + 4 : off + 4 + n])
        except ProtocolError:
            return expect, "malformed frame", False
        mine = known.get(off)
        if mine is not None and mine[0] == stream[off : off + 4 + n]:
            expect[frame.id] = mine[1]
        if frame.type == T.SHUTDOWN:
            return expect, None, True
        off += 4 + n
    return expect, None, False


ANSWERS = {
    "hello": {T.R_HELLO},
    "exec": {T.R_STARTED, T.R_ERROR},
    "read": {T.R_DATA, T.R_ERROR},
    "write": {T.R_OK, T.R_ERROR},
    "kill": {T.R_OK, T.R_ERROR},
    "unknown": {T.R_ERROR},
    "shutdown": {T.R_OK},
}


# Sanitizer reports already tracked (each by a strict xfail test below): the fuzzer stops
# that batch there instead of failing, so it keeps looking for new ones.
KNOWN_REPORTS = [
    # EXEC with an empty DATA field: buf_add(&pending_in, data, 0) memcpy's into a NULL buffer
    ("null pointer passed as argument 1", "in buf_add", "in start_exec"),
]


def known_report(err: str) -> bool:
    return any(all(part in err for part in sig) for sig in KNOWN_REPORTS)


def check_agent(agent: Agent, stream: bytes, known: dict[int, tuple[bytes, str]]) -> int:
    rc, out, err = run_agent(agent, stream)
    where = f"on a {len(stream)}-byte stream {stream[:600]!r}"
    if known_report(err):
        return 0
    assert not any(m in err for m in SAN_MARKS), f"sanitizer report {where}:\n{err[-6000:]}"
    assert rc in (0, 70, 71), f"exit code {rc} {where}; stderr: {err[-2000:]}"
    replies = parse_replies(out)
    expect, bad, shutdown = model(stream, known)
    if bad:
        assert rc == 71, f"the agent exited {rc}, not 71, on a {bad} {where}"
        errors = [f for f in replies if f.type == T.R_ERROR and f.text(F.ETYPE) == "ProtocolError"]
        assert errors, f"no ProtocolError frame for a {bad} {where}"
    elif not shutdown:
        assert rc != 71, f"the agent called well-framed input malformed {where}: {[f.text(F.MESSAGE) for f in replies]}"
    by_id: dict[int, set[int]] = {}
    for f in replies:
        by_id.setdefault(f.id, set()).add(f.type)
    for rid, kind in expect.items():
        if kind == "stdin":
            continue
        assert by_id.get(rid, set()) & ANSWERS[kind], f"request {rid} ({kind}) got {by_id.get(rid)} {where}"
        if kind == "hello":
            hello = next(f for f in replies if f.id == rid and f.type == T.R_HELLO)
            assert hello.text(F.VERSION) == "1"
    return len(expect)


@fuzz(40)
@given(batch())
def test_agent_fuzz_quick(asan_agent: Agent, case: tuple[bytes, dict[int, tuple[bytes, str]]]) -> None:
    check_agent(asan_agent, *case)


@pytest.mark.slow
@fuzz(400)
@given(batch())
def test_agent_fuzz(asan_agent: Agent, case: tuple[bytes, dict[int, tuple[bytes, str]]]) -> None:
    """Thousands of frames (about 20 a batch)."""
    check_agent(asan_agent, *case)


@pytest.mark.parametrize(
    "stream",
    [
        struct.pack(">I", MAX_FRAME + 1),
        struct.pack(">I", 2**32 - 1) + b"\x01" * 8,
        struct.pack(">I", 3) + b"\x01\x00\x00",
        struct.pack(">I", 10) + b"\x02\x00\x00\x00\x01" + b"\x01\xff\xff\xff\xff",
        encode(T.HELLO, 1) + struct.pack(">I", 6) + b"\x05\x00\x00\x00\x02\x12",
    ],
    ids=["max-plus-1", "4GiB", "short", "field-overrun", "torn-field-header"],
)
def test_agent_rejects_bad_framing(asan_agent: Agent, stream: bytes) -> None:
    """Each of these is malformed framing: a ProtocolError frame, then exit 71."""
    rc, out, err = run_agent(asan_agent, stream)
    assert not any(m in err for m in SAN_MARKS), err[-4000:]
    replies = parse_replies(out)
    assert rc == 71, (rc, err[-2000:])
    assert any(f.type == T.R_ERROR and f.text(F.ETYPE) == "ProtocolError" for f in replies), replies


# found by test_agent_fuzz (UBSan: memcpy into a NULL buffer in buf_add), present since 490e57a; fixed
def test_agent_exec_with_empty_stdin_field(asan_agent: Agent) -> None:
    stream = encode(T.EXEC, 1000, [(F.ARGV, "/bin/true"), (F.DATA, b"")])
    rc, out, err = run_agent(asan_agent, stream)
    assert not any(m in err for m in SAN_MARKS), err[-4000:]
    assert rc == 0
