"""``sandfleet tasks generate bash-basics``: a family of small Harbor shell tasks made from
templates, for RL training (docs/rl.md).

Every template has at least four instruction paraphrases. Each instance draws its own data
(file contents, names, numbers) from ``random.Random`` seeded by ``(seed, template, index)``,
so a seed gives the same tasks byte for byte. The split is by instance: per template, the
last ``max(1, n // 4)`` instances are the evaluation set, and the template's last paraphrase
is **held out** of training -- it is used only by evaluation instances (the first evaluation
instance of each template always uses it). ``manifest.jsonl`` records every task's template,
paraphrase and split.

A generated task is a plain Harbor task (``FROM python:3.11-slim-bookworm``, its input files
COPY'd into ``/app``), verified by ``tests/check.py`` from ``tests/expected.json``, which writes
``/logs/verifier/reward.json``: ``reward`` is the fraction of the task's checks that hold
(partial credit for the templates with several parts: directories made, files renamed), and
``outputs`` names the paths the task is about (the reward-hacking monitor compares them with
the oracle's).
"""

from __future__ import annotations

import json
import random
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.errors import ConfigError

FAMILIES = ("bash-basics",)

WORDS = (
    "apple banana cherry delta echo falcon garnet harbor indigo jasper kernel lemon mango nectar "
    "orbit pepper quartz river saffron tango umber violet walnut xenon yellow zephyr amber basil "
    "cedar dune ember fjord glacier hazel iris juniper kiwi lotus maple nova olive pine"
).split()


@dataclass
class Instance:
    """One task's data: its input files, what the verifier checks, and the oracle's script."""

    params: dict[str, str]
    """Values the instruction's placeholders take."""
    files: dict[str, str]
    """Input files, relative to /app."""
    checks: list[dict[str, Any]]
    """What ``check.py`` checks (each one counts equally)."""
    solution: str
    """The oracle's bash (run in /app)."""
    outputs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Template:
    name: str
    paraphrases: tuple[str, ...]
    make: Callable[[random.Random], Instance]


def _words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]


def _text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _write_text(rng: random.Random) -> Instance:
    phrase = " ".join(_words(rng, rng.randint(2, 4)))
    name = f"{rng.choice(WORDS)}.txt"
    return Instance({"text": phrase, "file": name}, {},
                    [{"kind": "equals", "path": name, "expect": phrase + "\n", "mode": "text"}],
                    f"echo {shlex.quote(phrase)} > {name}", [name])  # fmt: skip


def _count_lines(rng: random.Random) -> Instance:
    lines = [" ".join(_words(rng, rng.randint(1, 4))) for _ in range(rng.randint(3, 12))]
    return Instance({"file": "notes.txt", "out": "count.txt"}, {"notes.txt": _text(lines)},
                    [{"kind": "equals", "path": "count.txt", "expect": str(len(lines)), "mode": "token"}],
                    "wc -l < notes.txt > count.txt", ["count.txt"])  # fmt: skip


def _count_words(rng: random.Random) -> Instance:
    lines = [" ".join(_words(rng, rng.randint(1, 5))) for _ in range(rng.randint(2, 6))]
    total = sum(len(line.split()) for line in lines)
    return Instance({"file": "words.txt", "out": "count.txt"}, {"words.txt": _text(lines)},
                    [{"kind": "equals", "path": "count.txt", "expect": str(total), "mode": "token"}],
                    "wc -w < words.txt > count.txt", ["count.txt"])  # fmt: skip


def _count_matches(rng: random.Random) -> Instance:
    target = rng.choice(WORDS[:12])
    lines = []
    for _ in range(rng.randint(5, 12)):
        ws = _words(rng, rng.randint(1, 4))
        if rng.random() < 0.4:
            ws.insert(rng.randrange(len(ws) + 1), target)
        lines.append(" ".join(ws))
    hits = sum(1 for line in lines if target in line.split())
    if hits == 0:
        lines[0] = target
        hits = 1
    # words are whole tokens, and no word contains another, so grep -cw counts the lines
    return Instance({"file": "log.txt", "word": target, "out": "matches.txt"}, {"log.txt": _text(lines)},
                    [{"kind": "equals", "path": "matches.txt", "expect": str(hits), "mode": "token"}],
                    f"grep -cw {target} log.txt > matches.txt", ["matches.txt"])  # fmt: skip


