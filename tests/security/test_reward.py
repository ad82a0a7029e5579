"""Reward integrity (finding 19, and 12's user fields): what the agent leaves behind can't
forge the reward, a hostile reward file scores 0 quickly, what the tests start dies before
the reward is read -- and what code under test can still do (conftest.py, a module that
shadows one from the cwd), shown as it is, in shared and separate mode.

Rollouts run on the bwrap backend over the host image (no build), except the root-agent
residual-risk test, which needs a task image whose files belong to the sandbox's root.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sandfleet.errors import RolloutError
from sandfleet.rollout import RunConfig, ScriptedPolicy, run_suite
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.runner import RetryPolicy
from sandfleet.tasks import Task, load_task
from test_rollout_support import needs_bwrap as bwrap_needed

needs_bwrap = bwrap_needed()

WRITE_ZERO = "mkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt\n"


def harbor_task(root: Path, name: str, test_sh: str, *, dockerfile: str = "FROM python:3.11-slim-bookworm\n"
                "WORKDIR /app\n", tests: dict[str, str] | None = None, toml: str = "",
                env_files: dict[str, str] | None = None) -> Task:
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text(
        f'version = "1.0"\n{toml}[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n'
        "[environment]\ncpus = 1\nmemory_mb = 512\nstorage_mb = 256\n"
    )
    (folder / "instruction.md").write_text("Write hello into /app/out.txt.\n")
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in (env_files or {}).items():
        (folder / "environment" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "environment" / rel).write_text(text)
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    for rel, text in (tests or {}).items():
        (folder / "tests" / rel).write_text(text)
    return load_task(folder)


async def _host(task: Task) -> str:
    return "host"


async def rollouts(tasks: Sequence[Task], commands: Sequence[str], *, build: bool = False,
                   **config: Any) -> list[RolloutResult]:
    """One rollout of each task on bwrap, the agent replaying ``commands``."""
    cfg = RunConfig(backend="bwrap", concurrency=4, retry=RetryPolicy(max_attempts=1), **config)
    kwargs = {} if build else {"image_for": _host}
    report = await run_suite(list(tasks), ScriptedPolicy(commands), cfg, **kwargs)  # type: ignore[arg-type]
    return report.results


# -- what the agent leaves behind


@needs_bwrap
async def test_user_site_usercustomize_and_pth_of_the_agent_do_not_run_in_the_verifier(tmp_path: Path) -> None:
    hook = 'open("/logs/verifier/reward.txt", "w").write("1"); print("AGENT {} RAN", flush=True)'
    plant = (
        'site=$(python3 -m site --user-site) && mkdir -p "$site" && cd "$site" && '
        f"printf '%s\\n' '{hook.format('USERCUSTOMIZE')}' > usercustomize.py && "
        f"printf 'import os; %s\\n' '{hook.format('PTH')}' > zz-agent.pth && ls -la \"$site\""
    )
    task = harbor_task(tmp_path, "user-site", WRITE_ZERO + "python3 -c 'import sys; print(\"NOUSERSITE\", "
                       "sys.flags.no_user_site)'\n")
    (r,) = await rollouts([task], [plant])
    assert r.status == "completed", r.error
    assert "AGENT USERCUSTOMIZE RAN" not in r.verifier_output and "AGENT PTH RAN" not in r.verifier_output
    assert "NOUSERSITE 1" in r.verifier_output, r.verifier_output
    assert r.reward == 0.0


@needs_bwrap
async def test_background_reward_writers_of_the_agent_change_nothing(tmp_path: Path) -> None:
    loop = "while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; sleep 0.01; done"
    task = harbor_task(tmp_path, "writer", WRITE_ZERO + "sleep 0.5\n"
                       'echo "SURVIVORS=$(ps -u 1000 -o pid= | wc -l)"\n')
    (r,) = await rollouts([task], [f"nohup bash -c '{loop}' >/dev/null 2>&1 &",
                                   f"setsid bash -c '{loop}' </dev/null >/dev/null 2>&1 &", "sleep 0.2"])
    assert r.status == "completed", r.error
    assert "SURVIVORS=0" in r.verifier_output, r.verifier_output
    assert r.reward == 0.0


@needs_bwrap
async def test_non_root_agent_cannot_write_tests_solution_or_system_dirs(tmp_path: Path) -> None:
    dirs = "/tests /solution /oracle /usr /etc /usr/lib/python3/dist-packages /usr/local/lib/python3.11/dist-packages"
    probe = (f"for d in {dirs}; do if touch $d/agent-was-here 2>/dev/null; then echo WROTE $d; "
             "else echo DENIED $d; fi; done > /app/probe.txt; chmod 777 /tests 2>/dev/null && echo WROTE chmod "
             ">> /app/probe.txt; id -u >> /app/probe.txt")
    task = harbor_task(tmp_path, "writes", WRITE_ZERO + "cat /app/probe.txt\n"
                       "stat -c 'OWNER %n %u %a' /tests /tests/test.sh /logs/verifier\n")
    (r,) = await rollouts([task], [probe])
    out = r.verifier_output
    assert r.status == "completed", r.error
    assert "WROTE" not in out and out.count("DENIED") == 7, out
    assert "\n1000\n" in out  # the agent ran as the non-root 'agent'
    assert "OWNER /tests 0 755" in out and "OWNER /tests/test.sh 0 " in out
    # root's, writable by the tests, whose code can't change its mode (and so keep test.sh from writing)
    assert "OWNER /logs/verifier 0 777" in out


# -- hostile reward files


@needs_bwrap
async def test_fifo_link_folder_or_huge_reward_file_scores_zero_quickly(tmp_path: Path) -> None:
    rf = "/logs/verifier/reward.txt"
    cases = {
        "fifo": f"rm -f {rf}; mkfifo {rf}\n",
        "link": f"rm -f {rf}; ln -s /etc/passwd {rf}\n",
        "link-to-one": f"echo 1 > /tmp/one; rm -f {rf}; ln -s /tmp/one {rf}\n",
        "folder": f"rm -f {rf}; mkdir {rf}\n",
        "huge": f"head -c 200000 /dev/zero | tr '\\0' 1 > {rf}\n",
    }
    tasks = [harbor_task(tmp_path, name, "mkdir -p /logs/verifier\n" + sh) for name, sh in cases.items()]
    try:
        async with asyncio.timeout(120):
            results = await rollouts(tasks, [])
    except TimeoutError:
        pytest.fail("a rollout hung on its reward file")
    for r in results:
        assert r.status == "completed", (r.task, r.reason, r.error)
        assert (r.reward, r.reason) == (0.0, "bad_reward_file"), (r.task, r.reward, r.reason, r.info)
        assert r.duration < 30, (r.task, r.duration)


@needs_bwrap
async def test_processes_started_by_the_tests_are_dead_before_the_reward_is_read(tmp_path: Path) -> None:
    from sandfleet.rollout.runner import task_spec
    from sandfleet.rollout.trace import SpanRecorder
    from sandfleet.rollout.verifier import run_verifier
    from sandfleet.sandbox import create_sandbox

    late = "sleep 1; echo 1 > /logs/verifier/reward.txt; exec sleep 1000"
    task = harbor_task(tmp_path, "escapes", WRITE_ZERO
                       + f"setsid bash -c '{late}' </dev/null >/dev/null 2>&1 &\n"
                       + "nohup sleep 1001 >/dev/null 2>&1 &\n")
    sandbox = await create_sandbox(task_spec(task, "host", "bwrap"))
    try:
        outcome = await run_verifier(task, sandbox, SpanRecorder())
        assert outcome.reward == 0.0
        await asyncio.sleep(1.5)  # a surviving writer would have written 1 by now
        ps = await sandbox.exec(["ps", "-eo", "args"], cwd="/")
        assert "sleep 100" not in ps.stdout, ps.stdout
        assert (await sandbox.read_file("/logs/verifier/reward.txt")).strip() == b"0"
    finally:
        await sandbox.close()


@needs_bwrap
async def test_root_agent_processes_under_other_uids_are_dead_before_the_tests(tmp_path: Path) -> None:
    # A root agent can take any uid: a process as uid 4242 waits for the tests to arrive and
    # copies the expected answer into the (opened up) workdir while they run.
    task = harbor_task(tmp_path, "other-uid", "sleep 0.5\n"
                       "mkdir -p /logs/verifier; if cmp -s /app/out.txt /tests/expected; then echo 1; else echo 0; fi"
                       " > /logs/verifier/reward.txt\n", tests={"expected": "42\n"})
    watcher = ("chmod 777 /app; setpriv --reuid 4242 --regid 4242 --clear-groups bash -c "
               "'until [ -f /tests/expected ]; do sleep 0.005; done; cp /tests/expected /app/out.txt' "
               "</dev/null >/dev/null 2>&1 &")
    (r,) = await rollouts([task], [watcher], agent_user="root")
    assert r.status == "completed", r.error
    assert r.reward == 0.0


# -- what code under test can still do (the documented residual risk)

CONFTEST = '''import os
open("/tmp/sandfleet-mark-conftest-ran", "w").close()
import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
'''
SHADOW = ('import os\nopen("/tmp/sandfleet-mark-shadow-ran", "w").close()\n'
          'def rgb_to_hsv(r, g, b):\n    return (0.0, 1.0, 1.0)\n')
TEST_OUT = '''import colorsys
def test_out():
    assert colorsys.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    assert open("/app/out.txt").read().strip() == "hello"
'''
# the planted code leaves marks in /tmp (pytest captures what it prints; not in HOME: a program
# that loads the workdir's code gets a HOME of its own, docs/security.md, round VII)
REWARD_BY_PYTEST = ("mkdir -p /logs/verifier\nif {}; then r=1; else r=0; fi\necho $r > /logs/verifier/reward.txt\n"
                    '[ -e /tmp/sandfleet-mark-shadow-ran ] && echo SHADOW MODULE RAN\n'
                    '[ -e /tmp/sandfleet-mark-conftest-ran ] && echo AGENT CONFTEST RAN\ntrue\n')


def _planted_tasks(root: Path) -> list[Task]:
    # TB1's pattern: pytest on /tests from the workdir (cwd is sys.path[0] under python -m).
    tests_dir = harbor_task(root, "tests-dir", "cd /app\n" + REWARD_BY_PYTEST.format(
        "python3 -m pytest -p no:cacheprovider -rA /tests/test_outputs.py"), tests={"test_outputs.py": TEST_OUT})
    # The tests copied into the workdir and run there (as repository-style tasks do).
    in_workdir = harbor_task(root, "in-workdir", "cp /tests/test_outputs.py /app/ && cd /app\n" + REWARD_BY_PYTEST
                             .format("python3 -m pytest -p no:cacheprovider -rA test_outputs.py"),
                             tests={"test_outputs.py": TEST_OUT})
    return [tests_dir, in_workdir]


def _plant() -> list[str]:
    return ["echo goodbye > /app/out.txt",  # the wrong answer
            f"cat > /app/conftest.py <<'EOF'\n{CONFTEST}EOF",
            f"cat > /app/colorsys.py <<'EOF'\n{SHADOW}EOF"]


@needs_bwrap
@pytest.mark.parametrize("verify", ["shared", "separate"])
async def test_conftest_in_the_workdir_still_runs_but_a_cwd_module_shadows_nothing(tmp_path: Path,
                                                                                  verify: str) -> None:
    config: dict[str, Any] = {} if verify == "shared" else {"verify": verify}
    results = await rollouts(_planted_tasks(tmp_path), _plant(), **config)
    by = {r.task: r for r in results}
    for r in results:
        assert r.status == "completed", (r.task, r.error)
        # the workdir is the agent's output, carried into a separate verifier too; its colorsys.py
        # does not replace the standard library's under `python -m pytest` run from it
        assert "SHADOW MODULE RAN" not in r.verifier_output, r.verifier_output
        risks = " ".join(r.info.get("verifier_risks", []))
        assert "conftest.py" in risks and "'colorsys'" in risks, r.info  # flagged all the same
    # pytest anchors conftest.py on the test paths: one in the workdir loads only when the
    # tests run from there -- and then it can make failing tests pass (the residual risk)
    assert "AGENT CONFTEST RAN" not in by["tests-dir"].verifier_output and by["tests-dir"].reward == 0.0
    assert "AGENT CONFTEST RAN" in by["in-workdir"].verifier_output and by["in-workdir"].reward == 1.0


@needs_bwrap
@pytest.mark.slow
async def test_root_agent_changing_the_image_reaches_shared_but_not_separate_verifier(tmp_path: Path) -> None:
    # The task image puts /opt/pylib (its files: the sandbox's root) on PYTHONPATH.
    task = harbor_task(tmp_path, "root-site", WRITE_ZERO + "python3 -c 'print(\"python ran\")'\n",
                       dockerfile="FROM python:3.11-slim-bookworm\nENV PYTHONPATH=/opt/pylib\n"
                       "COPY pylib/ /opt/pylib/\nWORKDIR /app\n", env_files={"pylib/README": "site\n"})
    plant = ("printf 'print(\"ROOT SITECUSTOMIZE RAN\")\\nopen(\"/logs/verifier/reward.txt\", \"w\").write(\"1\")\\n'"
             " > /opt/pylib/sitecustomize.py 2>/dev/null || true")
    shared_root, separate_root, shared_agent = await asyncio.gather(
        rollouts([task], [plant], build=True, agent_user="root"),
        rollouts([task], [plant], build=True, agent_user="root", verify="separate"),
        rollouts([task], [plant], build=True),
    )
    for (r,) in (shared_root, separate_root, shared_agent):
        assert r.status == "completed", r.error
        assert "python ran" in r.verifier_output
    # shared mode, root agent: what root changes in the image reaches the tests (as in Docker), and since stop 75
    # it runs there as the code under test (a file changed between the record and the preparation: the agent's),
    # whose write of the reward is refused
    assert "ROOT SITECUSTOMIZE RAN" in shared_root[0].verifier_output and shared_root[0].reward == 0.0
    assert "PermissionError" in shared_root[0].verifier_output, shared_root[0].verifier_output
    # separate mode: only the workdir and declared artifacts reach a fresh sandbox
    assert "ROOT SITECUSTOMIZE RAN" not in separate_root[0].verifier_output and separate_root[0].reward == 0.0
    # a non-root agent can't write there at all
    assert "ROOT SITECUSTOMIZE RAN" not in shared_agent[0].verifier_output and shared_agent[0].reward == 0.0


@needs_bwrap
async def test_separate_verifier_gets_workdir_and_artifacts_only(tmp_path: Path) -> None:
    task = harbor_task(tmp_path, "carry", "mkdir -p /logs/verifier\n"
                       "ls -la /app; cat /app/out.txt /tmp/art/a.txt; ls /tmp\n"
                       "[ -e /tmp/outside ] && echo OUTSIDE-CARRIED\n"
                       "if [ \"$(cat /app/out.txt)\" = hello ]; then echo 1; else echo 0; fi"
                       " > /logs/verifier/reward.txt\n",
                       toml='artifacts = ["/tmp/art"]\n')
    commands = ["echo hello > /app/out.txt; ln -s /etc/passwd /app/link; mkfifo /app/fifo; touch /tmp/outside",
                "mkdir -p /tmp/art; echo ARTIFACT-OK > /tmp/art/a.txt",
                "setsid sleep 1000 </dev/null >/dev/null 2>&1 &"]
    (r,) = await rollouts([task], commands, verify="separate", agent_user="root")
    out = r.verifier_output
    assert r.status == "completed", r.error
    assert r.reward == 1.0, out
    assert "OUTSIDE-CARRIED" not in out and "ARTIFACT-OK" in out
    assert "link -> /etc/passwd" in out and "fifo" not in out  # links carried as links; FIFOs dropped


# -- the archive a separate verifier unpacks


def _tar(*members: tuple[str, str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, arg in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(arg)
                tar.addfile(info, io.BytesIO(arg.encode()))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE}[kind]
            info.linkname = arg
            tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize(("members", "message"), [
    ((("file", "app/../etc/passwd", "x"),), "outside"),
    ((("file", "/etc/passwd", "x"),), "outside"),
    ((("file", "srv/x", "x"),), "outside"),
    ((("sym", "app/l", "/usr/lib"), ("file", "app/l/evil.pth", "x")), "through a link"),
    ((("sym", "app/l", "/usr/lib"), ("dir", "app/l", "")), "through a link"),
    ((("hard", "app/h", "etc/shadow"),), "outside"),
    ((("sym", "app/l", "/etc"), ("hard", "app/h", "app/l/shadow")), "through a link"),
    ((("sym", "app/a/b/l", "/usr"), ("file", "app/a/b/l/c/evil.pth", "x")), "through a link"),
    ((("sym", "app/x", "/usr"), ("sym", "app/a/b/l", "/usr"), ("hard", "app/h", "app/a/b/l/c/d")), "through a link"),
])
def test_archive_members_that_leave_the_carried_paths_are_refused(
        members: tuple[tuple[str, str, str], ...], message: str) -> None:
    from sandfleet.rollout.verifier import clean_archive

    with pytest.raises(RolloutError, match=message) as info:
        clean_archive(_tar(*members), ["/app"])
    assert info.value.reason == "verifier_transfer"


def test_archive_keeps_files_folders_and_links_and_drops_fifos_and_devices() -> None:
    from sandfleet.rollout.verifier import clean_archive

    data = clean_archive(_tar(("dir", "app", ""), ("file", "app/a", "hi"), ("sym", "app/l", "/etc/passwd"),
                              ("hard", "app/h", "app/a"), ("fifo", "app/f", ""), ("chr", "app/c", "")), ["/app"])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        kept = {m.name: m for m in tar}
    assert sorted(kept) == ["app", "app/a", "app/h", "app/l"]
    assert kept["app/l"].linkname == "/etc/passwd" and kept["app/h"].linkname == "app/a"


def test_archive_keeps_names_that_only_begin_like_a_link() -> None:
    """A link refuses what lies below it, not its neighbours whose names it begins: app/l is a link,
    app/lx, app/l.d/y and app/a/l/z (another folder's l) are kept."""
    from sandfleet.rollout.verifier import clean_archive

    data = clean_archive(_tar(("sym", "app/l", "/etc"), ("file", "app/lx", "x"), ("dir", "app/l.d", ""),
                              ("file", "app/l.d/y", "y"), ("dir", "app/a", ""), ("dir", "app/a/l", ""),
                              ("file", "app/a/l/z", "z"), ("hard", "app/h", "app/l.d/y")), ["/app"])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert sorted(m.name for m in tar) == ["app/a", "app/a/l", "app/a/l/z", "app/h", "app/l", "app/l.d",
                                               "app/l.d/y", "app/lx"]
