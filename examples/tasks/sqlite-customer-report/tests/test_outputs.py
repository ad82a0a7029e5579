import csv
import hashlib
import io
import os
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, "/tests")
from dbgen import expected, make_db  # noqa: E402


def run(db):
    with open("/app/report.sql") as f:
        r = subprocess.run(["sqlite3", "-csv", "-header", db], stdin=f, capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return list(csv.reader(io.StringIO(r.stdout)))


def test_shop_db():
    assert run("/app/shop.db") == expected("/app/shop.db")


@pytest.mark.parametrize("seed,nc,no", [(1, 5, 30), (2, 60, 900), (3, 200, 3000)])
def test_hidden_dbs(seed, nc, no):
    d = tempfile.mkdtemp()
    db = os.path.join(d, "hidden.db")
    make_db(db, seed, nc, no)
    exp = expected(db)
    assert len(exp) > 1
    assert run(db) == exp