def _sort(rng: random.Random) -> Instance:
    names = rng.sample(WORDS, rng.randint(4, 9))
    return Instance({"file": "names.txt", "out": "sorted.txt"}, {"names.txt": _text(names)},
                    [{"kind": "equals", "path": "sorted.txt", "expect": _text(sorted(names)), "mode": "lines"}],
                    "LC_ALL=C sort names.txt > sorted.txt", ["sorted.txt"])  # fmt: skip


def _uniq(rng: random.Random) -> Instance:
    pool = rng.sample(WORDS, rng.randint(3, 6))
    lines = sorted(rng.choice(pool) for _ in range(rng.randint(len(pool) + 2, 14)))
    distinct = sorted(set(lines))
    return Instance({"file": "items.txt", "out": "unique.txt"}, {"items.txt": _text(lines)},
                    [{"kind": "equals", "path": "unique.txt", "expect": _text(distinct), "mode": "lines"}],
                    "uniq items.txt > unique.txt", ["unique.txt"])  # fmt: skip


def _cut(rng: random.Random) -> Instance:
    col = rng.randint(1, 3)
    rows = [[rng.choice(WORDS), str(rng.randint(1, 99)), rng.choice(WORDS)] for _ in range(rng.randint(3, 8))]
    ordinal = {1: "first", 2: "second", 3: "third"}[col]
    return Instance({"file": "table.csv", "col": str(col), "ordinal": ordinal, "out": "column.txt"},
                    {"table.csv": _text([",".join(r) for r in rows])},
                    [{"kind": "equals", "path": "column.txt", "expect": _text([r[col - 1] for r in rows]),
                      "mode": "lines"}],
                    f"cut -d, -f{col} table.csv > column.txt", ["column.txt"])  # fmt: skip


def _mkdir(rng: random.Random) -> Instance:
    dirs = rng.sample(WORDS, rng.randint(2, 4))
    parent = rng.choice(["projects", "data", "build", "work"])
    paths = [f"{parent}/{d}" for d in dirs]
    return Instance({"dirs": " ".join(paths)}, {},
                    [{"kind": "dir", "path": p} for p in paths],
                    "mkdir -p " + " ".join(paths), paths)  # fmt: skip


def _rename(rng: random.Random) -> Instance:
    old, new = rng.choice([("txt", "md"), ("log", "txt"), ("csv", "tsv"), ("jpeg", "jpg")])
    stems = rng.sample(WORDS, rng.randint(2, 4))
    files = {f"files/{s}.{old}": f"{s} {rng.randint(1, 999)}\n" for s in stems}
    checks: list[dict[str, Any]] = []
    for s in stems:
        checks.append({"kind": "moved", "path": f"files/{s}.{new}", "gone": f"files/{s}.{old}",
                       "expect": files[f"files/{s}.{old}"]})
    solution = f'cd files && for f in *.{old}; do mv -- "$f" "${{f%.{old}}}.{new}"; done'
    return Instance({"old": old, "new": new}, files, checks, solution,
                    [f"files/{s}.{new}" for s in stems] + [f"files/{s}.{old}" for s in stems])  # fmt: skip


def _awk_sum(rng: random.Random) -> Instance:
    rows = [[rng.choice(WORDS), str(rng.randint(1, 50))] for _ in range(rng.randint(3, 9))]
    total = sum(int(r[1]) for r in rows)
    return Instance({"file": "sales.csv", "out": "total.txt"}, {"sales.csv": _text([",".join(r) for r in rows])},
                    [{"kind": "equals", "path": "total.txt", "expect": str(total), "mode": "token"}],
                    "awk -F, '{s+=$2} END {print s}' sales.csv > total.txt", ["total.txt"])  # fmt: skip


def _head(rng: random.Random) -> Instance:
    lines = [" ".join(_words(rng, rng.randint(1, 3))) for _ in range(rng.randint(6, 12))]
    k = rng.randint(2, 5)
    return Instance({"file": "story.txt", "k": str(k), "out": "top.txt"}, {"story.txt": _text(lines)},
                    [{"kind": "equals", "path": "top.txt", "expect": _text(lines[:k]), "mode": "lines"}],
                    f"head -n {k} story.txt > top.txt", ["top.txt"])  # fmt: skip


