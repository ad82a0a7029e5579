"""The sandfleet guest-agent wire protocol, version 1 (host side). See docs/protocol.md.

A frame is ``u32 length | u8 type | u32 request id | fields``; a field is
``u8 tag | u32 length | bytes``; integers travel as decimal ASCII. Requests flow host to
guest, replies guest to host, matched by request id.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum

from sandfleet.errors import ProtocolError

VERSION = "1"
MAX_FRAME = 256 * 1024 * 1024
"""The largest frame body (the u32 length) either side sends."""
HEADER_SLACK = 64 * 1024
"""Room for field headers and small fields around a frame's payload."""
MAX_REPLY_FRAME = MAX_FRAME + HEADER_SLACK
"""The host refuses (ProtocolError, sandbox dead) a frame from the guest longer than this."""
MAX_OUTPUT = (MAX_FRAME - HEADER_SLACK) // 2
"""The most output captured per stream (stdout and stderr both fit in one EXIT frame)."""
MAX_CAPTURE = 100 << 20
"""The most output the guest agent keeps per stream of one command (agent.c ``MAX_CAPTURE``: the
same number, checked by a test); more is cut and the result says ``truncated``."""
MAX_READ = MAX_FRAME - HEADER_SLACK
"""The most bytes one READ returns."""


class T(IntEnum):
    """Frame types."""

    HELLO = 1
    EXEC = 2
    STDIN = 3
    KILL = 4
    READ = 5
    WRITE = 6
    SHUTDOWN = 7
    RESIZE = 8
    R_HELLO = 0x81
    R_STARTED = 0x82
    R_OUTPUT = 0x83
    R_EXIT = 0x84
    R_DATA = 0x85
    R_OK = 0x86
    R_ERROR = 0xEE


class F(IntEnum):
    """Field tags."""

    ARGV = 1
    ENV = 2
    CWD = 3
    TIMEOUT_MS = 4
    MAX_OUTPUT = 5
    STREAM = 6
    STDIN_MODE = 7
    DATA = 8
    STREAM_NO = 9
    CODE = 10
    SIGNAL = 11
    TIMED_OUT = 12
    STDOUT = 13
    STDERR = 14
    DROPPED_OUT = 15
    DROPPED_ERR = 16
    DURATION_US = 17
    PATH = 18
    MODE = 19
    ETYPE = 20
    MESSAGE = 21
    ERRNO = 22
    VERSION = 23
    PID = 24
    TARGET = 25
    MAX = 26
    MKDIRS = 27
    TIME = 28
    USER = 29
    NOFOLLOW = 30
    PTY = 31
    SECCOMP = 32
    NETWORK = 33
    PIDNS = 34
    DETACHED = 35
    NOSTART = 36


FieldValue = bytes | str | int
_INT = re.compile(rb"-?[0-9]{1,19}")


def encode(
    type_: T, req_id: int, fields: Iterable[tuple[F, FieldValue]] = ()
) -> bytes:
    """Encode one frame."""
    parts = [struct.pack(">BI", int(type_), req_id)]
    for tag, value in fields:
        if isinstance(value, int):
            data = str(value).encode()
        elif isinstance(value, str):
            data = value.encode()
        else:
            data = value
        parts.append(struct.pack(">BI", int(tag), len(data)))
        parts.append(data)
    body = b"".join(parts)
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
    return struct.pack(">I", len(body)) + body


@dataclass
class Frame:
    """A decoded frame: its type, request id and fields (a tag may repeat)."""

    type: int
    id: int
    fields: list[tuple[int, bytes]] = field(default_factory=list)

    def get(self, tag: F, default: bytes | None = None) -> bytes | None:
        for t, v in self.fields:
            if t == tag:
                return v
        return default

    def text(self, tag: F, default: str = "") -> str:
        v = self.get(tag)
        return default if v is None else v.decode("utf-8", "replace")

    def int(self, tag: F, default: int = 0) -> int:
        """A decimal integer field; ProtocolError (not ValueError) when it is not one."""
        v = self.get(tag)
        if v is None:
            return default
        if v.isdigit() and len(v) < 20:  # (the usual case; ASCII digits only: bytes.isdigit)
            return int(v)
        if _INT.fullmatch(v) is None:
            raise ProtocolError(
                f"field {_tag_name(tag)} of a {_type_name(self.type)} frame is not an integer: {v[:40]!r}"
            )
        return int(v)


def _tag_name(tag: int) -> str:
    return F(tag).name if tag in F._value2member_map_ else str(tag)


def _type_name(type_: int) -> str:
    return T(type_).name if type_ in T._value2member_map_ else f"type-{type_:#x}"


def decode(body: bytes) -> Frame:
    """Decode a frame body (without its length prefix)."""
    if len(body) < 5:
        raise ProtocolError(f"frame of {len(body)} bytes is too short")
    type_, req_id = struct.unpack_from(">BI", body)
    frame = Frame(type_, req_id)
    off = 5
    while off < len(body):
        if len(body) - off < 5:
            raise ProtocolError("truncated field header")
        tag, n = struct.unpack_from(">BI", body, off)
        off += 5
        if n > len(body) - off:
            raise ProtocolError("field longer than its frame")
        frame.fields.append((tag, body[off : off + n]))
        off += n
    return frame
