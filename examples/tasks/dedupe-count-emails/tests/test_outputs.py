import os
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, "/tests")
from emailgen import expected, gen  # noqa: E402


def run(path):
    r = subprocess.run(["/app/count_signups.sh", path], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_provided():
    assert run("/app/data/signups.txt") == expected(open("/app/data/signups.txt").read())


@pytest.mark.parametrize("seed,n", [(10, 1), (11, 50), (12, 2000)])
def test_hidden(seed, n):
    text = gen(seed, n)
    p = os.path.join(tempfile.mkdtemp(), "sign ups.txt")
    open(p, "w").write(text)
    assert run(p) == expected(text)


def test_tie_order():
    p = os.path.join(tempfile.mkdtemp(), "t.txt")
    open(p, "w").write("b@x.io\nA@x.io\r\n\ta@x.io \n# c@x.io\nc@x.io\nB@X.IO\n  \n")
    assert run(p) == "2 a@x.io\n2 b@x.io\n1 c@x.io\n"
