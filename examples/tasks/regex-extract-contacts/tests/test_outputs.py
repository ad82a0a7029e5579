import json
import os
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, "/tests")
from textgen import gen  # noqa: E402


def run(path):
    r = subprocess.run(["python3", "/app/extract.py", path], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_provided_file():
    _, exp = gen(5, 60)
    assert run("/app/data/inbox.txt") == exp


@pytest.mark.parametrize("seed,n", [(1, 10), (2, 80), (3, 400), (4, 1)])
def test_hidden(seed, n):
    text, exp = gen(seed, n)
    p = os.path.join(tempfile.mkdtemp(), "in.txt")
    open(p, "w").write(text)
    assert run(p) == exp


def test_specific():
    text = ("Reach X.Y@Example.COM. or (917) 555-0199, not 19175550199 nor 555-0199.\n"
            "Also +1 917 555 0199 and root@localhost and a@b.c\n")
    p = os.path.join(tempfile.mkdtemp(), "s.txt")
    open(p, "w").write(text)
    assert run(p) == {"emails": ["x.y@example.com"], "phones": ["+1-917-555-0199"]}
