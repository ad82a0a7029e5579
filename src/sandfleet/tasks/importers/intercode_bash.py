"""InterCode-Bash from the ``intercode-bench`` package: natural-language queries over a small
file system (``/testbed``, built by the package's ``setup_fs.sh``), each with a gold command.

InterCode scores an episode by comparing the agent's container with one where the gold command
ran: the file-system diff (``git status``), the content of files both changed, and the
similarity of the last command output to the gold output (TF-IDF). Offline and binary, the
closest faithful check is: after the agent stops, the verifier rebuilds the pristine testbed
under /tmp/gold, runs the gold command there (paths rewritten, cwd / as in InterCode), and
gives reward 1 when /testbed matches the gold result (every path, type and file content,
empty directories included) and, when the gold command prints something, when
/app/answer.txt holds the same lines (order and spacing ignored, as bag-of-words TF-IDF
ignores them). Queries whose gold can't be reproduced offline or deterministically, or which
a no-op would pass, are skipped with the reason in IMPORT_REPORT.md.
"""

from __future__ import annotations

import json
import shlex
from importlib.util import find_spec
from pathlib import Path

from sandfleet.tasks.importers.common import (
    AGENT_OWNER,
    DOCKERFILE_HEAD,
    ImportResult,
    PackageMissingError,
    write_report,
    write_task,
)

SKIP = {
    1: "gold is malformed (unescaped ';' after find -exec): its only effect is an empty file",
    4: "gold runs 'du' on the whole root file system when grep finds nothing (xargs, no -r)",
    5: "no symbolic links in the testbed: the gold has no effect, so doing nothing would pass",
    6: "the query leaves the output file unnamed; the gold writes /total_size.txt in /",
    7: "no PNG files in the testbed (and no ImageMagick): doing nothing would pass",
    8: "gold output (ls -l) shows modification times and directory sizes of the file system",
    10: "gold output (du) counts disk blocks, which depend on the file system",
    13: "archive bytes embed timestamps; the gold selects files by modification time",
    16: "gold hashes its own output file while writing it; the result depends on traversal order",
    18: "no symbolic links in the testbed: the gold has no effect, so doing nothing would pass",
    20: "gold selects files by modification time relative to now",
    21: "needs jq, which a Debian 12 base image lacks offline",
    23: "gold does not do what the query asks (only the second input redirection applies)",
}
GOLD_REWRITE = {
    12: (
        "find /testbed -type f -name '*.txt' -exec sh -c "
        '\'for f; do mv "$f" "${f%.txt}.md"; done\' sh {} +',
        "util-linux 'rename' is not in a Debian 12 base; an equivalent mv loop runs instead",
    ),
}
HINTS = {3: "Name the new file textfile1_reverse_sorted.txt, in the same directory."}

SOURCE_MD = """# Source

- Suite: InterCode-Bash, query {index} of `intercode/assets/datasets/bash_queries.json`
- Package: `intercode-bench` (PyPI); file system from `intercode/assets/docker/setup_fs.sh`
- Upstream: https://github.com/princeton-nlp/intercode
- Licence: MIT (Copyright (c) 2023 Princeton Natural Language Processing)
- Paper: Yang et al., "InterCode: Standardizing and Benchmarking Interactive Coding with
  Execution Feedback", NeurIPS 2023
{note}"""

INSTRUCTION = """{query}

The file system this task is about is the directory tree under `/testbed`.
{hint}If the task asks you to print, list, count or display something, also write exactly that
output (what the command prints, with absolute paths) to `/app/answer.txt`.
"""

TEST_SH = """#!/bin/bash
# InterCode-Bash verifier: compare /testbed and /app/answer.txt with the gold command's effect.
mkdir -p /logs/verifier
rm -f /logs/verifier/reward.txt /logs/verifier/reward.json
if timeout 120 python3 /tests/check.py; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
"""


