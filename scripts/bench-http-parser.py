#!/usr/bin/env python3
"""The client transport's parse cost per response, this checkout's parser against another
revision's, side by side in one process: ``scripts/bench-http-parser.py [REV]`` (default
f07e896~1, the last hand-written parser). Each side's ``_Conn`` is fed the same bytes
(``start``, ``data_received``, the body taken, ``reset``) in alternating blocks; prints
the medians and their ratio for an exec's JSON answer and for a chunked NDJSON stream."""

from __future__ import annotations

import asyncio
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from sandfleet.client import _transport as head  # noqa: E402

BODY = (b'{"exit_code":0,"stdout":"","stderr":"","timed_out":false,"duration_s":0.0012,'
        b'"stdout_truncated":0,"stderr_truncated":0}')
RESPONSES = {
    "exec": (b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 21:00:00 GMT\r\nserver: uvicorn\r\n"
             b"content-length: %d\r\ncontent-type: application/json\r\n\r\n" % len(BODY)) + BODY,
    "chunked": b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"
               + b"".join(b"%x\r\n%s\r\n" % (len(BODY), BODY) for _ in range(8)) + b"0\r\n\r\n",
}


class _Transport:
    def write(self, data: bytes) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...


def load(rev: str) -> ModuleType:
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:src/sandfleet/client/_transport.py"],
                         capture_output=True, check=True).stdout
    f = Path(tempfile.mkdtemp()) / "_transport_base.py"
    f.write_bytes(src)
    spec = importlib.util.spec_from_file_location("_transport_base", f)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


async def per_response_us(mod: ModuleType, raw: bytes, n: int) -> float:
    c = mod._Conn(("http", "h", 1))
    c.connection_made(_Transport())
    t = time.perf_counter()
    for _ in range(n):
        fut = c.start(b"x", False)
        c.data_received(raw)
        fut.result()
        c._chunks.clear()
        c._queued = 0
        c.reset()
    return (time.perf_counter() - t) / n * 1e6


async def main(rev: str, blocks: int = 10, n: int = 20000) -> None:
    base = load(rev)
    for name, raw in RESPONSES.items():
        got: dict[str, list[float]] = {"base": [], "head": []}
        for b in range(blocks):
            order = [("base", base), ("head", head)] if b % 2 == 0 else [("head", head), ("base", base)]
            for label, mod in order:
                got[label].append(await per_response_us(mod, raw, n))
        b_, h_ = statistics.median(got["base"]), statistics.median(got["head"])
        print(f"{name:8} base ({rev}) {b_:.2f} us  head {h_:.2f} us  head/base {h_ / b_:.2f}x "  # noqa: T201
              f"(medians of {blocks} alternating blocks of {n})")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "f07e896~1"))
