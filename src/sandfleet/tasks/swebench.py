"""SWE-bench-format tasks: instances, their task folders, and grading by the ``swebench`` package.

An *instance* is SWE-bench's record: ``instance_id``, ``repo``, ``base_commit``, ``patch`` (the
reference fix), ``test_patch`` (the tests that show the bug), ``FAIL_TO_PASS`` and
``PASS_TO_PASS`` (test names, as lists or as the JSON strings of the published datasets) and
``version``; ``problem_statement`` and other keys are kept as they come.
:func:`load_instances` reads them from JSON Lines (or a JSON list).

A *task folder* of this format (the loader's marker is ``swebench.json``) holds::

    swebench.json           the instance (plus sandfleet's keys: test_cmd, log_parser, eval_type)
    instruction.md          what the agent is told (the problem statement)
    environment/Dockerfile  the repository at base_commit in /testbed, a git work tree
    solution/patch.diff     == the instance's patch;   solution/solve.sh applies it (git apply)
    tests/test.patch        == the instance's test_patch; tests/eval.sh is SWE-bench's eval script

The verifier runs ``tests/eval.sh`` after the agent stops, as SWE-bench's harness does: reset
the test files to base_commit, apply test_patch, run the test command between SWE-bench's
start/end markers, record its exit code. The log is graded on the host by the swebench
package's own functions (:func:`grade_log`): ``make_test_spec``, ``get_logs_eval`` (which runs
the instance's log parser, ``parse_log_pytest`` by default), ``get_eval_tests_report``,
``get_resolution_status``. The reward is 1 only when the resolution status is FULL (every
FAIL_TO_PASS and PASS_TO_PASS test passes); the fractions and each test's outcome go in the
reward's details.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandfleet.errors import RolloutError, TaskError
from sandfleet.tasks._validate import validate
from sandfleet.tasks.model import SolutionPlan, Upload, VerifierPlan
from sandfleet.tasks.witness import TESTS_STATUS, Witness

MARKER = "swebench.json"
WORKDIR = "/testbed"
"""Where SWE-bench's images keep the repository."""
DEFAULT_TEST_CMD = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider"
DEFAULT_PARSER = "parse_log_pytest"
DEFAULT_TIMEOUT_S = 1800.0

# SWE-bench's log markers (swebench.harness.constants); tests/test_swebench.py checks they
# are the package's.
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
TEST_EXIT_CODE = ">>>>> Test Exit Code"
APPLY_PATCH_FAIL = ">>>>> Patch Apply Failed"
RESET_FAILED = ">>>>> Reset Failed"
TEST_EXIT_LINE = re.compile(rf"{re.escape(TEST_EXIT_CODE)}:\s*-?\d+")
"""A line of the log that swebench reads the test command's exit code from (the first it finds)."""
STATUS_FILE = "/logs/verifier/test-exit-code"
"""Where eval.sh keeps the test command's exit code: in the reward folder, which the seal and the guard
keep from the code under test, so it is the one the tests' shell saw, not a line the code printed into the
log (round XIX: a patch printed ``>>>>> Test Exit Code: 0`` and a PASSED line as the tests' process ended)."""


def _names(value: Any) -> Any:
    """SWE-bench's datasets store the test lists as JSON strings; accept both."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ValueError("must be a list of test names (or its JSON text)") from None
    return value


class SWEbenchInstance(BaseModel):
    """One SWE-bench instance; keys beyond these are kept (``model_extra``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    instance_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    repo: str = Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    base_commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    patch: str = Field(min_length=1)
    test_patch: str = Field(min_length=1)
    FAIL_TO_PASS: list[str] = Field(min_length=1)
    PASS_TO_PASS: list[str]
    version: str
    problem_statement: str = ""
    test_cmd: str = DEFAULT_TEST_CMD
    """sandfleet's key: the command the eval script runs, followed by the test files."""
    log_parser: str = DEFAULT_PARSER
    """The swebench log parser (a key of ``swebench.harness.log_parsers.PARSER_REGISTRY``)."""
    eval_type: Literal["pass_and_fail", "fail_only"] = "pass_and_fail"

    _lists = field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")(_names)

    @property
    def test_files(self) -> list[str]:
        """The files test_patch touches (what the eval script resets and runs)."""
        return diff_files(self.test_patch)


def diff_files(patch: str) -> list[str]:
    """Paths a unified git diff changes, in order (``diff --git a/X b/X`` headers)."""
    out: list[str] = []
    for m in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, re.M):
        if m.group(2) not in out:
            out.append(m.group(2))
    return out


