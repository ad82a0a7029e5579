import json
import os
import random
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, "/tests")
from refconv import convert  # noqa: E402


def run(text):
    d = tempfile.mkdtemp()
    src, dst = os.path.join(d, "in.ini"), os.path.join(d, "out.json")
    open(src, "w").write(text)
    r = subprocess.run(["python3", "/app/convert_config.py", src, dst], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return json.load(open(dst))


def test_provided_file_converted():
    exp = convert(open("/app/legacy/app.ini").read())
    assert json.load(open("/app/config.json")) == exp
    assert run(open("/app/legacy/app.ini").read()) == exp
    assert exp["database"]["replica"]["weights"] == [1, 2.5, 3]
    assert exp["features"]["banner"] is None


VALUES = ["1", "-7", "+3", "0.5", "-.25", "1e3", "2E-2", "yes", "No", "ON", "off", "TRUE", "false", "", "  ",
          "hello", "a, b, c", "1, two, 3.0, off", '"quoted, not split"', '"42"', "100%", "%(x)s", "1.2.3",
          "x=y", "http://h:80/p?q=1", " spaced out "]


def gen(seed):
    rng = random.Random(seed)
    lines = []
    if rng.random() < 0.7:
        lines += ["[DEFAULT]", f"shared = {rng.choice(VALUES)}", ""]
    names = ["alpha", "beta", "beta.gamma", "beta.gamma.delta", "eps", "Zeta"]
    for sec in rng.sample(names, rng.randint(1, len(names))):
        lines.append(f"[{sec}]")
        for k in range(rng.randint(0, 6)):
            key = rng.choice(["Key", "name", "count", "ratio", "flags", "path", "shared"]) + str(k)
            lines.append(f"{key} = {rng.choice(VALUES)}")
        lines.append(rng.choice(["", "; comment", "# another"]))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(12))
def test_generated(seed):
    text = gen(seed)
    assert run(text) == convert(text)
