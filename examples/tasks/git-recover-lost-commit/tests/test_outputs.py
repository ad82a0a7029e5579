import os
import subprocess
import sys

import pytest


def git(*args):
    r = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd="/app",
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_on_main_and_clean():
    assert git("rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert git("status", "--porcelain").strip() == ""


def test_history_contains_all_commits():
    subjects = git("log", "--format=%s", "main").splitlines()
    for s in ["Initial pricing module", "Add tax calculation", "Expand README",
              "Add discount calculation"]:
        assert s in subjects, subjects
    assert subjects.count("Add discount calculation") == 1


def test_readme_change_kept():
    assert "subtotal, tax and discounts" in git("show", "main:README.md")


def test_discount_behaviour():
    src = git("show", "main:pricing.py")
    ns = {}
    exec(compile(src, "pricing.py", "exec"), ns)
    d = ns["apply_discount"]
    assert d(1000, "SAVE10") == 900
    assert d(999, "save25") == 750
    assert d(1001, "HALF") == 501
    assert d(1234, "BOGUS") == 1234
    assert ns["tax"](1000, 7) == 70
    assert ns["subtotal"]([(250, 2), (100, 3)]) == 800