def load_instances(path: Path | str) -> list[SWEbenchInstance]:
    """Instances from a JSON Lines file (or a JSON list); :class:`TaskError` naming the line
    and the field of the first bad one."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    rows: list[tuple[str, Any]] = []
    if text.lstrip().startswith("["):
        try:
            rows = [(f"item {i}", r) for i, r in enumerate(json.loads(text))]
        except json.JSONDecodeError as e:
            raise TaskError(f"is not JSON: {e}", file=str(path)) from None
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((f"line {n}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise TaskError(f"line {n} is not JSON: {e}", file=str(path)) from None
    out = []
    seen: set[str] = set()
    for where, row in rows:
        if not isinstance(row, dict):
            raise TaskError(f"{where} is not an object", file=str(path))
        inst = validate(SWEbenchInstance, row, file=f"{path} ({where})")
        if inst.instance_id in seen:
            raise TaskError(f"{where}: instance_id {inst.instance_id!r} appears twice", file=str(path))
        seen.add(inst.instance_id)
        out.append(inst)
    return out


# -- the task folder


def eval_script(inst: SWEbenchInstance) -> str:
    """SWE-bench's eval script for ``inst`` (the shape of swebench's ``make_eval_script_list``):
    reset the test files, apply test_patch, run the tests between the markers, record the
    test command's exit code, reset the test files again."""
    files = inst.test_files
    quoted = " ".join(shlex.quote(f) for f in files)
    base = inst.base_commit
    # a test file test_patch creates does not exist at base_commit: reset only the others
    reset = (f'for f in {quoted}; do if git cat-file -e {base}:"$f" 2>/dev/null; then '
             f'git checkout -q {base} -- "$f" || exit 1; else rm -f -- "$f"; fi; done')
    return f"""#!/bin/bash
# SWE-bench evaluation of {inst.instance_id} (written by sandfleet; graded by the swebench package)
set -uo pipefail
cd {WORKDIR}
export GIT_CONFIG_GLOBAL=/dev/null
( {reset} ) || {{ echo "{RESET_FAILED}"; exit 1; }}
git apply -v /tests/test.patch || {{ echo "{APPLY_PATCH_FAIL}"; exit 1; }}
echo "{START_TEST_OUTPUT}"
{inst.test_cmd} {quoted}
SWEBENCH_TEST_EXIT_CODE=$?
echo "$SWEBENCH_TEST_EXIT_CODE" > {STATUS_FILE}
echo "{END_TEST_OUTPUT}"
echo "{TEST_EXIT_CODE}: $SWEBENCH_TEST_EXIT_CODE"
( {reset} ) || true
"""


SOLVE_SH = f"""#!/bin/bash
# The reference fix (the instance's patch), applied as SWE-bench applies a prediction.
set -euo pipefail
cd {WORKDIR}
export GIT_CONFIG_GLOBAL=/dev/null
git apply -v /solution/patch.diff
"""


def instruction_text(inst: SWEbenchInstance) -> str:
    statement = inst.problem_statement.strip() or f"Fix the bug of {inst.repo} that {inst.instance_id} is about."
    return (f"{statement}\n\nThe repository is checked out in {WORKDIR} (a git work tree at the commit to "
            "fix). Change its source so that the problem is solved; the tests are run after you stop.\n")


def write_task(folder: Path, inst: SWEbenchInstance, dockerfile: str, *, source_md: str = "",
               context: dict[str, bytes] | None = None) -> None:
    """Write ``inst`` as a task folder (replacing one there): the files the module docstring
    lists, ``environment/`` with ``dockerfile`` and the ``context`` files, ``SOURCE.md``."""
    import shutil

    if folder.exists():
        shutil.rmtree(folder)
    (folder / "environment").mkdir(parents=True)
    (folder / "solution").mkdir()
    (folder / "tests").mkdir()
    data = inst.model_dump(mode="json")
    (folder / MARKER).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / "instruction.md").write_text(instruction_text(inst), encoding="utf-8")
    (folder / "environment" / "Dockerfile").write_text(dockerfile, encoding="utf-8")
    for name, blob in (context or {}).items():
        (folder / "environment" / name).write_bytes(blob)
    (folder / "solution" / "patch.diff").write_text(inst.patch, encoding="utf-8")
    (folder / "solution" / "solve.sh").write_text(SOLVE_SH, encoding="utf-8")
    (folder / "tests" / "test.patch").write_text(inst.test_patch, encoding="utf-8")
    (folder / "tests" / "eval.sh").write_text(eval_script(inst), encoding="utf-8")
    for script in (folder / "solution" / "solve.sh", folder / "tests" / "eval.sh"):
        script.chmod(0o755)
    if source_md:
        (folder / "SOURCE.md").write_text(source_md, encoding="utf-8")


def read_instance(folder: Path) -> SWEbenchInstance:
    file = folder / MARKER
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TaskError(f"is not readable JSON: {e}", file=str(file)) from None
    if not isinstance(data, dict):
        raise TaskError("must hold one instance (a JSON object)", file=str(file))
    return validate(SWEbenchInstance, data, file=str(file))


