"""Reward integrity II (issue 25, the verifier phase): nothing the agent leaves behind can raise
the reward above what the task's own test script decided, and sabotage scores 0, not
``failed``. One test per class; each runs the attack as a real Harbor task on bwrap, in shared
and ``--verify separate`` mode, two rollouts at once, and asserts a reward of 0 (a number, a
completed rollout, with its reason). docs/security.md, "Reward integrity", lists them.

Every test that runs sandboxes runs on gvisor as well, in the slow pass (issue 28: the attack
tests hold on gvisor at least as well as on bwrap); one with a ``backend`` parameter of its own
chooses for itself.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sandfleet.rollout import RunConfig, ScriptedPolicy, run_suite
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.runner import RetryPolicy
from sandfleet.tasks import Task, load_task
from test_rollout_support import needs_bwrap

pytestmark = needs_bwrap()
ON_GVISOR = pytest.param("gvisor", marks=[pytest.mark.slow, pytest.mark.skipif(
    not shutil.which("runsc"), reason="gVisor's runsc not installed (apt-get install runsc)")])
# no sandbox at all, or the service's own (bwrap, the default)
NOT_PER_BACKEND = {"test_git_config_filter_keeps_allowlisted_keys_only_whatever_the_syntax",
                   "test_the_service_carries_the_pid_namespace_exec"}
OWN_PROC_GAP = ("gVisor (runsc 20221219) keeps the sandbox's /proc for a pid-namespace exec: a proc "
                "mounted in the command's mount namespace lands in the sandbox's own mount table "
                "(docs/security.md, \"The tests run in a pid namespace of their own\")")
_backend = "bwrap"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames and metafunc.function.__name__ not in NOT_PER_BACKEND:
        metafunc.parametrize("attack_backend", ["bwrap", ON_GVISOR], indirect=True)


GVISOR_SEPARATE = {"test_sandfleet_run_rows_of_attack_rollouts_hold_reward_zero",
                   "test_agent_filling_the_disk_scores_zero_not_failed",
                   "test_the_tests_see_their_own_processes_on_proc"}
"""The tests whose separate mode also runs on gVisor: the attacks of classes 1-6 and 11 through the CLI (each
class of the other tests, its solve.sh the attack, in one run), a full disk carried to a fresh sandbox (on gVisor a
full /tmp once OOM-killed the sandbox). The others' separate mode is the verifier's own (a fresh sandbox given the
workdir), covered on bwrap; on gVisor each repeated what the run's rows show (issue 43: the backend matrix where it
adds coverage; 45 s of the slow pass)."""


@pytest.fixture(autouse=True)
def attack_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The backend this test's sandboxes run on (:func:`rollouts`' default, and the others')."""
    global _backend
    _backend = getattr(request, "param", "bwrap")
    callspec = getattr(request.node, "callspec", None)
    if (_backend == "gvisor" and callspec is not None and callspec.params.get("verify") == "separate"
            and request.node.originalname not in GVISOR_SEPARATE):
        _backend = "bwrap"
        pytest.skip("separate mode on gVisor: test_sandfleet_run_rows_of_attack_rollouts_hold_reward_zero"
                    "[gvisor-separate] runs this class there (GVISOR_SEPARATE)")
    try:
        yield _backend
    finally:
        _backend = "bwrap"


def skip_on_gvisor(why: str) -> None:
    if _backend == "gvisor":
        pytest.skip(why)
MODES = pytest.mark.parametrize("verify", ["shared", "separate"])
REWARD = "/logs/verifier/reward.txt"
# the task's own decision: 1 only when /app/out.txt says hello
DECIDE = f'if [ "$(cat /app/out.txt 2>/dev/null)" = hello ]; then echo 1; else echo 0; fi > {REWARD}\n'