def _replace(rng: random.Random) -> Instance:
    a, b = rng.sample(WORDS, 2)
    lines = []
    for _ in range(rng.randint(3, 7)):
        ws = _words(rng, rng.randint(2, 4))
        ws[rng.randrange(len(ws))] = a
        lines.append(" ".join(w for w in ws if w != b))
    expect = [" ".join(b if w == a else w for w in line.split()) for line in lines]
    return Instance({"file": "doc.txt", "old": a, "new": b}, {"doc.txt": _text(lines)},
                    [{"kind": "equals", "path": "doc.txt", "expect": _text(expect), "mode": "lines"}],
                    f"sed -i 's/\\b{a}\\b/{b}/g' doc.txt", ["doc.txt"])  # fmt: skip


def _copy(rng: random.Random) -> Instance:
    name = rng.choice(WORDS)
    body = _text([" ".join(_words(rng, 3)) for _ in range(rng.randint(1, 4))])
    dest = rng.choice(["backup", "archive", "saved"])
    return Instance({"file": f"{name}.conf", "dir": dest}, {f"{name}.conf": body},
                    [{"kind": "copied", "path": f"{dest}/{name}.conf", "source": f"{name}.conf", "expect": body}],
                    f"mkdir -p {dest} && cp {name}.conf {dest}/", [f"{dest}/{name}.conf"])  # fmt: skip


TEMPLATES: tuple[Template, ...] = (
    Template("write-text", (
        "Write exactly the text `{text}` (followed by a newline) into the file /app/{file}.",
        "Create /app/{file} containing the single line: {text}",
        "Put the line `{text}` in a new file /app/{file}.",
        "Save the words `{text}` as the only line of /app/{file}.",
    ), _write_text),
    Template("count-lines", (
        "Count the lines of /app/{file} and write just the number into /app/{out}.",
        "How many lines does /app/{file} have? Write only that number to /app/{out}.",
        "Write the number of lines in /app/{file} to /app/{out} (the number only).",
        "Store the line count of /app/{file} in /app/{out}, as a bare number.",
    ), _count_lines),
    Template("count-words", (
        "Count the words in /app/{file} and write just the number into /app/{out}.",
        "How many words are in /app/{file}? Write only that number to /app/{out}.",
        "Write the total number of words of /app/{file} to /app/{out} (the number only).",
        "Store the word count of /app/{file} in /app/{out}, as a bare number.",
    ), _count_words),
    Template("count-matches", (
        "Count the lines of /app/{file} that contain the word `{word}` and write the number to /app/{out}.",
        "How many lines in /app/{file} mention `{word}`? Write only the number to /app/{out}.",
        "Write to /app/{out} the number of lines of /app/{file} containing the word {word}.",
        "Store in /app/{out} how many lines of /app/{file} include the word `{word}` (a bare number).",
    ), _count_matches),
    Template("sort-lines", (
        "Sort the lines of /app/{file} alphabetically and write the result to /app/{out}.",
        "Write the lines of /app/{file}, in sorted order, to /app/{out}.",
        "Put an alphabetically sorted copy of /app/{file} into /app/{out}.",
        "Order the names in /app/{file} from A to Z and save them, one per line, in /app/{out}.",
    ), _sort),
    Template("uniq-lines", (
        "/app/{file} is sorted and has repeated lines. Write each distinct line once to /app/{out}.",
        "Remove the duplicate lines of the sorted file /app/{file} and save the result as /app/{out}.",
        "Write the unique lines of /app/{file} (it is already sorted) to /app/{out}.",
        "Save /app/{file} without its repeated lines, in the same order, to /app/{out}.",
    ), _uniq),
    Template("cut-column", (
        "/app/{file} is comma-separated. Write its {ordinal} column to /app/{out}, one value per line.",
        "Extract column {col} of the CSV file /app/{file} into /app/{out}.",
        "Write the values of field {col} of each line of /app/{file} (fields are separated by commas) "
        "to /app/{out}.",
        "Save the {ordinal} comma-separated field of every line of /app/{file} in /app/{out}, one per line.",
    ), _cut),
    Template("make-dirs", (
        "Create these directories under /app: {dirs}",
        "Make the directories {dirs} inside /app (create parents as needed).",
        "In /app, create the following folders: {dirs}",
        "Set up the directory tree {dirs} under /app.",
    ), _mkdir),
    Template("rename-ext", (
        "In /app/files, rename every .{old} file so that it ends in .{new} instead.",
        "Change the extension of all the *.{old} files in /app/files to .{new}.",
        "Rename each file in /app/files from NAME.{old} to NAME.{new}.",
        "Every .{old} file in /app/files should become a .{new} file with the same name and content.",
    ), _rename),
    Template("awk-sum", (
        "/app/{file} has lines `name,amount`. Write the sum of the amounts to /app/{out}.",
        "Add up the second comma-separated column of /app/{file} and write the total to /app/{out}.",
        "Write the total of the numbers in column 2 of the CSV /app/{file} into /app/{out}.",
        "Sum the amount field (the second, comma-separated) over all lines of /app/{file}; "
        "save the number in /app/{out}.",
    ), _awk_sum),
    Template("head-lines", (
        "Write the first {k} lines of /app/{file} to /app/{out}.",
        "Save the top {k} lines of /app/{file} in /app/{out}.",
        "Copy only lines 1 to {k} of /app/{file} into /app/{out}.",
        "Put the opening {k} lines of /app/{file} into a new file /app/{out}.",
    ), _head),
    Template("replace-word", (
        "In /app/{file}, replace every occurrence of the word `{old}` with `{new}` (edit the file in place).",
        "Edit /app/{file} so that each `{old}` becomes `{new}`.",
        "Substitute {new} for {old} everywhere in /app/{file}, changing the file itself.",
        "Change all the words `{old}` in /app/{file} to `{new}`, in place.",
    ), _replace),
    Template("copy-file", (
        "Copy /app/{file} into a new directory /app/{dir}/, keeping the original.",
        "Make a backup: create /app/{dir} and copy /app/{file} into it.",
        "Create the folder /app/{dir} and put a copy of /app/{file} there (same file name).",
        "Duplicate /app/{file} as /app/{dir}/{file}, leaving /app/{file} in place.",
    ), _copy),
)
TEMPLATE_NAMES = tuple(t.name for t in TEMPLATES)

