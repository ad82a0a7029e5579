import json
import os
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, "/tests")
from gen import expected, gen  # noqa: E402

SCRIPT = "/app/summarize.sh"


def run(path):
    r = subprocess.run([SCRIPT, path], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_provided_file():
    assert run("/app/data/orders.json") == expected(json.load(open("/app/data/orders.json")))


@pytest.mark.parametrize("seed,n", [(1, 1), (5, 40), (9, 300)])
def test_hidden_files(seed, n):
    orders = gen(seed, n)
    d = tempfile.mkdtemp()
    p = os.path.join(d, "my orders.json")
    json.dump(orders, open(p, "w"))
    assert run(p) == expected(orders)


def test_no_paid_orders():
    d = tempfile.mkdtemp()
    p = os.path.join(d, "o.json")
    json.dump([{"id": 1, "status": "pending", "customer": {"name": "x", "email": "x@y"}, "items": []}], open(p, "w"))
    assert run(p) == []
