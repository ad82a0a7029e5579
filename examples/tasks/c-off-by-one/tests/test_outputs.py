import os
import random
import shutil
import subprocess
import tempfile

import pytest


@pytest.fixture(scope="module")
def binaries():
    d = tempfile.mkdtemp()
    shutil.copy("/app/rollavg.c", d)
    out = {}
    for name, flags in [("plain", ["-O2", "-Wall"]), ("asan", ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"])]:
        exe = os.path.join(d, "rollavg_" + name)
        r = subprocess.run(["gcc", *flags, "-o", exe, "rollavg.c"], cwd=d, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        out[name] = exe
    return out


def expected(values, k):
    vals = values[:1000]
    if len(vals) < k:
        return None
    lines = []
    for i in range(k - 1, len(vals)):
        lines.append(f"{i + 1}: {sum(vals[i - k + 1:i + 1]) / k:.2f}\n")
    return "".join(lines)


def same(got, exp):
    """Compare outputs without pytest's (very slow on long texts) diff rendering."""
    if got == exp:
        return True, ""
    g, e = (got or "").splitlines(), (exp or "").splitlines()
    for i, (a, b) in enumerate(zip(g, e)):
        if a != b:
            return False, f"line {i + 1}: got {a!r}, expected {b!r}"
    return False, f"got {len(g)} lines, expected {len(e)}"


def run(exe, values, k, tail=""):
    data = " ".join(map(str, values)) + tail + "\n"
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    return subprocess.run([exe, str(k)], input=data, capture_output=True, text=True, timeout=20, env=env)


CASES = [([1, 2, 3, 4], 2), ([5], 1), ([3, 4, 5], 3), ([-7, 7, -7, 7, 1], 2), ([10, 20, 30], 1)]


@pytest.mark.parametrize("kind", ["plain", "asan"])
def test_examples(binaries, kind):
    for vals, k in CASES:
        r = run(binaries[kind], vals, k)
        assert r.returncode == 0, r.stderr
        ok, msg = same(r.stdout, expected(vals, k))
        assert ok, (vals, k, msg)


@pytest.mark.parametrize("kind", ["plain", "asan"])
@pytest.mark.parametrize("n,k", [(999, 7), (1000, 10), (1001, 3), (1500, 1000), (2000, 1)])
def test_long_inputs(binaries, kind, n, k):
    rng = random.Random(n * 31 + k)
    vals = [rng.randint(-100000, 100000) for _ in range(n)]
    r = run(binaries[kind], vals, k)
    assert r.returncode == 0, r.stderr[-2000:]
    ok, msg = same(r.stdout, expected(vals, k))
    assert ok, msg


def test_stops_at_non_integer(binaries):
    r = run(binaries["plain"], [1, 2, 3], 2, tail=" x 9 9")
    ok, msg = same(r.stdout, expected([1, 2, 3], 2))
    assert ok, msg


def test_errors(binaries):
    r = run(binaries["plain"], [1, 2], 3)
    assert r.returncode == 1 and r.stdout == ""
    r = run(binaries["plain"], [1, 2], 0)
    assert r.returncode == 2