DOCKERFILE = "FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY app/ /app/\n"
TASK_TOML = """version = "1.0"

[metadata]
author_name = "sandfleet"
category = "bash-basics"
tags = ["generated", "bash-basics", "{template}"]
template = "{template}"
paraphrase = {paraphrase}
split = "{split}"
seed = {seed}

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 60.0

[environment]
build_timeout_sec = 120.0
cpus = 1
memory_mb = 256
storage_mb = 64
"""
TEST_SH = """#!/bin/bash
# Verifier: check.py compares /app with expected.json and writes reward.json.
mkdir -p /logs/verifier
cd /app || { echo '{"reward": 0}' > /logs/verifier/reward.json; exit 1; }
python3 /tests/check.py /tests/expected.json /logs/verifier/reward.json
rc=$?
[ -s /logs/verifier/reward.json ] || echo '{"reward": 0}' > /logs/verifier/reward.json
exit "$rc"
"""
CHECK_PY = '''"""Score /app against expected.json: the fraction of checks that hold, as reward.json."""
import json
import os
import sys


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def same(got, check):
    if got is None:
        return False
    want, mode = check["expect"], check.get("mode", "lines")
    if mode == "token":  # a bare value: surrounding whitespace does not matter
        return got.strip() == want.strip()
    if mode == "text":  # exact, but the final newline may be missing
        return got == want or got == want.rstrip("\\n")
    # lines: exact lines, trailing whitespace on a line and a missing final newline forgiven
    def norm(s):
        return [ln.rstrip() for ln in s.rstrip("\\n").split("\\n")]
    return norm(got) == norm(want)


def holds(check):
    kind = check["kind"]
    if kind == "equals":
        return os.path.isfile(check["path"]) and same(read(check["path"]), check)
    if kind == "dir":
        return os.path.isdir(check["path"])
    if kind == "moved":
        return (os.path.isfile(check["path"]) and not os.path.exists(check["gone"])
                and same(read(check["path"]), {"expect": check["expect"], "mode": "lines"}))
    if kind == "copied":  # the copy, and the original kept
        return all(os.path.isfile(p) and same(read(p), {"expect": check["expect"], "mode": "lines"})
                   for p in (check["path"], check["source"]))
    raise ValueError("unknown check " + repr(kind))


def main():
    spec = json.load(open(sys.argv[1]))
    results = [bool(holds(c)) for c in spec["checks"]]
    reward = sum(results) / len(results)
    for c, ok in zip(spec["checks"], results):
        print(("PASS " if ok else "FAIL ") + c["kind"] + " " + c["path"])
    with open(sys.argv[2], "w") as f:
        json.dump({"reward": reward}, f)
    return 0 if reward == 1 else 1


sys.exit(main())
'''


