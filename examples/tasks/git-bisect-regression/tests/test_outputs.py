import re
import subprocess

REPO = "/app/repo"


def git(*args, check=True):
    r = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=REPO,
                       capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def slug_ok(rev):
    src = git("show", f"{rev}:slugify.py").stdout
    ns = {}
    exec(compile(src, "slugify.py", "exec"), ns)
    return ns["slugify"]("Top 10 Tips for 2024") == "top-10-tips-for-2024"


def test_answer_is_first_bad_commit():
    answer = open("/app/bad_commit.txt").read().strip()
    assert re.fullmatch(r"[0-9a-f]{40}", answer), answer
    assert git("cat-file", "-t", answer).stdout.strip() == "commit"
    # the commit must be on main's first-parent history
    history = git("rev-list", "--first-parent", "main").stdout.split()
    assert len(history) == 24, "history of main must not be rewritten"
    assert answer in history
    assert not slug_ok(answer), "the named commit is not bad"
    assert slug_ok(answer + "^"), "the parent of the named commit is already bad"


def test_repo_left_on_main():
    assert git("symbolic-ref", "--short", "HEAD").stdout.strip() == "main"
    assert git("bisect", "log", check=False).returncode != 0, "bisect session still active"
