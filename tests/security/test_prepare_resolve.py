"""Where the guest agent's ``prepare`` says a link leads (agent/prepare.c, ``prep_resolve``), against
a reference in Python of the rule docs/security.md states: realpath -m of the link (every link on
the way followed, 40 at most, what does not exist kept as named), and whether a step of the way is
under /proc or a test or reward folder (round XVIII: a way that enters one and climbs out again).

``prepare`` keeps each link's way once it has walked it (a memo by the link's own place): here every
link of a random tree is asked for in a random order, so most answers come from ways walked before
for another link, and each must be the answer a walk from nothing gives. The resolver is compiled
out of prepare.c as it is (its functions, a ``main`` of this test's), on the host."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

PREPARE = Path(__file__).resolve().parents[2] / "src" / "sandfleet" / "agent" / "prepare.c"

MAIN = r"""
int main(int argc, char **argv) {
    /* argv[1..]: the protected folders; stdin: a path a line; out: "WHERE VIA" or "LOOP" */
    prep_protect_list = (const char *const *)(argv + 1);
    prep_protect_n = argc - 1;
    char line[PATH_MAX], res[PATH_MAX];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        int via = 0;
        if (prep_resolve(line, res, sizeof res, &via) < 0) printf("LOOP\n");
        else printf("%s %d\n", res, via);
    }
    return 0;
}
"""


def resolver(tmp: Path) -> Path:
    """prepare.c's memo, resolver and prep_under with a main of this test's, compiled."""
    text = PREPARE.read_text()
    start = text.index("struct prep_memo_entry {")
    end = text.index("/* the link at PATH, if it leads into a protected folder")
    source = tmp / "resolve.c"
    source.write_text("#define _GNU_SOURCE\n#include <limits.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
                      "#include <string.h>\n#include <sys/stat.h>\n#include <unistd.h>\n"
                      + text[start:end] + MAIN)
    out = tmp / "resolve"
    subprocess.run([shutil.which("gcc") or "gcc", "-O1", "-Wall", "-Werror", "-Wno-unused-function", "-o", str(out),
                    str(source)],
                   check=True, capture_output=True)
    return out


def reference(start: str, protect: list[str]) -> tuple[str, int] | None:
    """The rule, walked from nothing: None for a loop (more than 40 links)."""
    todo, res, hops, via = start, "", 0, 0
    while True:
        todo = todo.lstrip("/")
        if not todo:
            return (res or "/", via)
        part, _, todo = todo.partition("/")
        if part == ".":
            continue
        if part == "..":
            res = res[:res.rfind("/")] if "/" in res else res
            continue
        res = f"{res}/{part}"
        if res == "/proc" or res.startswith("/proc/") or any(res == p or res.startswith(p + "/") for p in protect):
            via = 1
        if Path(res).is_symlink():
            hops += 1
            if hops > 40:
                return None
            target = str(Path(res).readlink())
            res = "" if target.startswith("/") else res[:res.rfind("/")]
            todo = target + (f"/{todo}" if todo else "")


def tree(root: Path, rng: random.Random) -> list[str]:
    """Folders, and links among them of every kind: absolute, relative, climbing with .., into the
    tests' and the reward folder, through /proc, dangling, in loops, and a chain of 46 whose end is
    the tests' folder, a folder or nothing (the 40-link bound met from different starts)."""
    r = str(root)
    shutil.rmtree(r, ignore_errors=True)
    folders = [r, f"{r}/tests", f"{r}/logs/verifier", f"{r}/app/b/c", f"{r}/tmp/a", f"{r}/tmp/ch"]
    for d in folders:
        Path(d).mkdir(parents=True, exist_ok=True)
    links = [f"{d}/l{i}" for d in (f"{r}/app", f"{r}/tmp", f"{r}/tmp/a", f"{r}/app/b", f"{r}/logs") for i in range(6)]
    for link in links:
        kind, other = rng.random(), rng.choice([*links, *folders, f"{r}/tests/expected", f"{r}/logs/verifier/x"])
        if kind < 0.4:
            target = other
        elif kind < 0.6:
            target = other + "/" + rng.choice(["..", "../..", "../../tests/expected", "x", "../verifier/y"])
        elif kind < 0.8:
            target = os.path.relpath(other, Path(link).parent)
        else:
            target = rng.choice(["..", "../..", ".", "nothing", "../tests", "/proc/self/cwd", "../../../tests/e"])
        Path(link).symlink_to(target)
    for i in range(45):
        Path(f"{r}/tmp/ch/{i}").symlink_to(f"{r}/tmp/ch/{i + 1}")
    Path(f"{r}/tmp/ch/45").symlink_to(rng.choice([f"{r}/tests/deep", f"{r}/app", "nothing"]))
    return links + [f"{r}/tmp/ch/{i}" for i in range(46)]


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_prepare_resolves_every_link_as_a_walk_from_nothing_would(tmp_path: Path) -> None:
    binary = resolver(tmp_path)
    root = tmp_path / "root"
    protect = [f"{root}/tests", f"{root}/logs/verifier"]
    asked = loops = through = 0
    for seed in range(60):
        rng = random.Random(seed)
        links = tree(root, rng)
        queries = links + [f"{link}/x/.." for link in links[:10]] + [f"{link}/../l1" for link in links[:10]]
        rng.shuffle(queries)
        want = [reference(q, protect) for q in queries]
        got = subprocess.run([str(binary), *protect], input="".join(q + "\n" for q in queries), capture_output=True,
                             text=True, check=True).stdout.splitlines()
        for q, w, g in zip(queries, want, got, strict=True):
            assert g == ("LOOP" if w is None else f"{w[0]} {w[1]}"), (seed, q)
        asked += len(queries)
        loops += sum(w is None for w in want)
        through += sum(1 for w in want if w is not None and w[1])
    # the trees met every case: loops and ways past the bound, and ways through the folders or /proc
    assert loops > asked // 20 and through > asked // 10, (asked, loops, through)
