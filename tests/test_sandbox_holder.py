"""The detached sandbox's holder: framed requests and replies with size limits, clear error
replies for oversize, truncated and malformed frames (then the connection closes), and a
log in the sandbox's state directory. Real holders made by ``sandfleet sandbox create``."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sandfleet.sandbox import holder
from sandfleet.sandbox.state import state_root
from test_pool_cli import sf


@contextmanager
def created(backend: str) -> Iterator[tuple[str, Path]]:
    """A sandbox made by ``sandfleet sandbox create``: its id and its holder's socket."""
    from conftest import backend_skip

    why = backend_skip(backend)
    if why:
        pytest.skip(why)
    r = sf("sandbox", "create", "--backend", backend, "--ttl", "120")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # the holder says nothing on this terminal
    sid = r.stdout.strip()
    try:
        yield sid, state_root() / sid / "ctl.sock"
    finally:
        assert sf("sandbox", "rm", sid).returncode == 0
    assert not (state_root() / sid).exists()


@pytest.fixture(params=["process", "bwrap"])
def detached(request: pytest.FixtureRequest) -> Iterator[tuple[str, Path]]:
    with created(request.param) as made:
        yield made


def raw(sock_path: Path, data: bytes, *, shut: bool = True) -> tuple[dict[str, Any] | None, bytes]:
    """Send raw bytes to a holder; its reply frame (None if it sent none) and any bytes after it."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(40)
        s.connect(str(sock_path))
        try:
            s.sendall(data)
            if shut:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the holder refused and closed before taking it all
        got = b""
        while chunk := s.recv(1 << 16):
            got += chunk
    if len(got) < 4:
        return None, got
    (n,) = struct.unpack(">I", got[:4])
    return json.loads(got[4:4 + n]), got[4 + n:]


def frame(obj: Any) -> bytes:
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def test_framed_exec_and_error_replies(detached: tuple[str, Path]) -> None:
    sid, sock = detached
    reply, rest = raw(sock, frame({"argv": ["sh", "-c", "echo hi; echo oops >&2; exit 3"]}))
    assert reply == {"ok": True, "exit_code": 3, "stdout": "hi\n", "stderr": "oops\n", "timed_out": False,
                     "truncated": False}
    assert rest == b""
    cases: list[tuple[bytes, str]] = [
        (struct.pack(">I", holder.MAX_REQUEST + 1), f"request of {holder.MAX_REQUEST + 1} bytes exceeds the "
                                                      f"limit of {holder.MAX_REQUEST} bytes"),
        (struct.pack(">I", 5) + b"nope!", "malformed request: not JSON"),
        (struct.pack(">I", 3) + b"[1]", "malformed request: a JSON object is expected, not list"),
        (struct.pack(">I", 0), "malformed request: an empty frame"),
        (struct.pack(">I", 100) + b'{"argv"', "truncated request: 7 of 100 body bytes"),
        (b"\x00\x00", "truncated request: 2 of 4 header bytes"),
        (b'{"argv": ["true"]}\n', "line-delimited JSON is from an older sandfleet"),
        (frame({"argv": []}), "'argv' must be a non-empty list of strings"),
        (frame({"argv": ["true", 1]}), "'argv' must be a non-empty list of strings"),
        (frame({"argv": ["true"], "timeout": -1}), "'timeout' must be a positive number"),
        (frame({"argv": ["true"], "cwd": 3}), "'cwd' must be a string or null"),
        (frame({"op": "reboot"}), "unknown op 'reboot'"),
        (frame({"argv": ["true"], "user": "root"}), "unknown key(s) 'user'"),
    ]
    for data, message in cases:
        reply, rest = raw(sock, data)
        assert reply is not None and reply["ok"] is False, data[:20]
        assert message in reply["error"], (data[:20], reply)
        assert rest == b""  # and the connection closed after the error frame
    # an oversize body sent whole: refused from its header alone, the body is never read
    big = struct.pack(">I", 2 * holder.MAX_REQUEST) + b"x" * (2 * holder.MAX_REQUEST)
    reply, _ = raw(sock, big)
    assert reply is not None and "exceeds the limit" in reply["error"]
    # the holder serves on, and logged every refusal to holder.log (not the terminal)
    r = sf("sandbox", "exec", sid, "--", "echo", "still here")
    assert r.returncode == 0 and r.stdout == "still here\n", r.stderr
    text = (state_root() / sid / "holder.log").read_text()
    assert f"holding sandbox {sid}" in text and text.count("refused a request") == len(cases) + 1


@pytest.mark.slow
@pytest.mark.waits  # 31 s of wall, most of it a deadline, little CPU (scripts/test.sh: a lane of its own)
def test_a_request_that_never_completes_is_answered_and_closed() -> None:
    with created("process") as (_, sock):
        # a half-sent frame with the write side left open: the holder answers at its deadline
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(holder.REQUEST_TIMEOUT_S + 15)
            s.connect(str(sock))
            s.sendall(struct.pack(">I", 50) + b'{"ar')
            got = b""
            while chunk := s.recv(1 << 16):
                got += chunk
        reply = json.loads(got[4:])
        assert reply["ok"] is False and "not received whole within" in reply["error"]


def test_client_refuses_oversize_request_and_reply(tmp_path: Path) -> None:
    with pytest.raises(holder.FrameError, match="request of .* bytes exceeds the limit of 1048576 bytes"):
        holder.call(str(tmp_path / "none.sock"), {"argv": ["x" * holder.MAX_REQUEST]}, 5)
    # a peer announcing a reply over the limit: the client reads no further
    path = tmp_path / "peer.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)

    def peer(header: bytes) -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(1 << 16)
            conn.sendall(header)

    for header, message in [(struct.pack(">I", holder.MAX_REPLY + 1), "reply of 16777217 bytes exceeds"),
                            (struct.pack(">I", 10) + b"{}", "truncated reply: 2 of 10 body bytes"),
                            (b"", "closed the connection without a reply")]:
        t = threading.Thread(target=peer, args=(header,))
        t.start()
        with pytest.raises(holder.FrameError, match=message):
            holder.call(str(path), {"argv": ["true"]}, 5)
        t.join()
    server.close()


def test_creation_failure_is_reported_and_leaves_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "SANDFLEET_STATE": str(tmp_path / "state")}
    r = subprocess.run([sys.executable, "-m", "sandfleet", "sandbox", "create", "--backend", "process",
                        "--image", "no-such-image"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1 and "sandbox creation failed:" in r.stderr and "no-such-image" in r.stderr
    assert "Traceback" not in r.stderr
    assert not list((tmp_path / "state").glob("sf-*"))
