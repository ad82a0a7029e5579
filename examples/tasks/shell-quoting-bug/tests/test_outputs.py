import hashlib
import os
import subprocess
import tempfile

import pytest

NAMES = ["plain.txt", "with space.txt", "two  spaces.md", "tab\there.txt", "-rf.txt", "--help.md", "star*.txt",
         "[abc].md", "q'uote.txt", 'd"quote.md', "$HOME.txt", "a;b.txt", "x.TXT", "skip.log", "notes.txt.bak",
         "sub dir/inner file.md", "sub dir/-deep/[x] y.txt", "*/odd.txt", "dots/.hidden.txt", "sub dir/keep.log"]


def make_src(root):
    for i, n in enumerate(NAMES):
        p = os.path.join(root, n)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(f"content {i} of {n}\n")
    # a directory that looks like a matching file must not be copied as a file
    os.makedirs(os.path.join(root, "folder.txt"), exist_ok=True)


def expected(root):
    out = []
    for dirpath, _, files in os.walk(root):
        for n in files:
            if n.endswith((".txt", ".md")):
                rel = os.path.relpath(os.path.join(dirpath, n), root)
                out.append((rel, hashlib.sha256(open(os.path.join(dirpath, n), "rb").read()).hexdigest()))
    return sorted(out, key=lambda t: t[0].encode())


@pytest.mark.parametrize("relative", [False, True])
def test_backup(relative):
    base = tempfile.mkdtemp()
    src = os.path.join(base, "my src")
    dst = os.path.join(base, "back up", "dest dir")
    os.makedirs(src)
    make_src(src)
    args = ["/app/backup.sh", "my src", "back up/dest dir"] if relative else ["/app/backup.sh", src, dst]
    r = subprocess.run(args, cwd=base, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    exp = expected(src)
    assert r.stdout.strip().splitlines()[-1] == f"backed up {len(exp)} files"
    copied = []
    for dirpath, _, files in os.walk(dst):
        for n in files:
            copied.append(os.path.relpath(os.path.join(dirpath, n), dst))
    assert sorted(copied) == sorted([rel for rel, _ in exp] + ["MANIFEST"])
    for rel, digest in exp:
        assert hashlib.sha256(open(os.path.join(dst, rel), "rb").read()).hexdigest() == digest
    manifest = open(os.path.join(dst, "MANIFEST")).read()
    assert manifest == "".join(f"{d}  {rel}\n" for rel, d in exp)
    assert os.listdir(src) and sorted(expected(src)) == sorted(exp)  # source untouched


def test_rerun_overwrites_manifest():
    base = tempfile.mkdtemp()
    src, dst = os.path.join(base, "s"), os.path.join(base, "d")
    os.makedirs(src)
    make_src(src)
    for _ in range(2):
        r = subprocess.run(["/app/backup.sh", src, dst], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
    assert open(os.path.join(dst, "MANIFEST")).read().count("\n") == len(expected(src))
