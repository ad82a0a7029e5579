"""The benchmark workload: commands typical of agentic coding sandboxes, real and offline.

:func:`prepare_workload` builds one directory, once, into the cache
(``cache_dir()/bench/workload-<VERSION>``) from pinned source distributions fetched with the
host's own pip configuration, and from data generated with fixed seeds and fixed dates:

- ``toolz/``: the toolz 0.12.1 sdist (its pytest suite needs only pytest);
- ``lz4/``: the C library sources from the lz4 4.3.3 sdist (``gcc -O2`` of ``lz4frame.c``);
- ``repo/``: a git repository with 240 commits of the toolz sources (fixed author and dates);
- ``data.sqlite``: customers and orders from ``random.Random(0)``;
- ``wheels/``: pure-Python wheels for ``pip install --no-index --find-links``.

Every command runs under ``bash -c`` with the workload as its working directory and ``$T``
naming a private scratch directory, inside a sandbox or as a bare host process alike.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from sandfleet.errors import SandfleetError
from sandfleet.settings import env_var

VERSION = "1"
TOOLZ = "toolz==0.12.1"
LZ4 = "lz4==4.3.3"
WHEELS = ("six==1.16.0", "idna==3.7", "packaging==24.1", "tomli==2.0.1")
PY = "/usr/bin/python3"


@dataclass(frozen=True)
class Command:
    """One named benchmark command."""

    name: str
    script: str
    """A bash script; cwd is the workload, ``$T`` a writable scratch directory."""
    needs: tuple[str, ...] = ()
    """Host programs it needs (checked before a run)."""


_SQL = (
    "select c.region, count(*), round(sum(o.amount), 2) from orders o join customers c "
    "on c.id = o.customer group by c.region order by 3 desc; "
    "select customer, sum(amount) s from orders group by customer order by s desc limit 10; "
    "select count(distinct customer) from orders where amount > 500 and day like '2024-0%';"
)

COMMANDS: tuple[Command, ...] = (
    Command("python_imports", f"{PY} -c 'import asyncio, json, decimal, email.parser, "
            "http.client, sqlite3, xml.etree.ElementTree, unittest, argparse, dataclasses, typing'",
            (PY,)),
    Command("pytest_toolz", f"cd toolz && {PY} -m pytest -q -p no:cacheprovider toolz/tests "
            ">/dev/null", (PY,)),
    Command("gcc_o2", 'gcc -O2 -c lz4/lz4frame.c -o "$T/lz4frame.o" && rm -f "$T/lz4frame.o"',
            ("gcc",)),
    Command("git", "git -C repo status --short >/dev/null && git -C repo log --oneline | wc -l "
            "&& git -C repo diff HEAD~100 HEAD --stat | tail -1", ("git",)),
    Command("grep_find", "grep -rn 'def ' toolz lz4 | wc -l && find . -type f -name '*.py' "
            "| wc -l && find . -newer data.sqlite | wc -l", ("grep", "find")),
    Command("sqlite", f'sqlite3 data.sqlite "{_SQL}" >/dev/null', ("sqlite3",)),
    Command("tar_gzip", 'tar -czf "$T/src.tgz" toolz lz4 && mkdir -p "$T/x" && '
            'tar -xzf "$T/src.tgz" -C "$T/x" && rm -rf "$T/x" "$T/src.tgz"', ("tar", "gzip")),
    Command("pip_install", f'{PY} -m pip install -q --disable-pip-version-check --no-cache-dir '
            '--no-index --find-links wheels --target "$T/site" six idna packaging tomli '
            '2>/dev/null && rm -rf "$T/site"', (PY,)),
)
"""The default mix, in the order a worker starts it."""

QUICK = ("python_imports", "sqlite")
"""A cheap subset (for tests and smoke runs)."""


def select(names: list[str] | tuple[str, ...] | None) -> list[Command]:
    """The commands of a comma list of names (all when empty)."""
    if not names:
        return list(COMMANDS)
    known = {c.name: c for c in COMMANDS}
    bad = [n for n in names if n not in known]
    if bad:
        raise SandfleetError(f"unknown bench command(s) {', '.join(bad)}; known: {', '.join(known)}")
    return [known[n] for n in names]


def workload_id(commands: list[Command]) -> dict[str, object]:
    """What makes two runs' latencies comparable: the workload version and each command's
    script (a SHA-256 prefix of it), by name."""
    return {"version": VERSION,
            "scripts": {c.name: hashlib.sha256(c.script.encode()).hexdigest()[:16] for c in commands}}


def missing_programs(commands: list[Command]) -> list[str]:
    """Programs the commands need that this host lacks."""
    need = {p for c in commands for p in c.needs}
    return sorted(p for p in need if not (Path(p).exists() if p.startswith("/") else shutil.which(p)))


def workload_dir() -> Path:
    from sandfleet.agent.build import cache_dir

    return cache_dir() / "bench" / f"workload-{VERSION}"


def prepare_workload(dest: Path | None = None) -> Path:
    """Build the workload directory once (downloads pinned sdists and wheels the first time)."""
    dest = dest or workload_dir()
    if (dest / ".ready").exists():
        return dest
    dl = dest.parent / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _pip_download(dl, ["--no-binary", ":all:", TOOLZ, LZ4])
    _pip_download(dl / "wheels", ["--only-binary", ":all:", *WHEELS])
    _extract(_one(dl, "toolz-*.tar.gz"), tmp / "toolz", strip="toolz-")
    lz4_src = tmp / "lz4src"
    _extract(_one(dl, "lz4-*.tar.gz"), lz4_src, strip="lz4-")
    shutil.copytree(lz4_src / "lz4libs", tmp / "lz4")
    shutil.rmtree(lz4_src)
    shutil.copytree(dl / "wheels", tmp / "wheels")
    make_repo(tmp / "toolz", tmp / "repo")
    make_db(tmp / "data.sqlite")
    (tmp / ".ready").write_text(VERSION + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def _pip_download(dest: Path, args: list[str]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SandfleetError(f"could not fetch the bench workload ({' '.join(args)}): "
                             f"{res.stderr.strip()[-500:]}")


def _one(d: Path, pattern: str) -> Path:
    found = sorted(d.glob(pattern))
    if not found:
        raise SandfleetError(f"no {pattern} in {d}")
    return found[-1]


def _extract(archive: Path, dest: Path, *, strip: str) -> None:
    with tarfile.open(archive) as tar:
        tar.extractall(dest.parent / (dest.name + ".x"), filter="data")
    (top,) = [p for p in (dest.parent / (dest.name + ".x")).iterdir() if p.name.startswith(strip)]
    top.rename(dest)
    (dest.parent / (dest.name + ".x")).rmdir()


def make_repo(src: Path, dest: Path, commits: int = 240) -> None:
    """A git repository with history: the files of ``src`` added one by one, then edited."""
    files = sorted(p for p in src.rglob("*.py") if p.is_file())
    env = {"PATH": env_var("PATH") or "/usr/bin:/bin", "HOME": str(dest),
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@sandfleet",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@sandfleet"}
    dest.mkdir(parents=True)

    def git(*args: str, when: int = 0) -> None:
        date = f"{1700000000 + when * 3600} +0000"
        subprocess.run(["git", *args], cwd=dest, env={**env, "GIT_AUTHOR_DATE": date,
                       "GIT_COMMITTER_DATE": date}, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    rng = random.Random(0)
    for i in range(commits):
        if i < len(files):
            rel = files[i].relative_to(src)
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(files[i], dest / rel)
        else:
            rel = files[rng.randrange(len(files))].relative_to(src)
            with (dest / rel).open("a") as f:
                f.write(f"\n# revision {i}: {rng.getrandbits(64):016x}\n")
        git("add", str(rel), when=i)
        git("commit", "-q", "-m", f"step {i}: {rel}", when=i)
    # leave a dirty working tree, as an agent would
    with (dest / files[0].relative_to(src)).open("a") as f:
        f.write("\n# uncommitted\n")


def make_db(path: Path, customers: int = 5000, orders: int = 120_000) -> None:
    rng = random.Random(0)
    regions = ["north", "south", "east", "west", "centre"]
    con = sqlite3.connect(path)
    with con:
        con.execute("create table customers (id integer primary key, name text, region text)")
        con.execute("create table orders (id integer primary key, customer int, amount real, day text)")
        con.executemany("insert into customers values (?, ?, ?)",
                        [(i, f"c{i:05d}", rng.choice(regions)) for i in range(customers)])
        con.executemany("insert into orders values (?, ?, ?, ?)", [
            (i, rng.randrange(customers), round(rng.uniform(1, 1000), 2),
             f"2024-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}") for i in range(orders)])
    con.close()