def load_swebench(folder: Path) -> tuple[dict[str, Any], SolutionPlan, VerifierPlan]:
    """The loader's reader of a SWE-bench task folder: (fields, solution, verifier), as
    ``load_harbor`` returns them. Refuses a folder whose patch files differ from the instance."""
    inst = read_instance(folder)
    checks = [(folder / "solution" / "patch.diff", inst.patch, "patch"),
              (folder / "tests" / "test.patch", inst.test_patch, "test_patch")]
    for path, want, key in checks:
        if not path.is_file():
            raise TaskError("missing", file=str(path))
        if path.read_text(encoding="utf-8") != want:
            raise TaskError(f"differs from {MARKER}'s {key}", file=str(path))
    for path in (folder / "tests" / "eval.sh", folder / "solution" / "solve.sh", folder / "environment" / "Dockerfile"):
        if not path.is_file():
            raise TaskError("missing", file=str(path))
    meta = inst.model_extra or {}
    timeout = float(meta.get("timeout_s") or DEFAULT_TIMEOUT_S)
    instruction_file = folder / "instruction.md"
    instruction = (instruction_text(inst) if not instruction_file.is_file()
                   else instruction_file.read_text(encoding="utf-8"))
    solution = SolutionPlan(uploads=(Upload(source=folder / "solution", target="/solution"),),
                            command=("bash", "/solution/solve.sh"))
    plan = VerifierPlan(
        uploads=(Upload(source=folder / "tests", target="/tests"),),
        command=("bash", "/tests/eval.sh"),
        timeout_s=timeout,
        reward="swebench",
        grading={"instance_id": inst.instance_id, "repo": inst.repo, "version": inst.version,
                 "FAIL_TO_PASS": list(inst.FAIL_TO_PASS), "PASS_TO_PASS": list(inst.PASS_TO_PASS),
                 "log_parser": inst.log_parser, "eval_type": inst.eval_type},
        network=False,
    )
    fields: dict[str, Any] = {
        "instruction": instruction,
        "agent_timeout_s": timeout,
        "verifier_timeout_s": timeout,
        "allow_internet": False,
        "dockerfile": folder / "environment" / "Dockerfile",
        "context_dir": folder / "environment",
        "extra_env": {},
        "tests_dir": folder / "tests",
        "metadata": {"swebench": {"instance_id": inst.instance_id, "repo": inst.repo, "version": inst.version,
                                  "base_commit": inst.base_commit},
                     **({"provenance": meta["provenance"]} if "provenance" in meta else {})},
    }
    return fields, solution, plan


# -- grading, by the swebench package

_PASSING = frozenset({"PASSED", "XFAIL", "SKIPPED"})
_FAILING = frozenset({"FAILED", "ERROR"})