def package_dir() -> Path:
    spec = find_spec("intercode")
    if spec is None or not spec.submodule_search_locations:
        raise PackageMissingError(
            "the intercode-bench package is not installed: pip install intercode-bench"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _echo_e(text: str) -> str:
    return text.replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\")


def interpret_setup_fs(script: str) -> dict[str, object]:
    """Interpret setup_fs.sh (mkdir -p / echo [-e] > file / chmod +x) as busybox sh runs it.

    Returns {"dirs": [...], "files": {path: {"content": str, "mode": int}}}, paths relative
    to /testbed."""
    dirs: set[str] = set()
    files: dict[str, dict[str, object]] = {}

    def rel(path: str) -> str:
        if not path.startswith("/testbed/"):
            raise ValueError(f"setup_fs.sh writes outside /testbed: {path}")
        return path[len("/testbed/") :].rstrip("/")

    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0] in ("rm",) or line.startswith("#!"):
            continue
        if words[:2] == ["mkdir", "-p"]:
            for path in words[2:]:
                parts = rel(path).split("/")
                dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        elif words[0] == "echo" and len(words) >= 4 and words[-2] == ">":
            text = _echo_e(words[2]) if words[1] == "-e" else " ".join(words[1:-2])
            files[rel(words[-1])] = {"content": text + "\n", "mode": 0o644}
        elif words[:2] == ["chmod", "+x"]:
            for path in words[2:]:
                files[rel(path)]["mode"] = 0o755
        else:
            raise ValueError(f"setup_fs.sh line not understood: {line}")
    return {"dirs": sorted(dirs), "files": files}


def _write_testbed(root: Path, testbed: dict[str, object]) -> None:
    for d in testbed["dirs"]:  # type: ignore[attr-defined]
        (root / d).mkdir(parents=True, exist_ok=True)
    for path, spec in testbed["files"].items():  # type: ignore[attr-defined]
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(spec["content"], encoding="utf-8")
        target.chmod(spec["mode"])


def import_intercode_bash(out_dir: Path | str) -> ImportResult:
    """Write one Harbor task per usable InterCode-Bash query under ``out_dir``."""
    out = Path(out_dir)
    result = ImportResult(out)
    pkg = package_dir()
    queries = json.loads((pkg / "assets" / "datasets" / "bash_queries.json").read_text("utf-8"))
    testbed = interpret_setup_fs((pkg / "assets" / "docker" / "setup_fs.sh").read_text("utf-8"))
    check_py = (Path(__file__).parent / "intercode_check.py").read_text(encoding="utf-8")
    for index, item in enumerate(queries):
        name = f"intercode-bash-{index:03d}"
        if index in SKIP:
            result.skipped[name] = SKIP[index]
            continue
        gold, note = GOLD_REWRITE.get(index, (item["gold"], ""))
        hint = HINTS.get(index, "")
        write_task(
            out / name,
            instruction=INSTRUCTION.format(query=item["query"], hint=hint + "\n" if hint else ""),
            dockerfile=DOCKERFILE_HEAD + f"COPY --chown={AGENT_OWNER} testbed /testbed\n",
            tests={
                "test.sh": TEST_SH,
                "check.py": check_py,
                "case.json": json.dumps(
                    {
                        "query": item["query"],
                        "gold": gold,
                        "original_gold": item["gold"],
                        "testbed": testbed,
                    },
                    indent=1,
                )
                + "\n",
            },
            solve_sh=_solve_sh(gold),
            source_md=SOURCE_MD.format(index=index, note=f"\nAdapted: {note}\n" if note else ""),
            toml_fields={
                "author": "Princeton NLP (InterCode)",
                "source": "intercode-bench",
                "difficulty": "easy",
                "category": "bash",
                "tags": '["bash", "intercode"]',
                "verifier_timeout": 180.0,
                "agent_timeout": 600.0,
            },
        )
        _write_testbed(out / name / "environment" / "testbed", testbed)
        result.written.append(name)
    write_report(
        result,
        "InterCode-Bash import",
        f"From the intercode-bench package ({len(queries)} queries).",
    )
    return result


def _solve_sh(gold: str) -> str:
    return (
        "#!/bin/bash\n# Reference solution: InterCode's gold command, run from / as InterCode "
        "does; its output is the answer.\ncd /\n"
        f"bash -c {shlex.quote(gold)} > /tmp/gold-output.txt 2>/dev/null\n"
        "cp /tmp/gold-output.txt /app/answer.txt\n"
    )