@dataclass(frozen=True)
class Generated:
    name: str
    template: str
    paraphrase: int
    split: str
    path: Path


def plan(n: int, seed: int) -> list[tuple[Template, int, int, str]]:
    """(template, instance index, paraphrase index, split) for every task, in order."""
    if n < 2:
        raise ConfigError(f"--n must be at least 2 (a training and an evaluation instance per template), got {n}")
    n_eval = max(1, n // 4)
    out = []
    for t in TEMPLATES:
        held = len(t.paraphrases) - 1
        rng = random.Random(f"{seed}:{t.name}:paraphrases")
        for i in range(n):
            if i < n - n_eval:
                out.append((t, i, rng.randrange(held), "train"))
            else:
                first = i == n - n_eval
                out.append((t, i, held if first or rng.random() < 0.5 else rng.randrange(held), "eval"))
    return out


def generate(family: str, out: Path, *, n: int, seed: int, templates: tuple[str, ...] = ()) -> list[Generated]:
    """Write ``n`` instances of every template (or of ``templates``) of ``family`` under
    ``out/train`` and ``out/eval``, and ``out/manifest.jsonl``."""
    if family not in FAMILIES:
        raise ConfigError(f"unknown task family {family!r} (known: {', '.join(FAMILIES)})")
    unknown = [t for t in templates if t not in TEMPLATE_NAMES]
    if unknown:
        raise ConfigError(f"unknown template(s) {', '.join(unknown)} (known: {', '.join(TEMPLATE_NAMES)})")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty; generate into a new folder")
    made: list[Generated] = []
    for t, i, p, split in plan(n, seed):
        if templates and t.name not in templates:
            continue
        inst = t.make(random.Random(f"{seed}:{t.name}:{i}"))
        name = f"{t.name}-s{seed}-{i:03d}"
        folder = out / split / name
        _write(folder, t, inst, p, split, seed)
        made.append(Generated(name, t.name, p, split, folder))
    with (out / "manifest.jsonl").open("w") as f:
        for g in made:
            f.write(json.dumps({"name": g.name, "template": g.template, "paraphrase": g.paraphrase,
                                "split": g.split, "path": str(g.path.relative_to(out))}) + "\n")
    return made


def _write(folder: Path, t: Template, inst: Instance, paraphrase: int, split: str, seed: int) -> None:
    app = folder / "environment" / "app"
    app.mkdir(parents=True)
    (app / ".keep").write_text("")  # COPY app/ needs the folder even when the task has no inputs
    for rel, text in inst.files.items():
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        (app / rel).write_text(text)
    (folder / "environment" / "Dockerfile").write_text(DOCKERFILE)
    (folder / "instruction.md").write_text(t.paraphrases[paraphrase].format(**inst.params) + "\n")
    (folder / "task.toml").write_text(TASK_TOML.format(template=t.name, paraphrase=paraphrase, split=split, seed=seed))
    (folder / "solution").mkdir()
    (folder / "solution" / "solve.sh").write_text(f"#!/bin/bash\nset -e\ncd /app\n{inst.solution}\n")
    tests = folder / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text(TEST_SH)
    (tests / "check.py").write_text(CHECK_PY)
    (tests / "expected.json").write_text(json.dumps({"template": t.name, "checks": inst.checks,
                                                     "outputs": inst.outputs, "solution": inst.solution}, indent=1))