def harbor_task(root: Path, name: str, test_sh: str, *, toml: str = "", verifier_timeout: float = 30,
                solve_sh: str | None = None) -> Task:
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text(
        f'version = "1.0"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = {verifier_timeout}\n{toml}'
        "[environment]\ncpus = 1\nmemory_mb = 512\nstorage_mb = 256\n")
    (folder / "instruction.md").write_text("Write hello into /app/out.txt.\n")
    (folder / "environment" / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\nWORKDIR /app\n")
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    if solve_sh is not None:
        (folder / "solution").mkdir()
        (folder / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve_sh)
    return load_task(folder)


async def _host(task: Task) -> str:
    return "host"


async def rollouts(tasks: Sequence[Task], commands: Sequence[str], verify: str = "shared",
                   backend: str | None = None, **config: Any) -> list[RolloutResult]:
    """Two rollouts of each task at once on ``backend`` (the test's), the agent replaying ``commands``."""
    cfg = RunConfig(backend=backend or _backend, n=2, concurrency=4, retry=RetryPolicy(max_attempts=1),
                    verify=verify, **config)  # type: ignore[arg-type]
    report = await run_suite(list(tasks), ScriptedPolicy(commands), cfg, image_for=_host)
    assert len(report.results) == 2 * len(tasks)
    return report.results


def write(path: str, text: str) -> str:
    """An agent command that writes ``text`` to ``path``."""
    return f"mkdir -p {posixpath.dirname(path)} && cat > {path} <<'SANDFLEET_EOF'\n{text}SANDFLEET_EOF"


def assert_zero(results: Sequence[RolloutResult], reason: str | None = None) -> None:
    for r in results:
        assert r.status == "completed", (r.task, r.reason, r.error)
        assert r.reward == 0.0 and isinstance(r.reward, float), (r.task, r.reward, r.info, r.verifier_output)
        if reason is not None:
            assert r.reason == reason, (r.task, r.reason, r.info.get("reward_error"), r.verifier_output)


# 1. Outlive the tests: a double-forked, setsid daemon started by the code under test waits for
# test.sh to end, then rewrites the reward.
OUTLIVE = '''import os, time
def daemon(watch):
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    while os.path.exists("/proc/%d" % watch):  # test.sh, still running
        time.sleep(0.0005)
    for _ in range(400):
        try:
            with open("/logs/verifier/reward.txt", "w") as f:
                f.write("1")
        except OSError:
            pass
        time.sleep(0.005)
    os._exit(0)
daemon(os.getppid())
print("solution ran")
'''


@MODES
async def test_daemon_of_the_code_under_test_cannot_rewrite_the_reward_after_the_tests(
        tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "outlive", "cd /app && python3 solution.py\n" + DECIDE)
    results = await rollouts([task], [write("/app/solution.py", OUTLIVE), "echo goodbye > /app/out.txt"], verify)
    for r in results:
        assert "solution ran" in r.verifier_output, r.verifier_output
    assert_zero(results, None)


# 2. Freeze the tests past their deadline: write 1, stop whatever can be stopped, hang.
FREEZE = '''import os, signal, time
open("/logs/verifier/reward.txt", "w").write("1")
try:
    os.kill(-1, signal.SIGSTOP)
except OSError:
    pass
time.sleep(600)
'''


# The code under test run as the main program of a Python of the tests' own (its code on stdin), from a
# copy the tests made outside the workdir: the seal judges an interpreter's stdin by the file it comes
# from (python3 - < /app/solution.py is sealed), and the guard's main program is the tests' own, so this
# code is the grader's to the seal (docs/security.md, "Where the line is"), the reward folder stays
# writable to it, and these tests reach the defence they are about (where the seal keeps it out, it
# never gets this far). Until round XXI it was an exec() of the copy's text inside a tests' one-liner:
# code compiled from a string at run time is the code under test's since (the guard's watch_strings).
STDIN_RUN = "cd /app && cp solution.py /tmp/solution-copy.py && python3 - < /tmp/solution-copy.py\n"


@MODES
async def test_frozen_tests_time_out_to_zero_whatever_is_on_disk(tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "freeze", STDIN_RUN + DECIDE, verifier_timeout=3)
    results = await rollouts([task], [write("/app/solution.py", FREEZE)], verify)
    assert_zero(results, "verifier_timeout")
    for r in results:
        assert r.info.get("verifier_timed_out") is True


# 3. The other reward file: test.sh writes reward.txt = 0, the code writes reward.json = 1.
OTHER_FILE = 'open("/logs/verifier/reward.json", "w").write(\'{"reward": 1}\')\n'


@MODES
async def test_reward_file_test_sh_did_not_write_cannot_override_its_decision(tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "other-file", STDIN_RUN + DECIDE)
    # test.sh stops before it writes its reward.txt (set -e and a failing check): the code's
    # reward.json, which no test file names, is not the tests' either
    stopped = harbor_task(tmp_path, "stopped", "set -e\n" + STDIN_RUN + "grep -q hello out.txt\n"
                          + DECIDE)
    results = await rollouts([task, stopped], [write("/app/solution.py", OTHER_FILE), "echo goodbye > /app/out.txt"],
                             verify)
    assert_zero(results, "reward_conflict")


async def test_harbor_tests_writing_reward_json_then_copying_it_to_reward_txt_score_right(tmp_path: Path) -> None:
    both = ('mkdir -p /logs/verifier\nr=0; [ "$(cat /app/out.txt 2>/dev/null)" = hello ] && r=1\n'
            'python3 -c "import json,sys; json.dump({\'reward\': float(sys.argv[1]), \'style\': 0.5}, '
            'open(\'/logs/verifier/reward.json\', \'w\'))" $r\n'
            "python3 -c \"import json; print(json.load(open('/logs/verifier/reward.json'))['reward'])\" "
            "> /logs/verifier/reward.txt\n")
    task = harbor_task(tmp_path, "both-files", both)
    good = await rollouts([task], ["echo hello > /app/out.txt"])
    bad = await rollouts([task], ["echo goodbye > /app/out.txt"])
    for r in good:
        assert (r.status, r.reward, r.reason) == ("completed", 1.0, None), (r.info, r.verifier_output)
        assert r.reward_details == {"reward": 1.0, "style": 0.5}
    assert_zero(bad, None)
    assert {r.reason for r in bad} == {None}  # a plain 0: the files agree


# 4. Out-of-range values.
HUGE = 'open("/logs/verifier/reward.json", "w").write(\'{"reward": 1e300}\')\n'


@MODES
async def test_reward_out_of_the_tasks_range_or_not_finite_scores_zero(tmp_path: Path, verify: str) -> None:
    code = harbor_task(tmp_path, "huge", STDIN_RUN)
    inf = harbor_task(tmp_path, "inf", f"echo inf > {REWARD}\n")
    five = harbor_task(tmp_path, "five", f"echo 5 > {REWARD}\n")
    results = await rollouts([code, inf, five], [write("/app/solution.py", HUGE)], verify)
    assert_zero(results, "bad_reward_value")


async def test_task_declaring_a_reward_range_gets_rewards_within_it(tmp_path: Path) -> None:
    ranged = harbor_task(tmp_path, "ranged", f"echo $(cat /app/score) > {REWARD}\n", toml="reward_range = [0, 10]\n")
    five, eleven = await asyncio.gather(rollouts([ranged], ["echo 5 > /app/score"]),
                                        rollouts([ranged], ["echo 11 > /app/score"]))
    for r in five:  # the task declared 0..10: 5 is a reward
        assert (r.status, r.reward, r.reason) == ("completed", 5.0, None), (r.info, r.verifier_output)
    assert_zero(eleven, "bad_reward_value")


async def test_validate_does_not_call_a_task_with_an_out_of_range_reward_valid(tmp_path: Path) -> None:
    from sandfleet.rollout.validate import validate_tasks

    task = harbor_task(tmp_path, "huge", 'echo \'{"reward": 1e300}\' > /logs/verifier/reward.json\n',
                       solve_sh="echo hello > /app/out.txt\n")
    verdicts = await validate_tasks([task], repeats=1, backend=_backend, image_for=_host)
    v = verdicts["huge"]
    assert v.status == "invalid" and v.oracle_rewards == [0.0], v
    assert "bad_reward_value" in v.reason, v.reason


# 5. Repository config that a tool executes: each vector "fixes" the answer while the tests run.
FIX = "echo hello > /app/out.txt; touch /tmp/vector-$1"
GIT_ATTACK = (
    "cd /app && git init -q . && echo goodbye > out.txt && git add -A && "
    "git -c user.email=a@b -c user.name=a commit -qm start && "
    f"printf '#!/bin/sh\\n{FIX.replace('$1', 'hook')}\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && "
    f"cp .git/hooks/pre-commit .git/hooks/post-index-change && "
    f"git config core.fsmonitor '{FIX.replace('$1', 'fsmonitor')} #' && "
    f"git config core.pager 'sh -c \"{FIX.replace('$1', 'pager')}\"; cat' && "
    f"git config diff.external '/app/.x/ext.sh' && mkdir -p .x && "
    f"printf '#!/bin/sh\\n{FIX.replace('$1', 'external')}\\n' > .x/ext.sh && chmod +x .x/ext.sh && "
    "printf '[core]\\n\\tfsmonitor = /app/.x/ext.sh\\n' > .x/inc && git config include.path /app/.x/inc && "
    "echo '* filter=evil' > .gitattributes && git config filter.evil.clean /app/.x/ext.sh"
)
GIT_TESTS = ("cd /app && git status --short; git diff | cat; git add -A; "
             "git -c user.email=t@t -c user.name=t commit -qm tests; ls /tmp | grep vector; true\n" + DECIDE)


@MODES
async def test_git_config_and_hooks_of_the_agent_do_not_run_in_the_tests(tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "git", GIT_TESTS)
    results = await rollouts([task], [GIT_ATTACK, "cd /app && git config --list --local | sort"], verify)
    for r in results:
        assert "vector-" not in r.verifier_output, r.verifier_output
        assert any("git: sanitized" in x for x in r.info.get("verifier_risks", [])), r.info
    assert_zero(results, None)


async def test_git_of_a_legitimate_repository_still_works_in_the_tests(tmp_path: Path) -> None:
    setup = ("cd /app && git init -q . && git config user.email a@b && git config user.name a && "
             "echo hello > out.txt && git add -A && git commit -qm answer && git remote add origin /nowhere && "
             "git checkout -qb feature")
    check = ("cd /app && git status --short && [ \"$(git log -1 --format=%s)\" = answer ] && "
             "[ \"$(git rev-parse --abbrev-ref HEAD)\" = feature ] && git remote get-url origin && "
             "git diff --quiet HEAD && echo GIT-OK\n" + DECIDE)
    task = harbor_task(tmp_path, "legit-git", check)
    for r in await rollouts([task], [setup]):
        assert (r.status, r.reward) == ("completed", 1.0), (r.error, r.verifier_output)
        assert "GIT-OK" in r.verifier_output and "/nowhere" in r.verifier_output


# 6. Module shadowing from the working directory, for `python3 -c`, `-m` and scripts.
SHADOW_JSON = "def loads(s, **kw):\n    return {'ok': True}\ndef load(f, **kw):\n    return {'ok': True}\n"
SHADOW_TESTS = (
    "cd /app\n"
    "a=$(python3 -c 'import json; print(int(json.loads(open(\"/app/result.json\").read())[\"ok\"]))')\n"
    "b=$(python3 -m check)\n"
    "c=$(python3 /app/check.py)\n"
    "d=$(python3 -c 'import solution; print(solution.answer())')\n"
    'echo "a=$a b=$b c=$c d=$d"\n'
    f'if [ "$a$b$c" = 111 ]; then echo 1; else echo 0; fi > {REWARD}\n'
)
CHECK = "import json\nprint(int(json.load(open('/app/result.json'))['ok']))\n"


@MODES
async def test_workdir_module_never_replaces_a_standard_library_one(tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "shadow", SHADOW_TESTS)
    commands = [write("/app/json.py", SHADOW_JSON), write("/app/check.py", CHECK),
                "echo '{\"ok\": false}' > /app/result.json",
                write("/app/solution.py", "def answer():\n    return 42\n")]
    results = await rollouts([task], commands, verify)
    for r in results:
        # the stdlib's json read ok=false; the agent's own module still imports from the workdir
        assert "a=0 b=0 c=0 d=42" in r.verifier_output, r.verifier_output
        assert any("'json'" in x for x in r.info.get("verifier_risks", [])), r.info
    assert_zero(results, None)


# The residual risks that can be seen in the workdir are flagged: a virtual environment's .pth
# file runs at interpreter start when that environment's Python runs the tests (shown), and
# tool configuration the tests' tools read from the workdir.
PTH_ATTACK = ("cd /app && python3 -m venv --without-pip .venv && "
              "echo 'import os; open(\"/tmp/pth-ran\", \"w\").write(\"1\")' > "
              "\"$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')/zz.pth\" && "
              "printf '[pytest]\\naddopts = -p evil\\n' > pytest.ini && echo 'registry=http://127.0.0.1:9/' > .npmrc")
PTH_TESTS = "cd /app && .venv/bin/python -c 'print(1)'; [ -e /tmp/pth-ran ] && echo PTH-RAN\n" + DECIDE


@MODES
async def test_a_workdir_venv_pth_and_tool_config_are_flagged(tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "pth", PTH_TESTS)
    results = await rollouts([task], [PTH_ATTACK, "echo goodbye > /app/out.txt"], verify)
    for r in results:
        assert "PTH-RAN" in r.verifier_output, r.verifier_output  # the residual: it runs, by design
        risks = r.info.get("verifier_risks", [])
        assert any(x.startswith("a .pth file") and "zz.pth" in x for x in risks), risks
        assert any(x.startswith("tool configuration") and x.endswith("/pytest.ini") for x in risks), risks
        assert any(x.startswith("tool configuration") and x.endswith("/.npmrc") for x in risks), risks
    assert_zero(results, None)


# 11. Sabotage is a zero: a full disk, the tests' processes killed, a 100 GiB sparse file.
@MODES
@pytest.mark.parametrize("user", ["agent", "root"])
@pytest.mark.parametrize("backend", ["bwrap", pytest.param("gvisor", marks=pytest.mark.skipif(
    not shutil.which("runsc"), reason="gVisor's runsc not installed (apt-get install runsc)"))])
async def test_agent_filling_the_disk_scores_zero_not_failed(tmp_path: Path, verify: str, user: str,
                                                             backend: str) -> None:
    """On gvisor too: its writable layer is the same ext4 disk, and /tmp is that layer's (runsc's
    own /tmp, a tmpfs in the Sentry's memory with no size limit, got the sandbox OOM-killed:
    a `failed` rollout)."""
    task = harbor_task(tmp_path, "full", DECIDE)
    # root also takes the blocks a file system keeps for root, which the verifier's set-up needs
    fill = ("echo hello > /app/out.txt; for d in /app /tmp /logs /tests; do "
            "dd if=/dev/zero of=$d/fill bs=1M count=100000; dd if=/dev/zero of=$d/fill2 bs=4k; done 2>/dev/null; "
            "for i in $(seq 2000); do : > /tmp/f$i || break; done 2>/dev/null; df -h /app | tail -n 1; true")
    results = await rollouts([task], [fill], verify, backend, agent_user=user)
    assert_zero(results, None)
    reasons = {r.reason for r in results}
    assert reasons <= {"verifier_setup_failed", "no_reward_file", "transfer_too_large"}, reasons
    if user == "root" and verify == "shared":
        assert reasons == {"verifier_setup_failed"}, [r.info for r in results]


KILL_ALL = "import os, signal\nos.kill(-1, signal.SIGKILL)\n"


@MODES
async def test_code_under_test_killing_the_tests_scores_zero_not_failed(tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "killer", "cd /app && python3 solution.py; sleep 0.2\n" + DECIDE)
    results = await rollouts([task], [write("/app/solution.py", KILL_ALL), "echo goodbye > /app/out.txt"], verify)
    assert_zero(results, None)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


@pytest.mark.parametrize("backend", ["bwrap", pytest.param("gvisor", marks=pytest.mark.skipif(
    not shutil.which("runsc"), reason="gVisor's runsc not installed (apt-get install runsc)"))])
async def test_100_gib_sparse_file_is_carried_sparse_quickly_in_little_memory(tmp_path: Path, backend: str) -> None:
    """Carried sparse on bwrap; refused on gvisor (`transfer_too_large`): runsc 20221219 shows
    no holes (SEEK_DATA finds data at offset 0 of a truncated file), so it counts at its full
    size. Either is what the issue allows, within 10 s and 50 MB of host memory."""
    task = harbor_task(tmp_path, "sparse", 'stat -c "SIZE %s BLOCKS %b" /app/big\n' + DECIDE)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here
    before = _rss_kib("VmRSS")
    t0 = time.monotonic()
    results = await rollouts([task], ["truncate -s 100G /app/big && echo goodbye > /app/out.txt"], "separate",
                             backend)
    took = time.monotonic() - t0
    grew_mb = (_rss_kib("VmHWM") - before) / 1024
    assert_zero(results, None)
    for r in results:
        if backend == "gvisor":
            assert r.reason == "transfer_too_large", (r.reason, r.verifier_output)
        else:
            assert "SIZE 107374182400 BLOCKS 0" in r.verifier_output, r.verifier_output  # carried, still sparse
        copy = sum(s["end"] - s["start"] for s in r.spans if s.get("what") in ("copy out workdir", "copy in workdir"))
        assert copy < 10, r.spans
    assert grew_mb < 50, f"host memory grew {grew_mb:.0f} MB"
    print(json.dumps({"sparse_two_rollouts_s": round(took, 2), "host_memory_growth_mb": round(grew_mb, 1)}))


TRICKY_CONFIG = """[core]
\trepositoryformatversion = 0
\tfsmonitor = evil1
\tbare = false
[core] fsmonitor = evil2
[Core]
\tFsMonitor = evil3
\teditor = a \\
fsmonitor = evil4
[include]
\tpath = /tmp/evil-include
[includeIf "gitdir:/"]
\tpath = /tmp/evil-include
[remote "origin"]
\turl = https://example.invalid/r.git
\tuploadpack = evil5
[alias]
\tst = !evil6
[core]
\thooksPath = /tmp/evil-hooks
[diff "x"]
\ttextconv = evil7
[filter "lfs"]
\tclean = evil8
"""


def test_git_config_filter_keeps_allowlisted_keys_only_whatever_the_syntax(tmp_path: Path) -> None:
    import subprocess

    from sandfleet.rollout.testguard import sanitize_git_script

    repo = tmp_path / "w"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".git" / "config").write_text(TRICKY_CONFIG)
    (repo / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\nevil9\n")
    (repo / "sub").mkdir()
    (repo / "sub" / ".git").write_text("gitdir: /etc\n")  # leads out of the workdir
    res = subprocess.run(["bash", "-c", sanitize_git_script() + '\nsanitize_git "$1"', "x", str(repo)],
                         capture_output=True, text=True, check=True)
    assert "sanitized" in res.stdout and "emptied" in res.stdout and "removed" in res.stdout, res.stdout
    listed = subprocess.run(["git", "config", "--file", str(repo / ".git" / "config"), "--list"],
                            capture_output=True, text=True, check=True).stdout
    assert sorted(listed.split()) == ["core.bare=false", "core.repositoryformatversion=0",
                                      "remote.origin.url=https://example.invalid/r.git"], listed
    assert list((repo / ".git" / "hooks").iterdir()) == [] and not (repo / "sub" / ".git").exists()
    assert subprocess.run(["git", "-C", str(repo), "status", "--short"], capture_output=True).returncode == 0


def attack_tasks(root: Path) -> list[str]:
    """One task folder per class whose oracle (solution/solve.sh) is the attack: the answer
    wrong (goodbye) and the attack on top. Classes 1 to 6 and 11 (the disk filled, the tests
    killed)."""
    fill = ("for d in /app /tmp /logs; do dd if=/dev/zero of=$d/fill bs=1M count=100000; "
            "dd if=/dev/zero of=$d/fill2 bs=4k; done 2>/dev/null; true")
    attacks = {  # name: (test.sh, the attack, verifier timeout)
        "outlive": ("cd /app && python3 solution.py\n" + DECIDE, write("/app/solution.py", OUTLIVE), 30),
        "freeze": ("cd /app && python3 solution.py\n" + DECIDE, write("/app/solution.py", FREEZE), 3),
        "other-file": ("cd /app && python3 solution.py\n" + DECIDE, write("/app/solution.py", OTHER_FILE), 30),
        "huge": ("cd /app && python3 solution.py\n", write("/app/solution.py", HUGE), 30),
        "git": (GIT_TESTS, GIT_ATTACK, 30),
        "shadow": (SHADOW_TESTS, "\n".join([write("/app/json.py", SHADOW_JSON), write("/app/check.py", CHECK),
                                            "echo '{\"ok\": false}' > /app/result.json"]), 30),
        "killer": ("cd /app && python3 solution.py; sleep 0.2\n" + DECIDE, write("/app/solution.py", KILL_ALL), 30),
        "full": (DECIDE, fill, 30),
    }
    for name, (test_sh, attack, timeout) in attacks.items():
        harbor_task(root, name, test_sh, solve_sh="echo goodbye > /app/out.txt\n" + attack + "\n",
                    verifier_timeout=timeout)
    return list(attacks)


@MODES
def test_sandfleet_run_rows_of_attack_rollouts_hold_reward_zero(tmp_path: Path, verify: str) -> None:
    """`sandfleet run` -n 2 with the oracle replaying the attacks of every class: each row of
    rollouts.jsonl is completed with a reward of 0.0, a number."""
    import subprocess
    import sys

    root = tmp_path / "tasks"
    names = attack_tasks(root)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "sandfleet.cli", "run", "--tasks", str(root), "--agent", "oracle", "--backend",
            _backend, "--image", "host", "-n", "2", "--concurrency", "4", "--attempts", "1", "--verify", verify,
            "--out", str(out)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(r["task"] for r in rows) == sorted(names * 2), res.stderr[-3000:]
    for row in rows:
        assert row["status"] == "completed" and row["reward"] == 0.0 and isinstance(row["reward"], float), row
        assert row["verdict"] == "policy_fault" or row["verdict"] == "scored", row


@pytest.mark.slow
@MODES
async def test_tasks_validate_scores_every_attack_zero_and_calls_it_invalid(tmp_path: Path, verify: str) -> None:
    """`tasks validate` (its function; the CLI's --verify passes straight to it) with the
    attacks as the tasks' solutions, two repeats at once: every oracle reward is 0.0, a number
    (no attack raised it, none turned into a failure), so every task is invalid, and none
    passes as root either."""
    from sandfleet.rollout.validate import validate_tasks

    root = tmp_path / "tasks"
    names = attack_tasks(root)
    tasks = [load_task(root / n) for n in names]
    verdicts = await validate_tasks(tasks, repeats=2, concurrency=4, backend=_backend, image_for=_host, verify=verify)
    assert sorted(verdicts) == sorted(names)
    for name, v in verdicts.items():
        assert v.status == "invalid", (name, v)
        assert v.oracle_rewards == [0.0, 0.0] and all(isinstance(x, float) for x in v.oracle_rewards), (name, v)
        assert "passes only as root" not in v.reason, (name, v.reason)


LEAVE_DAEMON = ("setsid bash -c 'sleep 300' </dev/null >/dev/null 2>&1 & "
                "echo PID=$$ NS=$(readlink /proc/self/ns/pid)")
COUNT_SLEEPERS = ("echo SLEEPERS=$(grep -l '^sleep' /proc/[0-9]*/comm 2>/dev/null | wc -l) "
                  "NS=$(readlink /proc/self/ns/pid)")


async def test_exec_in_a_pid_namespace_takes_what_it_left_with_it() -> None:
    """Sandbox.exec(pid_namespace=True), what the verifier runs the tests with: the command is
    pid 2 of a namespace of its own (its warden is pid 1), and a setsid daemon it left is dead
    when exec returns, counted in ``detached``."""
    from sandfleet.sandbox import create_sandbox
    from sandfleet.sandbox.spec import SandboxSpec

    box = await create_sandbox(SandboxSpec(image="host", backend=_backend))
    try:
        own = await box.exec(["bash", "-c", LEAVE_DAEMON], cwd="/", pid_namespace=True, timeout=30)
        after = await box.exec(["bash", "-c", COUNT_SLEEPERS], cwd="/", timeout=30)
        plain = await box.exec(["bash", "-c", LEAVE_DAEMON], cwd="/", timeout=30)
        # the plain daemon may not have exec'd sleep yet on a loaded host: wait for it (5 s at most)
        left = await box.exec(["bash", "-c", "for i in $(seq 50); do grep -q '^sleep' /proc/[0-9]*/comm 2>/dev/null "
                               "&& break; sleep 0.1; done; " + COUNT_SLEEPERS], cwd="/", timeout=30)
    finally:
        await box.close()
    assert "PID=2 " in own.stdout and "SLEEPERS=0" in after.stdout, (own.output, after.output)
    assert plain.detached == 0, plain  # (own's daemon is the command's background job: not detached)
    assert own.stdout.split("NS=")[1] != after.stdout.split("NS=")[1]  # another pid namespace
    assert "PID=2 " not in plain.stdout and "SLEEPERS=1" in left.stdout, (plain.output, left.output)


# What a test's own pid namespace shows on its /proc: itself, named, at the pids it knows;
# pgrep/pkill of a process it started; and of the sandbox's processes (the guest agent, a
# daemon left by the agent) nothing, before and after trying to unmount that /proc; and
# /proc/sys and sysrq-trigger stay as unwritable as on the sandbox's /proc.
OWN_PROC = r"""sleep 302 & child=$!
# (until the child has exec'd sleep: under load pgrep and pkill ran while it was still the forked shell, found
# nothing, and the wait below waited out the command's 60 s)
for _ in $(seq 200); do pgrep -f '^sleep 302' >/dev/null && break; sleep 0.05; done
read -r self _ < /proc/self/stat
echo SELF=$self SHELL=$$
python3 -c 'import os; print("STAT=" + open(f"/proc/{os.getpid()}/stat").read().split()[1])'
echo PGREP=$(pgrep -f '^sleep 30[12]' | tr '\n' ,) CHILD=$child,
pkill -f '^sleep 302'; wait $child; echo KILLED=$?
umount -l /proc 2>/dev/null; echo UMOUNT=$?
pattern=$(cat /proc/sys/kernel/core_pattern); echo "$pattern" 2>/dev/null > /proc/sys/kernel/core_pattern; echo SYSW=$?
test -w /proc/sysrq-trigger; echo SYSRQW=$?
python3 -c 'import os; print("COMMS=" + ",".join(sorted(open(f"/proc/{p}/comm").read().strip()
                                                        for p in os.listdir("/proc") if p.isdigit())))'
"""


def _fields(text: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in text.split() if "=" in w)


async def test_exec_in_a_pid_namespace_has_a_proc_of_its_own() -> None:
    """The tests' /proc is their pid namespace's (docs/security.md, "The tests run in a pid
    namespace of their own"): `/proc/<getpid()>` is the caller, pgrep and pkill find and stop
    the command's own processes, and nothing of the sandbox's shows, for a verifier user and
    for root (whose `umount` the seccomp filter refuses); that /proc ends with the command."""
    skip_on_gvisor(OWN_PROC_GAP)
    from sandfleet.sandbox import create_sandbox
    from sandfleet.sandbox.spec import SandboxSpec

    box = await create_sandbox(SandboxSpec(image="host", backend=_backend))
    try:
        await box.exec(["bash", "-c", "setsid sleep 301 </dev/null >/dev/null 2>&1 &"], user="agent", timeout=30)
        own = {user: await box.exec(["bash", "-c", OWN_PROC], cwd="/", user=user, pid_namespace=True, timeout=60)
               for user in ("verifier", "root")}
        plain = await box.exec(["bash", "-c", "echo AGENT=$(pgrep -f '^sleep 301' | wc -l) "
                                "PROCS=$(grep -c ' /proc ' /proc/self/mountinfo)"], timeout=30)
    finally:
        await box.close()
    for user, res in own.items():
        f = _fields(res.stdout)
        assert res.exit_code == 0 and f.get("SELF") == "2" and f.get("SHELL") == "2", (user, res.output)
        assert f.get("STAT") == "(python3)", (user, res.output)  # /proc/<its pid> is itself
        assert f.get("PGREP") == f.get("CHILD") != ",", (user, res.output)  # its sleep, not the agent's
        assert f.get("KILLED") == "143", (user, res.output)
        assert f.get("UMOUNT") != "0" and f.get("SYSW") != "0" and f.get("SYSRQW") != "0", (user, res.output)
        comms = set(f.get("COMMS", "").split(","))  # (bash may exec its last command)
        # nothing of the sandbox's: the command's processes and its warden
        assert "python3" in comms and comms <= {"bash", "python3", "sandfleet-init"}, (user, res.output)
    # the agent's daemon lived on, out of the tests' sight; the tests' /proc went with them
    assert _fields(plain.stdout) == {"AGENT": "1", "PROCS": "1"}, plain.output


REOPEN_STDIO = "echo out > /dev/stdout && echo err > /dev/stderr && cat /dev/stdin"


@pytest.mark.parametrize("backend", ["bwrap", "gvisor"])
async def test_commands_reopen_their_stdio_by_path(backend: str) -> None:
    """`echo msg > /dev/stderr`, as test scripts write: /dev/stdout, /dev/stderr and
    /dev/stdin (links into /proc/self/fd) open the command's own pipes, for a verifier user
    and for root, in the tests' pid namespace and out of it (gVisor: it can't chmod a pipe,
    so the agent makes them as the command's user)."""
    from conftest import backend_skip
    from sandfleet.sandbox import create_sandbox
    from sandfleet.sandbox.spec import SandboxSpec

    if backend_skip(backend):
        pytest.skip(str(backend_skip(backend)))
    box = await create_sandbox(SandboxSpec(image="host", backend=backend))
    try:
        for user in ("verifier", "root"):
            for own in (False, True):
                res = await box.exec(["bash", "-c", REOPEN_STDIO], cwd="/", user=user, pid_namespace=own,
                                     stdin="in\n", timeout=30)
                assert (res.exit_code, res.stdout, res.stderr) == (0, "out\nin\n", "err\n"), (user, own, res.output)
    finally:
        await box.close()


@pytest.mark.parametrize("backend", ["bwrap", "gvisor"])
async def test_stdin_reaches_eof_with_a_pid_namespace_command_running(backend: str) -> None:
    """A command in a pid namespace of its own reads its stdin to EOF; and while one runs,
    another command's stdin still closes (the process that relays its exit keeps none of the
    agent's descriptors). Each command would otherwise wait out its timeout."""
    from conftest import backend_skip
    from sandfleet.agent.client import RunningCommand
    from sandfleet.sandbox import create_sandbox
    from sandfleet.sandbox.spec import SandboxSpec

    if backend_skip(backend):
        pytest.skip(str(backend_skip(backend)))
    box = await create_sandbox(SandboxSpec(image="host", backend=backend))
    try:
        own = await box.exec(["cat"], user="verifier", pid_namespace=True, stdin="in\n", timeout=30)
        assert (own.exit_code, own.timed_out, own.stdout) == (0, False, "in\n"), own.output
        started: dict[str, RunningCommand] = {}
        reader = asyncio.create_task(box.exec(["cat"], user="agent", stdin=True, timeout=30,
                                              on_start=lambda c: started.setdefault("cat", c)))
        while "cat" not in started:
            await asyncio.sleep(0.05)
        sleeper = asyncio.create_task(box.exec(["sleep", "120"], user="verifier", pid_namespace=True, timeout=150,
                                               on_start=lambda c: started.setdefault("sleep", c)))
        while "sleep" not in started:
            await asyncio.sleep(0.05)
        started["cat"].send_stdin(b"more\n")
        started["cat"].close_stdin()
        other = await reader
        assert (other.exit_code, other.timed_out, other.stdout) == (0, False, "more\n"), other.output
        await box.kill_user("verifier")
        await sleeper
    finally:
        await box.close()


# A Harbor test.sh that relies on /proc naming its own processes, as pytest-xdist, psutil and
# `pkill -f server` do: it scores 1 only when they all hold.
PROC_TESTS = r"""ok=1
read -r self _ < /proc/self/stat
[ "$self" = "$$" ] || ok=0
me=$(python3 -c 'import os; print(open(f"/proc/{os.getpid()}/stat").read().split()[1])')
[ "$me" = "(python3)" ] || ok=0
python3 -m http.server --bind 127.0.0.1 18765 >/dev/null 2>&1 & server=$!
# (until the child has exec'd python, its command line is the shell's: on a busy host, a while)
for i in $(seq 200); do [ -n "$(pgrep -f 'http.server --bind 127.0.0.1 18765')" ] && break; sleep 0.05; done
[ "$(pgrep -f 'http.server --bind 127.0.0.1 18765')" = "$server" ] || ok=0
pkill -f 'http.server --bind 127.0.0.1 18765'; wait $server; [ $? = 143 ] || ok=0
others=$(python3 -c 'import os; print(",".join(c for c in (open(f"/proc/{p}/comm").read().strip()
    for p in os.listdir("/proc") if p.isdigit()) if c not in ("bash", "test.sh", "python3", "sandfleet-init")))')
[ -z "$others" ] || ok=0
echo "self=$self shell=$$ me=$me server=$server others=$others ok=$ok"
echo $ok > /logs/verifier/reward.txt
"""


@MODES
async def test_the_tests_see_their_own_processes_on_proc(tmp_path: Path, verify: str) -> None:
    skip_on_gvisor(OWN_PROC_GAP)
    task = harbor_task(tmp_path, "own-proc", PROC_TESTS)
    results = await rollouts([task], ["setsid sleep 303 </dev/null >/dev/null 2>&1 &", "echo done"], verify)
    for r in results:
        assert r.status == "completed" and r.reward == 1.0, (r.reason, r.verifier_output)


async def test_the_service_carries_the_pid_namespace_exec(tmp_path: Path) -> None:
    """On `sandfleet serve` (what `--remote` runs on) an exec's `"pid_namespace": true` gets there."""
    import base64
    import importlib.util

    import httpx

    if importlib.util.find_spec("fastapi") is None:
        pytest.skip("the service needs the server extra")
    from sandfleet.server.testing import running_service

    def stdout(r: httpx.Response) -> str:
        assert r.status_code == 200, r.text
        last = json.loads(r.text.splitlines()[-1])
        assert last["type"] == "exit", last
        return base64.b64decode(last["stdout_b64"]).decode() if "stdout_b64" in last else str(last["stdout"])

    with running_service(tmp_path / "svc") as svc:
        async with httpx.AsyncClient(base_url=svc.url, headers={"Authorization": f"Bearer {svc.token}"},
                                     timeout=120) as h:
            r = await h.post("/v1/sandboxes", json={"limits": {"ttl_s": 120}})
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            try:
                ex = f"/v1/sandboxes/{sid}/exec"
                own = stdout(await h.post(ex, json={"cmd": LEAVE_DAEMON, "pid_namespace": True}))
                after = stdout(await h.post(ex, json={"cmd": COUNT_SLEEPERS}))
            finally:
                await h.delete(f"/v1/sandboxes/{sid}")
    assert "PID=2 " in own and "SLEEPERS=0" in after, (own, after)
