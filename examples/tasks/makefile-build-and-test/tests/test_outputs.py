import os
import shutil
import subprocess
import tempfile

import pytest


def make(cwd, *args):
    return subprocess.run(["make", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture()
def proj():
    d = tempfile.mkdtemp()
    p = os.path.join(d, "proj")
    os.makedirs(p)
    shutil.copy("/app/Makefile", p)
    shutil.copytree("/tests/orig/src", os.path.join(p, "src"))
    shutil.copytree("/tests/orig/tests", os.path.join(p, "tests"))
    return p


def test_default_build(proj):
    r = make(proj)
    assert r.returncode == 0, r.stdout + r.stderr
    out = subprocess.run([os.path.join(proj, "build/vecdemo"), "5", "-2", "9", "4"], capture_output=True, text=True)
    assert out.stdout == "count=4 sum=16 max=9\n"
    objs = [f for f in os.listdir(os.path.join(proj, "build")) if f.endswith(".o")]
    assert objs, "object files must be placed under build/"
    assert not [f for f in os.listdir(proj) if f.endswith(".o")]
    assert not [f for f in os.listdir(os.path.join(proj, "src")) if f.endswith(".o")]


def test_make_test_passes(proj):
    r = make(proj, "test")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all tests passed" in r.stdout
    assert os.path.exists(os.path.join(proj, "build/test_vec"))


def test_make_test_fails_on_bug(proj):
    src = os.path.join(proj, "src/vec.c")
    s = open(src).read().replace("s += v->data[i];", "s += v->data[i] + (i == 3);")
    open(src, "w").write(s)
    r = make(proj, "test")
    assert r.returncode != 0, "make test must fail when unit tests fail"


def test_clean(proj):
    assert make(proj).returncode == 0
    r = make(proj, "clean")
    assert r.returncode == 0
    assert not os.path.exists(os.path.join(proj, "build"))


def _age(proj, t):
    """Set every source and build output to time t."""
    for root, _, files in os.walk(proj):
        for f in files:
            os.utime(os.path.join(root, f), (t, t))


def test_incremental(proj):
    # fixed past times, not the clock: what a rebuild writes is newer than both, however long
    # the build took on a busy host
    old, changed = 1_600_000_000, 1_600_000_100
    assert make(proj).returncode == 0
    _age(proj, old)
    assert make(proj, "-q").returncode == 0, "second make should have nothing to do"
    os.utime(os.path.join(proj, "src/vec.h"), (changed, changed))
    assert make(proj, "-q").returncode != 0, "changing vec.h must trigger a rebuild"
    assert make(proj).returncode == 0
    assert os.path.getmtime(os.path.join(proj, "build/vecdemo")) > changed
    assert make(proj, "-q").returncode == 0
    _age(proj, old)
    os.utime(os.path.join(proj, "src/main.c"), (changed, changed))
    assert make(proj, "-q").returncode != 0, "changing main.c must trigger a rebuild"
    assert make(proj).returncode == 0
    assert os.path.getmtime(os.path.join(proj, "build/vecdemo")) > changed


def test_original_tree(proj):
    # the Makefile in /app must also work in place
    r = make("/app")
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.path.exists("/app/build/vecdemo")
