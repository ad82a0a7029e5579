#!/usr/bin/env python3
"""A file up against the same file down, in the same run and the same sandbox (issue 47:
"a 50 MB files.write took 8-13 s against ~1 s to read it back").

Through one ``sandfleet serve`` on loopback, alternating write and read, three ways:

- the unmodified e2b SDK: ``files.write(path, bytes)`` (multipart, the SDK's default for
  bytes), ``files.write(path, io.BytesIO(...))`` (octet-stream) and ``files.read(path, "bytes")``;
- sandfleet's client (``/v1``): ``RemoteSandbox.write_file`` and ``read_file``.

``scripts/bench-upload.py [MB] [ROUNDS]`` (default 50 MB, 5 rounds): prints each way's
median and its spread in seconds, and write/read as a ratio of the medians.
"""

from __future__ import annotations

import asyncio
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def show(where: str, got: dict[str, list[float]], mb: int) -> None:
    for name, ts in got.items():
        med = statistics.median(ts)
        print(f"{where:8} {name:34} median {med:6.2f} s  ({min(ts):.2f}-{max(ts):.2f})  "  # noqa: T201
              f"{mb / med:7.1f} MB/s  over {len(ts)}")
    reads = [statistics.median(ts) for name, ts in got.items() if name.startswith("read")]
    for name, ts in got.items():
        if not name.startswith("read") and reads:
            print(f"{where:8} {name:34} / read: {statistics.median(ts) / reads[0]:.2f}x")  # noqa: T201


def rounds(ways: dict[str, Callable[[], object]], n: int) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {k: [] for k in ways}
    for i in range(n):
        for name in (list(ways) if i % 2 == 0 else list(reversed(ways))):
            t = time.perf_counter()
            ways[name]()
            got[name].append(time.perf_counter() - t)
    return got


async def through_v1(url: str, token: str, data: bytes, n: int) -> dict[str, list[float]]:
    from sandfleet.client import connect

    async with await connect(url, token) as c, await c.create_sandbox(ttl_s=900) as sb:
        await sb.write_file("/tmp/big", data)
        got: dict[str, list[float]] = {"write_file": [], "read_file": []}
        for i in range(n):
            for name in (list(got) if i % 2 == 0 else list(reversed(got))):
                t = time.perf_counter()
                if name == "write_file":
                    await sb.write_file("/tmp/big", data)
                else:
                    back = await sb.read_file("/tmp/big", max_bytes=len(data) + 1)
                    assert len(back) == len(data)
                got[name].append(time.perf_counter() - t)
        return got


def main(mb: int, n: int) -> None:
    from e2b import Sandbox

    from sandfleet.server.testing import running_service

    data = os.urandom(mb << 20)
    d = Path(tempfile.mkdtemp(prefix="bench-upload-"))
    with running_service(d, args=["--max-ttl", "900", "--max-body-mib", str(2 * mb + 16)]) as s:
        os.environ.update({"E2B_API_URL": s.url, "E2B_SANDBOX_URL": s.url, "E2B_API_KEY": s.token})
        sbx = Sandbox.create(timeout=900)
        try:
            def read() -> None:
                assert len(sbx.files.read("/home/user/big", "bytes", request_timeout=300)) == len(data)

            ways: dict[str, Callable[[], object]] = {
                "read (files.read bytes)": read,
                "write (files.write bytes, multipart)":
                    lambda: sbx.files.write("/home/user/big", data, request_timeout=300),
                "write (files.write BytesIO, octet)":
                    lambda: sbx.files.write("/home/user/big", io.BytesIO(data), request_timeout=300),
            }
            sbx.files.write("/home/user/big", data, request_timeout=300)
            show("e2b SDK", rounds(ways, n), mb)
        finally:
            sbx.kill()
        show("/v1", asyncio.run(through_v1(s.url, s.token, data, n)), mb)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50, int(sys.argv[2]) if len(sys.argv) > 2 else 5)
