import os
import random
import subprocess
import tempfile

import pytest


def expected(rows):
    wn = max(len(n) for n, _, _ in rows)
    wc = max(len(c) for _, c, _ in rows)
    rows = sorted(rows, key=lambda r: (-float(r[2]), r[0]))
    return "".join(f"{n:<{wn}} | {c:<{wc}} | {float(a):>10.2f}\n" for n, c, a in rows)


def write(rows, bom):
    p = os.path.join(tempfile.mkdtemp(), "pay.csv")
    text = "name,city,amount\n" + "".join(f"{n},{c},{a}\n" for n, c, a in rows)
    with open(p, "wb") as f:
        f.write((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return p


def run(path):
    env = dict(os.environ)
    env.pop("PYTHONIOENCODING", None)
    r = subprocess.run(["python3", "/app/table.py", path], capture_output=True, env=env, timeout=20)
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    return r.stdout.decode("utf-8")


def test_provided_file():
    rows = [("Zoë", "Köln", "120.5"), ("Ann", "Paris", "99"), ("王芳", "北京", "250"), ("José Álvarez", "São Paulo", "99")]
    assert run("/app/data/payments.csv") == expected(rows)


NAMES = ["Zoë", "Ann", "王芳", "José Álvarez", "Łukasz", "Ørsted", "Émile", "Bob", "Ñandú", "Ἀθηνᾶ", "Dvořák"]
CITIES = ["Köln", "Paris", "北京", "São Paulo", "Kraków", "Zürich", "Århus", "Lyon"]


@pytest.mark.parametrize("seed,bom", [(1, True), (2, False), (3, True), (4, False)])
def test_hidden(seed, bom):
    rng = random.Random(seed)
    rows = [(rng.choice(NAMES), rng.choice(CITIES), f"{rng.choice([5, 10, 99.5, 1234.25, 0.1])}") for _ in range(rng.randint(1, 15))]
    assert run(write(rows, bom)) == expected(rows)


@pytest.mark.parametrize("lang", ["C", "POSIX"])
def test_locale_independent(lang):
    rows = [("Zoë", "Köln", "1"), ("Ann", "北京", "1")]
    p = write(rows, True)
    env = dict(os.environ, LANG=lang, LC_ALL=lang)
    env.pop("PYTHONIOENCODING", None)
    r = subprocess.run(["python3", "/app/table.py", p], capture_output=True, env=env, timeout=20)
    assert r.returncode == 0
    assert r.stdout.decode("utf-8") == expected(rows)
