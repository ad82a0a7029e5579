import subprocess


def git(*args):
    r = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd="/app",
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def load(src):
    ns = {}
    exec(compile(src, "greet.py", "exec"), ns)
    return ns


def test_merge_committed():
    assert git("rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    parents = git("rev-list", "--parents", "-n", "1", "HEAD").split()[1:]
    assert len(parents) == 2, "HEAD must be a merge commit"
    feature = git("rev-parse", "feature/i18n").strip()
    assert feature in parents
    subjects = git("log", "--format=%s", parents[0]).splitlines()
    assert "Normalise names and add farewell" in subjects
    assert git("status", "--porcelain").strip() == ""


def test_no_conflict_markers():
    src = git("show", "HEAD:greet.py")
    for marker in ("<<<<<<<", "=======", ">>>>>>>"):
        assert marker not in src


def test_behaviour():
    ns = load(git("show", "HEAD:greet.py"))
    greet, farewell = ns["greet"], ns["farewell"]
    assert greet("bob") == "Hello, Bob!"
    assert greet("  ada lovelace ", "fr") == "Bonjour, Ada Lovelace!"
    assert greet("MARIA", "es") == "Hola, Maria!"
    assert greet("jo", "de") == "Hallo, Jo!"
    assert greet("jo", "xx") == "Hello, Jo!"
    assert greet(name="kim", lang="es") == "Hola, Kim!"
    assert farewell(" sam smith") == "Goodbye, Sam Smith."
    out = subprocess.run(["python3", "main.py"], cwd="/app", capture_output=True, text=True)
    assert out.stdout == "Hello, World!\n"