def _conflicting_statuses(log: str, spec: Any, grading: dict[str, Any]) -> list[str]:
    """The FAIL_TO_PASS and PASS_TO_PASS tests that the log's lines, each parsed alone by the instance's
    log parser, give both a passing and a failing status: ``name: FAILED then PASSED``."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    parser = PARSER_REGISTRY[grading.get("log_parser", DEFAULT_PARSER)]
    wanted = set(grading.get("FAIL_TO_PASS", ())) | set(grading.get("PASS_TO_PASS", ()))
    seen: dict[str, list[str]] = {}
    for line in log.splitlines():
        if not any(word in line for word in ("PASS", "FAIL", "ERROR", "SKIP", "XFAIL", "ok", "OK")):
            continue  # (most lines: the parser is not called for them)
        try:
            found = parser(line, spec)
        except Exception:  # noqa: BLE001 - a parser that needs more than one line: that line says nothing alone
            continue
        for name, status in found.items():
            if name in wanted and (not seen.get(name) or seen[name][-1] != status):
                seen.setdefault(name, []).append(status)
    return [f"{name}: {' then '.join(statuses)}" for name, statuses in seen.items()
            if _PASSING & set(statuses) and _FAILING & set(statuses)]


def _swebench() -> Any:
    try:
        from swebench.harness import grading, utils
    except ImportError as e:
        raise RolloutError(f"grading a SWE-bench task needs the swebench package: pip install "
                           f"'sandfleet[swebench]' ({e})", reason="grader_missing") from None
    return grading, utils


def grade_log(log: str, grading: dict[str, Any], exit_code: int | None = None,
              witness: Witness | None = None) -> tuple[float, dict[str, float]]:
    """Grade an eval log with swebench's own functions: (reward, details).

    ``grading`` holds instance_id, repo, version, FAIL_TO_PASS, PASS_TO_PASS, log_parser and
    eval_type. The reward is 1.0 when ``get_resolution_status`` says FULL, else 0.0. Details:
    ``resolved``, ``tests_found`` (0 when swebench finds no valid test output: the patch
    did not apply, the markers are missing, the runner never ran or its exit code contradicts
    the log), ``fail_to_pass`` and ``pass_to_pass`` (the fractions that pass), and ``F2P:<test>``
    / ``P2P:<test>`` 1.0 or 0.0 for each test.

    The log is a stream the code under test writes to as well (it runs inside the tests' process), so
    what it says is checked against what it can't write (round XIX):
    - ``exit_code``, the test command's status as eval.sh kept it (:data:`STATUS_FILE`), replaces every
      exit-code line of the log (swebench cross-checks a log of no failure against it);
    - a test command ended by a signal (a status of 128 or more: killed, a crash) ran no whole suite:
      ``tests_killed``, whatever the log says;
    - a test the log gives a passing and a failing status (each line parsed alone: a line printed after
      pytest's own, and swebench keeps the last) is not what the run decided: ``tests_status``.
    - a FAIL_TO_PASS or PASS_TO_PASS test the log says passed that pytest itself reported failed, or never
      reported passing, to the guard's witness (:class:`~sandfleet.tasks.reward.Witness`: node ids, cut at
      their first space as swebench's names are) is ``tests_status`` too: the log was changed on its way
      out (pytest's writer wrapped).
    Both raise :class:`RolloutError` with that reason (the verifier scores it 0, a policy fault)."""
    grading_mod, utils = _swebench()
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, EvalType, ResolvedStatus

    if grading.get("log_parser", DEFAULT_PARSER) not in __import__(
            "swebench.harness.log_parsers", fromlist=["PARSER_REGISTRY"]).PARSER_REGISTRY:
        raise RolloutError(f"swebench has no log parser {grading.get('log_parser')!r}", reason="parser")
    spec = utils.make_test_spec({
        "instance_id": grading["instance_id"], "image": "", "repo": grading.get("repo", ""),
        "version": grading.get("version", ""), "FAIL_TO_PASS": list(grading["FAIL_TO_PASS"]),
        "PASS_TO_PASS": list(grading["PASS_TO_PASS"]), "log_parser": grading.get("log_parser", DEFAULT_PARSER),
        "eval_type": grading.get("eval_type", "pass_and_fail"), "eval_script": "",
    })
    if exit_code is not None:
        if exit_code >= 128:
            raise RolloutError(f"the test command was ended by signal {exit_code - 128} (status {exit_code}): "
                               "the log is not a whole run's, whatever it says", reason="tests_killed")
        log = "\n".join(line for line in log.splitlines() if not TEST_EXIT_LINE.search(line))
        log += f"\n{TEST_EXIT_CODE}: {exit_code}\n"
    conflicts = _conflicting_statuses(log, spec, grading)
    if conflicts:
        raise RolloutError(f"the log gives {len(conflicts)} test(s) a passing and a failing status "
                           f"({'; '.join(conflicts[:3])}): a line printed besides the runner's own (the code under "
                           "test writes to the same output), so the log is not what the tests decided",
                           reason=TESTS_STATUS)
    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as f:
        f.write(log)
        f.flush()
        status_map, found = grading_mod.get_logs_eval(spec, f.name)
    wanted = set(spec.FAIL_TO_PASS) | set(spec.PASS_TO_PASS)
    passing = sorted(n for n in wanted if status_map.get(n) in _PASSING)
    wrong = witness.contradicts(passing) if witness is not None else []
    if wrong:
        raise RolloutError(f"the log says {len(wrong)} test(s) passed that pytest itself did not report passing to "
                           f"sandfleet's witness ({'; '.join(wrong[:3])}): the log is not what the tests decided",
                           reason=TESTS_STATUS)
    details: dict[str, float] = {"tests_found": 1.0 if found else 0.0}
    if not found:
        details.update(resolved=0.0, fail_to_pass=0.0, pass_to_pass=0.0)
        return 0.0, details
    report = grading_mod.get_eval_tests_report(status_map, {FAIL_TO_PASS: spec.FAIL_TO_PASS,
                                                            PASS_TO_PASS: spec.PASS_TO_PASS},
                                               eval_type=EvalType(spec.eval_type))
    resolved = grading_mod.get_resolution_status(report) == ResolvedStatus.FULL.value
    details["resolved"] = 1.0 if resolved else 0.0
    details["fail_to_pass"] = float(grading_mod.compute_fail_to_pass(report))
    details["pass_to_pass"] = float(grading_mod.compute_pass_to_pass(report))
    for key, short in ((FAIL_TO_PASS, "F2P"), (PASS_TO_PASS, "P2P")):
        for test in report[key]["success"]:
            details[f"{short}:{test}"] = 1.0
        for test in report[key]["failure"]:
            details[f"{short}:{test}"] = 0.0
    return (1.0 if resolved else 0.0), details
