import math
import subprocess

import pytest

BIN = "/app/strtool"


@pytest.fixture(scope="module", autouse=True)
def build():
    subprocess.run(["make", "clean"], cwd="/app", capture_output=True)
    r = subprocess.run(["make"], cwd="/app", capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def run(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_headers_unchanged():
    h = open("/app/include/strutil.h").read()
    assert "char *str_reverse(char *s);" in h
    assert "long lcm(long a, long b);" in open("/app/include/mathutil.h").read()


@pytest.mark.parametrize("s", ["abc", "racecar", "Hello, World", "x", "ab cd ef"])
def test_reverse(s):
    assert run("reverse", s) == s[::-1] + "\n"


@pytest.mark.parametrize("s", ["abc", "MiXeD 123 case!"])
def test_upper(s):
    assert run("upper", s) == s.upper() + "\n"


@pytest.mark.parametrize("a,b", [(12, 18), (17, 5), (0, 9), (-24, 36), (1071, 462)])
def test_gcd_lcm(a, b):
    assert run("gcd", str(a), str(b)) == f"{math.gcd(a, b)}\n"
    assert run("lcm", str(a), str(b)) == f"{abs(a * b) // math.gcd(a, b) if a and b else 0}\n"


def test_usage_error():
    r = subprocess.run([BIN, "nope"], capture_output=True, text=True)
    assert r.returncode == 2
