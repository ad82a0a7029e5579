"""server/wire.py's multipart reading: the in-memory fast path (file_parts) answers what
Starlette's parser answers, and leaves to it every body it does not know (issue 47: Starlette
spooled a 50 MB files.write through a temporary file)."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncGenerator

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                                reason="the service needs the server extra (pip install -e '.[server]')")


def _starlette(headers: dict[str, str], body: bytes) -> list[tuple[str, str, bytes]]:
    from starlette.datastructures import Headers, UploadFile
    from starlette.formparsers import MultiPartParser

    async def stream() -> AsyncGenerator[bytes, None]:
        yield body

    async def parse() -> list[tuple[str, str, bytes]]:
        form = await MultiPartParser(Headers(headers=headers), stream()).parse()
        out = []
        for name, value in form.multi_items():
            out.append((name, value.filename or "", await value.read()) if isinstance(value, UploadFile)
                       else (name, "", value.encode()))
        await form.close()
        return out

    return asyncio.run(parse())


def _httpx(files: list[tuple[str, tuple[str, bytes]]],
           data: dict[str, str] | None = None) -> tuple[dict[str, str], bytes]:
    import httpx

    req = httpx.Request("POST", "http://x/files", files=files, data=data)
    return dict(req.headers), req.read()


BOUNDARY = "b0undary"
CASES: dict[str, tuple[dict[str, str], bytes, bool]] = {
    # name: (headers, body, whether the fast path takes it)
    "one file (the e2b SDK's files.write)": (*_httpx([("file", ("/home/user/a.txt", b"hello\r\n--b0und"))]), True),
    "a UTF-8 file name": (*_httpx([("file", ("/home/user/ünï €.txt", b"u"))]), True),
    "a quote in a file name (httpx sends %22)": (*_httpx([("file", ('a"b', b"q"))]), True),
    "several files (write_files)": (*_httpx([("file", ("a", b"1" * 70000)), ("file", ("sub/b", b""))]), True),
    "a field beside a file": (*_httpx([("file", ("a", b"x"))], data={"note": "n"}), False),
    "quoted boundary, plain body": ({"content-type": f'multipart/form-data; boundary="{BOUNDARY}"'},
                                    b"--b0undary\r\nContent-Disposition: form-data; name=\"f\"; filename=\"x\"\r\n"
                                    b"Content-Type: text/plain\r\n\r\nDATA\r\n--b0undary--\r\n", True),
    "an escaped quote in a file name": ({"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
                                       b'--b0undary\r\nContent-Disposition: form-data; name="f"; filename="a\\"b"'
                                       b"\r\n\r\nDATA\r\n--b0undary--\r\n", False),
    "another part header": ({"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
                            b'--b0undary\r\nContent-Disposition: form-data; name="f"; filename="x"\r\n'
                            b"Content-Transfer-Encoding: binary\r\n\r\nDATA\r\n--b0undary--\r\n", False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_fast_path_answers_as_starlette(case: str) -> None:
    from sandfleet.server.wire import file_parts, form_parts

    headers, body, fast = CASES[case]
    assert (file_parts(headers["content-type"], body) is not None) == fast
    assert asyncio.run(form_parts(headers, body, max_part_size=1 << 20)) == _starlette(headers, body)


@pytest.mark.parametrize("body", [b"", b"--b0undary\r\n", b"--b0undary\r\nContent-Disposition: form-data; "
                                  b'name="f"; filename="x"\r\n\r\nDATA', b"--b0undary--\r\n", b"junk",
                                  b'preamble\r\n--b0undary\r\nContent-Disposition: form-data; name="f"; '
                                  b'filename="x"\r\n\r\nDATA\r\n--b0undary--\r\n'])
def test_a_torn_or_empty_body_is_left_to_starlette(body: bytes) -> None:
    from sandfleet.server.wire import file_parts

    assert file_parts(f"multipart/form-data; boundary={BOUNDARY}", body) is None
