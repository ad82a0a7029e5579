"""SWE-bench-format tasks: the instance loader, the task folder, grading by the swebench package
on real eval logs, the importer (offline, and from a local clone), and the bundled instances
validated (oracle 1, no-op 0)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandfleet.errors import TaskError
from sandfleet.tasks import load_task, load_tasks
from sandfleet.tasks.reward import reward_from
from sandfleet.tasks.swebench import diff_files, grade_log, load_instances
from test_rollout_support import needs_bwrap

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "swebench"
LOGS = Path(__file__).parent / "fixtures" / "swebench-logs"
INSTANCES = EXAMPLES / "instances.jsonl"


def _grading(instance_id: str) -> dict[str, object]:
    inst = {i.instance_id: i for i in load_instances(INSTANCES)}[instance_id]
    return {"instance_id": inst.instance_id, "repo": inst.repo, "version": inst.version,
            "FAIL_TO_PASS": inst.FAIL_TO_PASS, "PASS_TO_PASS": inst.PASS_TO_PASS}


# -- the loader


def test_bundled_instances_load_with_provenance() -> None:
    insts = load_instances(INSTANCES)
    assert len(insts) >= 5
    assert len({i.repo for i in insts}) >= 3  # three projects
    for inst in insts:
        assert len(inst.base_commit) == 40 and inst.FAIL_TO_PASS and inst.PASS_TO_PASS
        prov = (inst.model_extra or {})["provenance"]
        assert prov["base_release"] != prov["fix_release"] and prov["changelog"] and len(prov["sdist_sha256"]) == 64
        assert inst.test_files and all(f.startswith("tests/") for f in inst.test_files)
        assert not set(diff_files(inst.patch)) & set(inst.test_files)  # the fix touches no test


def test_instances_as_the_datasets_store_them(tmp_path: Path) -> None:
    row = json.loads(INSTANCES.read_text().splitlines()[0])
    row["FAIL_TO_PASS"] = json.dumps(row["FAIL_TO_PASS"])  # the HF datasets' JSON strings
    row["PASS_TO_PASS"] = json.dumps(row["PASS_TO_PASS"])
    row["created_at"] = "2023-04-20"
    f = tmp_path / "one.json"
    f.write_text(json.dumps([row]))
    (inst,) = load_instances(f)
    assert inst.FAIL_TO_PASS == json.loads(row["FAIL_TO_PASS"]) and inst.model_extra["created_at"] == "2023-04-20"


@pytest.mark.parametrize(("change", "words"), [
    ({"base_commit": "abc"}, "base_commit"),
    ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS"),
    ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS"),
    ({"patch": None}, "patch"),
])
def test_a_bad_instance_names_its_line_and_field(tmp_path: Path, change: dict[str, object], words: str) -> None:
    rows = [json.loads(line) for line in INSTANCES.read_text().splitlines()[:2]]
    rows[1].update(change)
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TaskError, match=rf"line 2.*{words}"):
        load_instances(f)


def test_a_repeated_instance_is_refused(tmp_path: Path) -> None:
    line = INSTANCES.read_text().splitlines()[0]
    f = tmp_path / "twice.jsonl"
    f.write_text(f"{line}\n{line}\n")
    with pytest.raises(TaskError, match="appears twice"):
        load_instances(f)


# -- the task folder


def test_task_folders_load_as_swebench_tasks() -> None:
    tasks, failures = load_tasks(EXAMPLES)
    assert not failures and len(tasks) >= 5
    for task in tasks:
        assert task.format == "swebench" and task.workdir == "/testbed"
        assert task.verifier.reward == "swebench" and task.verifier.command == ("bash", "/tests/eval.sh")
        assert task.verifier.grading and task.verifier.grading["FAIL_TO_PASS"]
        assert task.solution is not None and task.base_image == "python:3.11-slim-bookworm"
        assert not task.allow_internet and "swebench" in task.metadata


def test_a_folder_whose_patch_differs_from_the_instance_is_refused(tmp_path: Path) -> None:
    src = next(p for p in sorted(EXAMPLES.iterdir()) if p.is_dir())
    folder = tmp_path / src.name
    shutil.copytree(src, folder)
    (folder / "solution" / "patch.diff").write_text("diff --git a/x b/x\n")
    with pytest.raises(TaskError, match="differs from swebench.json's patch"):
        load_task(folder)


def test_eval_script_and_markers_are_swebenchs() -> None:
    constants = pytest.importorskip("swebench.harness.constants")
    from sandfleet.tasks import swebench as ours

    for name in ("START_TEST_OUTPUT", "END_TEST_OUTPUT", "TEST_EXIT_CODE", "APPLY_PATCH_FAIL", "RESET_FAILED"):
        assert getattr(ours, name) == getattr(constants, name)
    script = (EXAMPLES / "andialbrecht__sqlparse-694" / "tests" / "eval.sh").read_text()
    assert script.index("git apply -v /tests/test.patch") < script.index(constants.START_TEST_OUTPUT)
    assert f'echo "{constants.TEST_EXIT_CODE}: $SWEBENCH_TEST_EXIT_CODE"' in script


# -- grading by the swebench package, on real logs


def _log_dirs() -> list[Path]:
    return sorted(p for p in LOGS.iterdir() if p.is_dir())


@pytest.mark.parametrize("logs", _log_dirs(), ids=lambda p: p.name)
def test_real_logs_grade_0_before_the_fix_and_1_after(logs: Path) -> None:
    pytest.importorskip("swebench")
    grading = _grading(logs.name)
    reward, details = grade_log((logs / "before.log").read_text(), grading)
    assert reward == 0.0 and details["resolved"] == 0.0 and details["tests_found"] == 1.0
    assert details["fail_to_pass"] == 0.0 and details["pass_to_pass"] == 1.0  # partial scores
    reward, details = grade_log((logs / "after.log").read_text(), grading)
    assert reward == 1.0 and details == {**details, "fail_to_pass": 1.0, "pass_to_pass": 1.0, "resolved": 1.0}
    assert all(details[f"F2P:{t}"] == 1.0 for t in grading["FAIL_TO_PASS"])  # type: ignore[attr-defined]


def test_one_broken_pass_to_pass_test_scores_0_with_partial_details() -> None:
    pytest.importorskip("swebench")
    logs = LOGS / "andialbrecht__sqlparse-694"
    grading = _grading(logs.name)
    victim = grading["PASS_TO_PASS"][0]  # type: ignore[index]
    log = (logs / "after.log").read_text()
    assert f"PASSED {victim}\n" in log
    log = log.replace(f"PASSED {victim}\n", f"FAILED {victim} - AssertionError\n")
    log = log.replace("Test Exit Code: 0", "Test Exit Code: 1")
    reward, details = grade_log(log, grading)
    n = len(grading["PASS_TO_PASS"])  # type: ignore[arg-type]
    assert reward == 0.0 and details["fail_to_pass"] == 1.0
    assert details["pass_to_pass"] == pytest.approx((n - 1) / n) and details[f"P2P:{victim}"] == 0.0


def test_logs_swebench_rejects_score_0() -> None:
    pytest.importorskip("swebench")
    logs = LOGS / "andialbrecht__sqlparse-694"
    grading = _grading(logs.name)
    after = (logs / "after.log").read_text()
    no_markers = after.replace(">>>>> Start Test Output", "")
    lying = after.replace("Test Exit Code: 0", "Test Exit Code: 2")  # PASSED lines, failing runner
    not_applied = ">>>>> Patch Apply Failed\n" + after
    for log in (no_markers, lying, not_applied, ""):
        reward, details = grade_log(log, grading)
        assert reward == 0.0 and details["tests_found"] == 0.0


def test_reward_from_dispatches_to_the_swebench_grader() -> None:
    pytest.importorskip("swebench")
    task = load_task(EXAMPLES / "andialbrecht__sqlparse-694")
    after = (LOGS / task.name / "after.log").read_text()
    reward = reward_from(task.verifier, output="other output\n" + after)
    assert reward.value == 1.0 and reward.details["resolved"] == 1.0


# -- the importer


def _local_clone(tmp_path: Path) -> tuple[Path, str]:
    """A local repository (owner__name) with two commits; returns it and the first's id."""
    repo = tmp_path / "repos" / "example__calc"
    repo.mkdir(parents=True)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin"}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout

    git("init", "-q", ".")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git("add", "-A")
    git("commit", "-q", "-m", "base")
    base = git("rev-parse", "HEAD").strip()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    git("commit", "-q", "-am", "later")
    return repo.parent, base


