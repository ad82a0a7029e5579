"""Every kind of bad input the audit lists (finding 39) gets a one-line error naming it, never
a traceback; real ``sandfleet`` subprocesses, real files."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def sandfleet(*args: str, env: dict[str, str] | None = None, **kw: str) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "sandfleet.cli", *args], env=e, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def one_line_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if "rror" in line]
    assert len(errors) == 1, res.stderr
    for n in needles:
        assert n in errors[0], res.stderr


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"SANDFLEET_STATE": str(tmp_path / "state"), "SANDFLEET_CACHE": str(tmp_path / "cache")}


def test_bench_ns_not_a_number(env: dict[str, str], tmp_path: Path) -> None:
    res = sandfleet("bench", "run", "--ns", "1,a", "--modes", "sweep", "--out", str(tmp_path / "b.json"), env=env)
    one_line_error(res, "--ns", "'a'")
    assert not (tmp_path / "b.json").exists()


def test_log_level_by_name_and_a_bad_one(env: dict[str, str]) -> None:
    ok = sandfleet("sandbox", "ls", env={**env, "SANDFLEET_LOG_LEVEL": "DEBUG"})
    assert ok.returncode == 0, ok.stderr
    one_line_error(sandfleet("sandbox", "ls", env={**env, "SANDFLEET_LOG_LEVEL": "LOUD"}), "SANDFLEET_LOG_LEVEL")


def test_cpu_fraction_not_a_number(env: dict[str, str]) -> None:
    res = sandfleet("sandbox", "run", "--backend", "process", "--", "true",
                    env={**env, "SANDFLEET_CPU_FRACTION": "x"})  # fmt: skip
    one_line_error(res, "SANDFLEET_CPU_FRACTION", "'x'")


def test_malformed_image_json_is_skipped_with_a_warning(env: dict[str, str], tmp_path: Path) -> None:
    images = tmp_path / "cache" / "images"
    for name, text in {"a": "{}", "b": "[1, 2]", "c": '{"name": "x", "lowers": 3}', "d": "\xff\xfe"}.items():
        (images / name).mkdir(parents=True)
        (images / name / "image.json").write_bytes(text.encode("latin-1"))
    res = sandfleet("image", "ls", env=env)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "host" in res.stdout
    assert res.stderr.count("ignoring a malformed image") == 4, res.stderr


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"trial_name": "t", "started_at": "2025-01-01T00:00:00", "finished_at": "2025-01-01T00:00:01", '
         b'"verifier_result": [1]}', "'verifier_result' must be an object"),
        (b'{"trial_name": "t", "started_at": "2025-01-01T00:00:00", "finished_at": "2025-01-01T00:00:01", '
         b'"exception_info": "boom"}', "'exception_info' must be an object"),
        (b'{"trial_name": "t", "started_at": "2025-01-01T00:00:00", "finished_at": "2025-01-01T00:00:01", '
         b'"config": {"environment": 7}}', "'config.environment' must be an object"),
        (b'{"trial_name": "\xff\xfe"}', "not UTF-8"),
    ],
)
def test_trace_files_with_non_dict_fields_or_bad_encoding(tmp_path: Path, env: dict[str, str], content: bytes,
                                                          needle: str) -> None:  # fmt: skip
    job = tmp_path / "job"
    (job / "trial-1").mkdir(parents=True)
    (job / "trial-1" / "result.json").write_bytes(content)
    res = sandfleet("analyze", "--convert", "harbor", str(job), "--out", str(tmp_path / "o"), env=env)
    one_line_error(res, needle)


def test_mistyped_backend_everywhere(env: dict[str, str], tmp_path: Path) -> None:
    for args in (["sandbox", "run", "--backend", "bwarp", "--", "true"], ["bench", "micro", "--backend", "bwarp"]):
        one_line_error(sandfleet(*args, env=env), "'bwarp' is not one of")


def test_sandbox_rm_needs_a_whole_id(env: dict[str, str]) -> None:
    res = sandfleet("sandbox", "rm", "1", env=env)
    one_line_error(res, "no sandbox '1'", "whole id")


def test_eval_task_is_package_data(tmp_path: Path) -> None:
    """The eval task of ``bench run`` ships inside the package: every one of its files is
    matched by pyproject's package-data, and it is found from a copy of the package alone
    (as in site-packages, with no source checkout around it)."""
    pkg = ROOT / "src" / "sandfleet"
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["sandfleet"]
    files = [p.relative_to(pkg).as_posix() for p in (pkg / "bench" / "tasks").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]  # fmt: skip
    assert files and all(any(fnmatch.fnmatchcase(f, pat) for pat in patterns) for f in files), files
    site = tmp_path / "site-packages"
    shutil.copytree(pkg, site / "sandfleet", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sandfleet.bench.evals as e; t = e.find_task(e.DEFAULT_TASK); "
            "print(t.name, e.examples_dir())")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(site)},
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["implement-roman-numerals", str(site / "sandfleet" / "bench" / "tasks")]


def test_run_resume_of_a_directory_that_is_no_run(env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    tasks = tmp_path / "tasks" / "t"
    for sub in ("environment", "solution", "tests"):
        (tasks / sub).mkdir(parents=True)
    (tasks / "task.toml").write_text('version = "1.0"\n')
    (tasks / "instruction.md").write_text("x\n")
    (tasks / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n")
    (tasks / "solution" / "solve.sh").write_text("true\n")
    (tasks / "tests" / "test.sh").write_text("true\n")
    res = sandfleet("run", "--tasks", str(tasks.parent), "--backend", "process", "--image", "host", "--agent", "noop",
                    "--out", str(out), "--resume", env=env)  # fmt: skip
    one_line_error(res, "--resume", "run.json")
    assert json.dumps(sorted(p.name for p in out.iterdir())) == '["notes.txt"]'


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("writable_dirs", ("../../x",), "writable_dirs must be an absolute path"),
    ("writable_dirs", ("/",), "writable_dirs must be an absolute path"),
    ("workdir", "/a/../../etc", "workdir must be an absolute path"),
    ("image", "", "image must be an image name"),
    ("image", "../x", "image must be an image name"),
])  # fmt: skip
def test_sandbox_spec_refuses_paths_outside_the_sandbox(field: str, value: object, needle: str) -> None:
    """A spec from a client (the service passes them through) can't name a directory outside
    the sandbox, nor an empty or path-like image."""
    from pydantic import ValidationError

    from sandfleet.sandbox.spec import SandboxSpec

    with pytest.raises(ValidationError, match=needle):
        SandboxSpec(**{field: value})
