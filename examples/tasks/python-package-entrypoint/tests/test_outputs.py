import os
import random
import subprocess
import sys
import tempfile

import pytest

ENV = dict(os.environ, PYTHONPATH="/app", PYTHONDONTWRITEBYTECODE="1")


def py(*args, cwd="/tmp", stdin=None):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize("mod", ["textstats", "textstats.core", "textstats.report", "textstats.cli"])
def test_import_any_module_first(mod):
    r = py("-c", f"import {mod}; import textstats; from textstats.report import format_report; "
                 "from textstats.cli import main; print(textstats.analyze('a b a').top(1))")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[('a', 2)]\n"


def expected(text, top):
    import re
    from collections import Counter
    c = Counter(re.findall(r"[a-z']+", text.lower()))
    lines = [f"lines: {text.count(chr(10))}", f"words: {sum(c.values())}", f"unique: {len(c)}", "top:"]
    lines += [f"  {w}: {n}" for w, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]
    return "\n".join(lines) + "\n"


def test_sample_from_app():
    r = py("-m", "textstats", "sample.txt", "--top", "2", cwd="/app")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "lines: 3\nwords: 11\nunique: 9\ntop:\n  sat: 2\n  the: 2\n"


@pytest.mark.parametrize("seed,top", [(1, None), (2, 5), (3, 1)])
def test_cli_hidden(seed, top):
    rng = random.Random(seed)
    words = ["alpha", "Beta", "gamma's", "delta", "EPS", "zeta", "eta"]
    text = "".join(" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) + rng.choice([".\n", "!\n", " -- \n"]) for _ in range(30))
    p = os.path.join(tempfile.mkdtemp(), "in put.txt")
    open(p, "w").write(text)
    args = ["-m", "textstats", p] + (["--top", str(top)] if top else [])
    r = py(*args)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected(text, top or 3)


def test_library_api():
    r = py("-c", "import textstats as t; s = t.analyze('x y x\\n'); print(s.words, s.unique, s.lines); "
                 "print(t.summarize('b a b', top=1))")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "3 2 1\nlines: 0\nwords: 3\nunique: 2\ntop:\n  b: 2\n"