def _instance(base: str, repo: str = "example/calc") -> dict[str, object]:
    return {"instance_id": "example__calc-1", "repo": repo, "base_commit": base, "version": "0.1",
            "patch": "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
                     " def add(a, b):\n-    return a - b\n+    return a + b\n",
            "test_patch": "diff --git a/tests/test_calc.py b/tests/test_calc.py\nnew file mode 100644\n"
                          "--- /dev/null\n+++ b/tests/test_calc.py\n@@ -0,0 +1,3 @@\n+from calc import add\n+\n"
                          "+def test_add():\n+    assert add(1, 2) == 3\n",
            "FAIL_TO_PASS": ["tests/test_calc.py::test_add"], "PASS_TO_PASS": [],
            "problem_statement": "add() subtracts."}


def test_import_from_a_local_clone_writes_the_tree_at_base_commit(tmp_path: Path) -> None:
    from sandfleet.cli import cli

    repos, base = _local_clone(tmp_path)
    f = tmp_path / "i.jsonl"
    f.write_text(json.dumps(_instance(base)) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["tasks", "import", "swebench", str(f), str(out), "--repos", str(repos)])
    assert result.exit_code == 0, result.output
    task = load_task(out / "example__calc-1")
    tree = out / "example__calc-1" / "environment" / "repo"
    assert (tree / "calc.py").read_text().endswith("a - b\n")  # base_commit, not the later commit
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    assert head == base and task.format == "swebench"
    assert "COPY repo/ /testbed/" in (out / "example__calc-1" / "environment" / "Dockerfile").read_text()


