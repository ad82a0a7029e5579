import os
import shutil
import subprocess
import tempfile

import pytest

SRC = "/app/wordstats.c"


@pytest.fixture(scope="module")
def binary():
    d = tempfile.mkdtemp()
    out = os.path.join(d, "wordstats")
    shutil.copy(SRC, os.path.join(d, "wordstats.c"))
    r = subprocess.run(["gcc", "-Wall", "-Werror", "-std=c11", "-o", out, "wordstats.c"],
                       cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def expected(data: bytes) -> str:
    words = data.split()
    longest = b""
    for w in words:
        if len(w) > len(longest):
            longest = w
    return "lines=%d words=%d chars=%d longest=%s\n" % (
        data.count(b"\n"), len(words), len(data), longest.decode())


CASES = [
    b"",
    b"hello\n",
    b"the quick brown fox\njumps over the lazy dog\n",
    b"  leading and trailing spaces   ",
    b"tabs\tand\nnewlines\n\n\nmultiple\t\tseparators",
    b"equal size words abcd efgh ijkl\n",
    b"a\nbb\nccc\ndddd\nccc\n",
    b"supercalifragilistic " * 50 + b"\n",
]


@pytest.mark.parametrize("data", CASES)
def test_behaviour(binary, data):
    r = subprocess.run([binary], input=data, capture_output=True)
    assert r.returncode == 0
    assert r.stdout.decode() == expected(data)