def test_import_offline_explains_why_it_cannot_fetch(tmp_path: Path) -> None:
    from sandfleet.cli import cli

    f = tmp_path / "i.jsonl"
    rows = [dict(_instance("0" * 40, "sandfleet-offline-test/nowhere"), instance_id=f"nowhere-{i}") for i in (1, 2)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["tasks", "import", "swebench", str(f), str(out)])
    assert result.exit_code == 1
    assert "cannot fetch https://github.com/sandfleet-offline-test/nowhere.git" in result.output
    assert "--repos DIR" in result.output and "wrote 0 tasks" in result.output
    report = (out / "IMPORT_REPORT.md").read_text()
    assert "nowhere-1" in report and "nowhere-2" in report  # the repository is tried once, both skipped
    assert not (out / "nowhere-1").exists()


# -- the bundled instances, validated


@pytest.mark.slow
@needs_bwrap()
def test_bundled_instances_validate_oracle_1_noop_0(tmp_path: Path) -> None:
    pytest.importorskip("swebench")
    from sandfleet.cli import cli

    report = tmp_path / "v.json"
    result = CliRunner().invoke(cli, ["tasks", "validate", str(EXAMPLES), "-r", "1", "--report", str(report)])
    verdicts = json.loads(report.read_text())
    assert result.exit_code == 0, result.output
    assert len(verdicts) >= 5 and all(v["status"] == "valid" for v in verdicts.values()), verdicts


def test_a_log_the_code_under_test_printed_into_is_not_the_tests_decision() -> None:
    """Round XIX: the code under test runs in the tests' process and prints into the log swebench grades:
    a PASSED line for the FAIL_TO_PASS test as the process ends (swebench keeps a test's last status) and
    an exit-code line of 0 (swebench reads the first one): the swebench package alone graded that 1. The two
    statuses of one test are a tests_status 0; with the status eval.sh kept (STATUS_FILE), a test command
    ended by a signal is a tests_killed 0 and one that failed with a log of no failure no run, whatever its
    log says."""
    pytest.importorskip("swebench")
    from sandfleet.errors import RolloutError

    logs = LOGS / "andialbrecht__sqlparse-694"
    grading = _grading(logs.name)
    f2p = grading["FAIL_TO_PASS"][0]  # type: ignore[index]
    before = (logs / "before.log").read_text()
    assert f"FAILED {f2p}" in before
    start, end = ">>>>> End Test Output", ">>>>> Test Exit Code: 1"
    assert start in before and end in before
    printed = before.replace(start, f">>>>> Test Exit Code: 0\nPASSED {f2p}\n{start}")
    for kept in (1, None):  # (None: an eval.sh of before round XIX, which keeps none)
        with pytest.raises(RolloutError, match="a passing and a failing status") as info:
            grade_log(printed, grading, exit_code=kept)
        assert info.value.reason == "tests_status" and f"{f2p}: FAILED then PASSED" in str(info.value)
    # the pytest killed before its own summary: only the printed lines are left
    killed = printed.replace(f"FAILED {f2p}", "")
    with pytest.raises(RolloutError, match="ended by signal 9") as info:
        grade_log(killed, grading, exit_code=137)
    assert info.value.reason == "tests_killed"
    # the kept status replaces every exit-code line: a log of no failure with a failing status is no run
    reward, details = grade_log(killed, grading, exit_code=1)
    assert reward == 0.0 and details["tests_found"] == 0.0
    # honest logs grade as before with their kept status
    assert grade_log((logs / "after.log").read_text(), grading, exit_code=0)[0] == 1.0
    assert grade_log(before, grading, exit_code=1)[0] == 0.0


def test_reward_from_reads_the_kept_status() -> None:
    pytest.importorskip("swebench")
    from sandfleet.errors import RolloutError

    task = load_task(EXAMPLES / "andialbrecht__sqlparse-694")
    after = (LOGS / task.name / "after.log").read_text()
    assert reward_from(task.verifier, output=after, test_status="0\n").value == 1.0
    assert reward_from(task.verifier, output=after, test_status="1\n").details["tests_found"] == 0.0
    with pytest.raises(RolloutError, match="not a number") as info:
        reward_from(task.verifier, output=after, test_status="zero")
    assert info.value.reason == "bad_reward_value"
    assert f"> {'/logs/verifier/test-exit-code'}" in (EXAMPLES / task.name / "tests" / "eval.sh").read_text()
