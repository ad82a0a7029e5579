"""Reward integrity III (issue 41): the grader sealed by mechanism, not by a list of attacks.

One test per class of the third round, each a real Harbor task whose tests decide 0, run as an
attacker would: two rollouts at once on bwrap in shared and ``--verify separate`` mode (the
slow pass repeats them on gvisor and microvm where the class applies). Each asserts a reward of
0 (completed, a number) or the mechanism's refusal itself. docs/security.md, "Reward integrity",
"The seal", lists which backend gets which part.

1. the reward write made to fail: test.sh's open-file limit lowered from outside (prlimit); a
   reward file of another uid moved in; the reward folder swapped for a link through a parent
   the agent owned; separate mode's unpacking keeping the agent's ownership;
2. the grader's processes controlled from outside them: killed by a watcher the code under test
   left, its memory opened through /proc, ptrace, process_vm_writev, kill(-1);
3. git layouts the sanitizer didn't see: a HEAD that is a dangling link, a worktree's common
   folder without a HEAD, a bare repository in the workdir;
4. the test runner taken over from the workdir: a dist-info's pytest plugin, a regular package
   shadowing an installed namespace package, a venv interpreter first on the image's PATH;
5. pid 1 crippled into a mask: prlimit(1, ...) refused for every command on every backend.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_reward_integrity import _host, assert_zero, write  # the same helpers as round II

from sandfleet.rollout import OraclePolicy, RunConfig, ScriptedPolicy, run_suite
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.runner import RetryPolicy
from sandfleet.sandbox import create_sandbox
from sandfleet.tasks import Task, load_task
from test_rollout_support import needs_bwrap

pytestmark = needs_bwrap()
MODES = pytest.mark.parametrize("verify", ["shared", "separate"])
GVISOR = pytest.param("gvisor", marks=[pytest.mark.slow, pytest.mark.skipif(
    not shutil.which("runsc"), reason="gVisor's runsc not installed (apt-get install runsc)")])
BACKENDS = pytest.mark.parametrize("backend", ["bwrap", GVISOR])
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REWARD = "/logs/verifier/reward.txt"
DECIDE = f'if [ "$(cat /app/out.txt 2>/dev/null)" = hello ]; then echo 1; else echo 0; fi > {REWARD}\n'
BY_EXIT = f'if [ "$rc" = 0 ]; then echo 1; else echo 0; fi > {REWARD}\n'


def harbor_task(root: Path, name: str, test_sh: str, *, toml: str = "", tests: dict[str, str] | None = None,
                solve: Sequence[str] | None = None) -> Task:
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text(
        f'version = "1.0"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n{toml}'
        "[environment]\ncpus = 1\nmemory_mb = 512\nstorage_mb = 256\n")
    (folder / "instruction.md").write_text("Write hello into /app/out.txt.\n")
    (folder / "environment" / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\nWORKDIR /app\n")
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    for rel, text in (tests or {}).items():
        (folder / "tests" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "tests" / rel).write_text(text)
    if solve is not None:  # the attack as the task's own solution (the oracle agent replays it)
        (folder / "solution").mkdir()
        (folder / "solution" / "solve.sh").write_text("#!/bin/bash\n" + "\n".join(solve) + "\n")
    return load_task(folder)


async def rollouts(tasks: Sequence[Task], commands: Sequence[str], verify: str = "shared",
                   backend: str = "bwrap", **config: Any) -> list[RolloutResult]:
    cfg = RunConfig(backend=backend, n=2, concurrency=4, retry=RetryPolicy(max_attempts=1),
                    verify=verify, **config)  # type: ignore[arg-type]
    report = await run_suite(list(tasks), ScriptedPolicy(commands), cfg, image_for=_host)
    assert len(report.results) == 2 * len(tasks)
    return report.results


# -- 1. the reward write made to fail

PRLIMIT = '''import os, resource
try:
    open("/logs/verifier/reward.txt", "w").write("1")
except OSError as e:  # the seal keeps the reward folder from the code under test
    print("reward write:", e.strerror)
try:
    resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (0, 0))
    print("prlimit of test.sh: done")
except OSError as e:
    print("prlimit of test.sh:", e.strerror)
'''


@MODES
async def test_code_under_test_cannot_lower_the_test_scripts_limits(tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "prlimit", "cd /app && python3 solution.py\n" + DECIDE)
    results = await rollouts([task], [write("/app/solution.py", PRLIMIT)], verify)
    for r in results:
        assert "prlimit of test.sh: Operation not permitted" in r.verifier_output, r.verifier_output
    assert_zero(results)


PLANT = ("mkdir -p /logs/plant && echo 1 > /logs/plant/reward.txt && chmod 0777 /logs/plant && "
         "chmod 0644 /logs/plant/reward.txt")


# the agent owns /logs: it opens it to all, so that the code under test can swap the reward
# folder for a link to a folder holding the agent's 1, whose file test.sh can't write
SWAP = '''import os
try:
    os.rename("/logs/verifier", "/logs/gone")
    os.symlink("/logs/plant", "/logs/verifier")
    print("swapped")
except OSError as e:
    print("swap:", e.strerror)
'''


@MODES
async def test_the_reward_folder_cannot_be_swapped_through_a_parent_the_agent_owned(
        tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "swap", "cd /app && python3 solution.py\n" + DECIDE)
    results = await rollouts([task], [PLANT + " && (chmod 0777 /logs || true)", write("/app/solution.py", SWAP)],
                             verify)
    for r in results:
        assert "swap: Permission denied" in r.verifier_output, r.verifier_output
    assert_zero(results)


async def test_a_declared_separate_verifier_unpacks_artifacts_owned_by_the_tests_user(tmp_path: Path) -> None:
    task = harbor_task(tmp_path, "owners", "stat -c 'owner=%u' /logs/artifacts/reward.txt\n" + DECIDE,
                       toml='environment_mode = "separate"\n')
    plant = ("mkdir -p /logs/artifacts && echo 1 > /logs/artifacts/reward.txt && chmod 0777 /logs/artifacts && "
             "chmod 0444 /logs/artifacts/reward.txt")
    results = await rollouts([task], [plant, "echo goodbye > /app/out.txt"])
    for r in results:
        assert r.verifier_output.count("owner=1001") == 1, r.verifier_output
        assert "owner=1000" not in r.verifier_output
    assert_zero(results)


@pytest.mark.parametrize("native", ["1", "0"])
async def test_the_reward_provenance_check_names_a_file_of_another_uid(native: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The same answers from the guest agent's `stat` and from the shell's find."""
    from sandfleet.rollout.verifier import _reward_files_provenance

    monkeypatch.setenv("SANDFLEET_NATIVE_HELPERS", native)
    async with await create_sandbox(image="host") as sb:
        await sb.exec(["sh", "-c", "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
                       "chown 1000 /logs/verifier/reward.txt && echo 0 > /logs/verifier/own.txt && "
                       "chown 1001 /logs/verifier/own.txt && echo 1 > /logs/verifier/ro.txt && chown 1001 "
                       "/logs/verifier/ro.txt && chmod 0444 /logs/verifier/ro.txt && ln -s reward.txt "
                       "/logs/verifier/link.txt"], user="root")
        why = await _reward_files_provenance(sb, ["/logs/verifier/reward.txt"], "1001")
        assert why is not None and "owned by uid 1000, not by the tests' user (uid 1001)" in why
        why = await _reward_files_provenance(sb, ["/logs/verifier/own.txt", "/logs/verifier/ro.txt"], "1001")
        assert why is not None and "/logs/verifier/ro.txt was made read-only (mode 444)" in why
        assert await _reward_files_provenance(sb, ["/logs/verifier/own.txt", "/logs/verifier/none",
                                                   "/logs/verifier/link.txt"], "1001") is None


# -- 2. the grader's processes out of reach of the code they test

GRADE = f'''import subprocess, sys
out = subprocess.run([sys.executable, "/app/solution.py"], capture_output=True, text=True, timeout=20)
print(out.stdout, out.stderr)
ok = out.stdout.strip().endswith("hello")
print("grade decided", int(ok))
open("{REWARD}", "w").write("1" if ok else "0")
'''
# a watcher left by the code under test finds the grader in /proc and stops or kills it, then
# writes 1; it tries every way in (kill(-1), the grader's pid, ptrace, /proc/PID/mem)
WATCHER = '''import ctypes, os, signal, sys, time
def grader():
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if b"grade.py" in open("/proc/%s/cmdline" % p, "rb").read():
                    return int(p)
            except OSError:
                pass
def report(what, f):
    try:
        f()
        print(what, "done", flush=True)
    except OSError as e:
        print(what, e.strerror, flush=True)
g = os.getppid()  # the grader started this code; /proc names it too, where /proc is the tests' own
print("grader", g, grader(), flush=True)
libc = ctypes.CDLL(None, use_errno=True)
def ptrace():
    if libc.ptrace(16, g, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
report("ptrace", ptrace)
report("mem", lambda: open("/proc/%d/mem" % g, "r+b").close())
report("mem1", lambda: open("/proc/1/mem", "r+b").close())
report("kill-1", lambda: os.kill(-1, signal.SIGCONT))
print("goodbye", flush=True)
if os.fork() == 0:  # holds the grader's pipes, so it waits for us: stop it, write 1, kill it
    os.setsid()
    with open("/tmp/watcher.log", "w") as log:
        for sig in (signal.SIGSTOP, None, signal.SIGKILL):
            if sig is None:
                open("/logs/verifier/reward.txt", "w").write("1")
                continue
            try:
                os.kill(g, sig)
                print(sig.name, "done", file=log, flush=True)
            except OSError as e:
                print(sig.name, e.strerror, file=log, flush=True)
    os._exit(0)
'''


@MODES
async def test_a_watcher_of_the_code_under_test_cannot_reach_the_grader(tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "watcher", "python3 /tests/grade.py\ncat /tmp/watcher.log\n",
                       tests={"grade.py": GRADE})
    results = await rollouts([task], [write("/app/solution.py", WATCHER)], verify)
    for r in results:
        out = r.verifier_output
        for what in ("ptrace", "mem", "mem1", "kill-1", "SIGSTOP", "SIGKILL"):
            assert f"{what} done" not in out, out
        assert "grade decided 0" in out, out
    assert_zero(results)


SIBLINGS = '''#!/bin/bash
sleep 30 &
# the sibling is a forked bash until it has exec'd sleep: pkill -f right after & raced it on a busy host
for i in $(seq 200); do pgrep -f "sleep 30" >/dev/null && break; sleep 0.05; done
pkill -f "sleep 30" && echo "pkill reached the sibling"
python3 -c "import subprocess; p = subprocess.Popen(['sleep', '30']); p.terminate(); print('terminated', p.wait())"
timeout 1 sleep 5; echo "timeout: $?"
'''


async def test_the_seal_keeps_test_scripts_process_control_working(tmp_path: Path) -> None:
    task = harbor_task(tmp_path, "siblings", "bash /tests/siblings.sh\n" + "echo 1 > " + REWARD + "\n",
                       tests={"siblings.sh": SIBLINGS})
    for r in await rollouts([task], ["true"]):
        out = r.verifier_output
        assert "pkill reached the sibling" in out and "terminated -15" in out and "timeout: 124" in out, out
        assert r.reward == 1.0


# -- 3. git layouts

GIT_FILTER = ("git config filter.evil.clean \"sh -c 'echo 1 > /logs/verifier/reward.txt; cat'\" && "
              "git config filter.evil.smudge cat && echo '* filter=evil' > .gitattributes")
DANGLING_HEAD = ("cd /app && git init -q -b main . && git -c user.name=a -c user.email=a@b commit -q --allow-empty "
                 "-m x && git pack-refs --all && rm .git/HEAD && ln -s refs/heads/main .git/HEAD && "
                 + GIT_FILTER + " && echo hi > f.txt")
EVIL_FILTER = "[filter \"evil\"]\n\tclean = sh -c 'echo 1 > /logs/verifier/reward.txt && cat'\n"
COMMON_NO_HEAD = ("cd /tmp && git init -q -b main r && cd r && git -c user.name=a -c user.email=a@b commit -q "
                  "--allow-empty -m x && mkdir -p /app/meta/wt && mv /tmp/r/.git /app/meta/common && "
                  "rm /app/meta/common/HEAD && printf 'ref: refs/heads/main\\n' > /app/meta/wt/HEAD && "
                  "printf '../common\\n' > /app/meta/wt/commondir && printf 'gitdir: /app/meta/wt\\n' > /app/.git && "
                  "cat /tmp/evil.cfg >> /app/meta/common/config && cd /app && echo '* filter=evil' > .gitattributes && "
                  "echo hi > f.txt")
BARE = ("cd /app && git init -q --bare -b main . && git config filter.evil.clean \"sh -c 'echo 1 > "
        "/logs/verifier/reward.txt; cat'\" && git config core.fsmonitor \"sh -c 'echo 1 > /logs/verifier/reward.txt'\"")


@MODES
@pytest.mark.parametrize("layout", [DANGLING_HEAD, COMMON_NO_HEAD, BARE], ids=["dangling-head", "common-no-head",
                                                                                "bare"])
async def test_git_config_of_every_layout_git_reads_is_sanitized(tmp_path: Path, verify: str, layout: str) -> None:
    if not shutil.which("git"):
        pytest.skip("git not installed")
    task = harbor_task(tmp_path, "git", DECIDE + "cd /app && git status --short 2>&1 | head -5; git add -A 2>&1 "
                       "| head -3; cat /logs/verifier/reward.txt\n")
    results = await rollouts([task], [write("/tmp/evil.cfg", EVIL_FILTER), layout], verify)
    assert_zero(results)


# -- 4. the test runner from the workdir

PLUGIN = {
    "/app/evilplug-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evilplug\nVersion: 1.0\n",
    "/app/evilplug-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evilplug_mod\n",
    "/app/evilplug_mod.py": '''import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
print("EVIL PLUGIN")
''',
}
TEST_OUT = "def test_out():\n    assert open('/app/out.txt').read().strip() == 'hello'\n"


@MODES
async def test_a_pytest_plugin_registered_in_the_workdir_is_not_loaded(tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "plugin", "cd /app && python3 -m pytest -q -p no:cacheprovider --confcutdir=/tests "
                       "/tests/test_out.py; rc=$?\n" + BY_EXIT, tests={"test_out.py": TEST_OUT})
    results = await rollouts([task], [write(p, t) for p, t in PLUGIN.items()] + ["echo goodbye > /app/out.txt"],
                             verify)
    for r in results:
        assert "EVIL PLUGIN" not in r.verifier_output, r.verifier_output
    assert_zero(results)


NAMESPACE_TEST = "import nsp.check\n\ndef test_out():\n    assert nsp.check.ok()\n"


@MODES
async def test_a_workdir_package_does_not_shadow_an_installed_namespace_package(tmp_path: Path, verify: str) -> None:
    check = "def ok():\n    return open('/app/out.txt').read().strip() == 'hello'\n"
    task = harbor_task(tmp_path, "namespace", "cd /app && python3 -m pytest -q -p no:cacheprovider "
                       "--confcutdir=/tests /tests/test_ns.py; rc=$?\n" + BY_EXIT,
                       toml='[verifier.env]\nPYTHONPATH = "/tests/lib"\n',
                       tests={"test_ns.py": NAMESPACE_TEST, "lib/nsp/check.py": check})
    results = await rollouts([task], [write("/app/nsp/__init__.py", ""),
                                      write("/app/nsp/check.py", "def ok():\n    return True\n"),
                                      "echo goodbye > /app/out.txt"], verify)
    assert_zero(results)


FAKE_PYTHON = "#!/bin/sh\necho 'all tests passed'\nexit 0\n"


@MODES
async def test_a_workdir_venv_first_on_the_images_path_does_not_run_the_tests(tmp_path: Path, verify: str) -> None:
    task = harbor_task(tmp_path, "venv-path", "python3 -c \"import sys; sys.exit(open('/app/out.txt').read().strip() "
                       "!= 'hello')\"; rc=$?\n" + BY_EXIT,
                       toml='[environment.env]\nPATH = "/app/.venv/bin:/usr/local/bin:/usr/bin:/bin"\n')
    results = await rollouts([task], [write("/app/.venv/bin/python3", FAKE_PYTHON),
                                      "chmod +x /app/.venv/bin/python3", "echo goodbye > /app/out.txt"], verify)
    assert_zero(results)
    # an honest solution still scores 1 (python3 comes from the image)
    for r in await rollouts([task], ["echo hello > /app/out.txt"], verify):
        assert r.reward == 1.0, (r.reason, r.verifier_output)


# -- 5. pid 1 can't be crippled into a mask; the seal on every backend

# a static program (the microvm's host image is busybox): each operation and its errno
PROCCTL = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
static void say(const char *what, int rc) { printf("%s %s\n", what, rc == 0 ? "done" : strerror(errno)); }
int main(int argc, char **argv) {
    struct rlimit zero = {0, 0};
    if (!strcmp(argv[1], "pid1")) {
        say("nofile", prlimit(1, RLIMIT_NOFILE, &zero, NULL));
        say("nproc", prlimit(1, RLIMIT_NPROC, &zero, NULL));
        say("own", prlimit(0, RLIMIT_CORE, NULL, &zero));
    } else {
        pid_t p = getppid();
        char buf[8] = {0};
        struct iovec l = {buf, sizeof buf}, r = {(void *)4096, sizeof buf};
        say("prlimit", prlimit(p, RLIMIT_NOFILE, &zero, NULL));
        int traced = (int)ptrace(PTRACE_ATTACH, p, 0, 0);
        say("ptrace", traced);
        say("process_vm_writev", process_vm_writev(p, &l, 1, &r, 1, 0) < 0 ? -1 : 0);
        say("kill-1", kill(-1, 0));
        /* let the parent go on: left stopped, its exec ran into its 30 s timeout (issue 43) */
        if (traced == 0 && waitpid(p, NULL, __WALL) == p)
            ptrace(PTRACE_DETACH, p, 0, 0);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def procctl(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    import subprocess

    d = tmp_path_factory.mktemp("procctl")
    (d / "p.c").write_text(PROCCTL)
    for cc in ("musl-gcc", "gcc", "cc"):
        made = shutil.which(cc) and subprocess.run([cc, "-static", "-O2", "-o", str(d / "p"), str(d / "p.c")])
        if made and made.returncode == 0:
            return (d / "p").read_bytes()
    pytest.skip("no C compiler with a static libc")


ALL_BACKENDS = pytest.mark.parametrize("backend", ["bwrap", GVISOR, pytest.param("microvm", marks=[
    pytest.mark.slow, pytest.mark.skipif(not shutil.which("qemu-system-x86_64"), reason="QEMU not installed")])])


@ALL_BACKENDS
async def test_no_command_changes_pid_1s_limits(backend: str, procctl: bytes) -> None:
    async with await create_sandbox(image="host", backend=backend) as sb:
        await sb.write_file("/tmp/procctl", procctl, user="root", mode=0o755)
        for user in ("root", "agent"):
            res = await sb.exec(["/tmp/procctl", "pid1"], user=user, timeout=30)
            assert res.stdout.splitlines() == ["nofile Operation not permitted", "nproc Operation not permitted",
                                               "own done"], (backend, user, res.output)
        again = await asyncio.wait_for(sb.exec(["true"]), 30)
        assert again.exit_code == 0


@ALL_BACKENDS
async def test_the_tests_exec_is_sealed_on_every_backend(backend: str, procctl: bytes) -> None:
    """The verifier's exec (its own pid namespace where the backend isolates) gets the seal
    stacked on the default filter, with the default filter off too: no prlimit of, ptrace of or
    process_vm_writev into another process, no kill(-1). The agent's own commands keep ptrace."""
    async with await create_sandbox(image="host", backend=backend, seccomp_allow=("unconfined",)) as sb:
        await sb.write_file("/tmp/procctl", procctl, user="root", mode=0o755)
        # its parent: the shell (not exec'd over), as a grader above the code under test
        script = "/tmp/procctl parent; true"
        sealed = await sb.exec(["sh", "-c", script], user="verifier", pid_namespace=True, timeout=30)
        assert sealed.stdout.splitlines() == ["prlimit Operation not permitted", "ptrace Operation not permitted",
                                              "process_vm_writev Operation not permitted",
                                              "kill-1 Operation not permitted"], (backend, sealed.output)
        agent = await sb.exec(["sh", "-c", script], user="agent", timeout=30)
        assert "prlimit done" in agent.stdout and "kill-1 done" in agent.stdout, (backend, agent.output)
        assert agent.exit_code == 0, (backend, agent.exit_code, agent.output)  # the traced shell went on


# -- every attack above on gvisor, as the tasks' own solutions (slow)

def attack_tasks(root: Path) -> list[Task]:
    """The attacks of this file as tasks whose solve.sh is the attack (what the oracle replays)."""
    return [
        harbor_task(root, "prlimit", "cd /app && python3 solution.py\n" + DECIDE,
                    solve=[write("/app/solution.py", PRLIMIT)]),
        harbor_task(root, "swap", "cd /app && python3 solution.py\n" + DECIDE,
                    solve=[PLANT + " && (chmod 0777 /logs || true)", write("/app/solution.py", SWAP)]),
        harbor_task(root, "watcher", "python3 /tests/grade.py\ncat /tmp/watcher.log\n", tests={"grade.py": GRADE},
                    solve=[write("/app/solution.py", WATCHER)]),
        harbor_task(root, "git-dangling-head", DECIDE + "cd /app && git add -A 2>&1 | head -3\n",
                    solve=[write("/tmp/evil.cfg", EVIL_FILTER), DANGLING_HEAD]),
        harbor_task(root, "git-common-no-head", DECIDE + "cd /app && git add -A 2>&1 | head -3\n",
                    solve=[write("/tmp/evil.cfg", EVIL_FILTER), COMMON_NO_HEAD]),
        harbor_task(root, "plugin", "cd /app && python3 -m pytest -q -p no:cacheprovider --confcutdir=/tests "
                    "/tests/test_out.py; rc=$?\n" + BY_EXIT, tests={"test_out.py": TEST_OUT},
                    solve=[write(p, t) for p, t in PLUGIN.items()]),
        harbor_task(root, "namespace", "cd /app && python3 -m pytest -q -p no:cacheprovider --confcutdir=/tests "
                    "/tests/test_ns.py; rc=$?\n" + BY_EXIT, toml='[verifier.env]\nPYTHONPATH = "/tests/lib"\n',
                    tests={"test_ns.py": NAMESPACE_TEST,
                           "lib/nsp/check.py": "def ok():\n    return open('/app/out.txt').read() == 'hello'\n"},
                    solve=[write("/app/nsp/__init__.py", ""),
                           write("/app/nsp/check.py", "def ok():\n    return True\n")]),
        harbor_task(root, "venv-path", "python3 -c \"import sys; sys.exit(open('/app/out.txt').read().strip() "
                    "!= 'hello')\"; rc=$?\n" + BY_EXIT,
                    toml='[environment.env]\nPATH = "/app/.venv/bin:/usr/local/bin:/usr/bin:/bin"\n',
                    solve=[write("/app/.venv/bin/python3", FAKE_PYTHON), "chmod +x /app/.venv/bin/python3"]),
    ]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("runsc"), reason="gVisor's runsc not installed (apt-get install runsc)")
@MODES
async def test_every_attack_of_this_file_scores_zero_on_gvisor(tmp_path: Path, verify: str) -> None:
    cfg = RunConfig(backend="gvisor", n=1, concurrency=4, retry=RetryPolicy(max_attempts=1),
                    verify=verify)  # type: ignore[arg-type]
    tasks = attack_tasks(tmp_path)
    report = await run_suite(tasks, OraclePolicy(), cfg, image_for=_host)
    by_task = {r.task: r for r in report.results}
    assert set(by_task) == {t.name for t in tasks}
    # gVisor has no Landlock: the seal's signal filter (forward in pid order) stops the watcher
    watcher = by_task["watcher"]
    for what in ("ptrace", "kill-1", "mem1", "SIGSTOP", "SIGKILL"):
        assert f"{what} done" not in watcher.verifier_output, watcher.verifier_output
    assert_zero(list(by_task.values()))


def test_validate_reports_a_workdir_venv_on_the_images_path(tmp_path: Path) -> None:
    from sandfleet.tasks.scan import workdir_path_risk

    task = harbor_task(tmp_path, "venv-path", "true\n",
                       toml='[environment.env]\nPATH = "/app/.venv/bin:/usr/bin:/bin:"\n')
    assert workdir_path_risk(task) == ["/app/.venv/bin (left out of the tests' PATH)",
                                       "(empty: the cwd) (left out of the tests' PATH)"]
    kept = harbor_task(tmp_path, "kept", "true\n", toml='[verifier.env]\nPATH = "/app/bin:/usr/bin"\n'
                       '[environment.env]\nPATH = "/app/bin:/usr/bin"\n')
    assert workdir_path_risk(kept) == ["/app/bin (kept by [verifier.env] PATH, flagged in verifier_risks)"]


def test_the_images_variables_that_load_code_name_nothing_the_agent_could_write(tmp_path: Path) -> None:
    """Round XVII: the image's LD_LIBRARY_PATH naming the workdir, BASH_ENV a file in the agent's
    home, options naming a file in /tmp: left out of the tests' environment (what else they name
    kept), reported by `tasks validate`; a variable the task's [verifier.env] sets is kept, flagged."""
    from sandfleet.tasks.scan import implicit_env, workdir_path_risk

    env = {"LD_LIBRARY_PATH": "/usr/local/lib:/app/lib:", "BASH_ENV": "/home/agent/.bashrc",
           "JAVA_TOOL_OPTIONS": "-Xmx1g -javaagent:/tmp/a.jar", "NODE_OPTIONS": "--max-old-space-size=4096",
           "LD_PRELOAD": "libjemalloc.so.2 /dev/shm/x.so", "PYTHONHOME": "/usr", "PERL5LIB": "lib",
           "XDG_CONFIG_HOME": "/etc/xdg", "DATA_DIR": "/app/data"}
    assert implicit_env(env, "/app", "/home/agent") == {
        "LD_LIBRARY_PATH": ("/usr/local/lib", ["/app/lib", "(empty: the cwd)"]),
        "LD_PRELOAD": ("libjemalloc.so.2", ["/dev/shm/x.so"]),
        "BASH_ENV": ("", ["/home/agent/.bashrc"]),
        "PERL5LIB": ("", ["lib"]),
        "JAVA_TOOL_OPTIONS": ("", ["/tmp/a.jar"]),
    }
    task = harbor_task(tmp_path, "ld-path", "true\n", toml='[environment.env]\nLD_LIBRARY_PATH = "/app/lib"\n'
                       'BASH_ENV = "/home/agent/.bashrc"\n')
    assert workdir_path_risk(task) == ["LD_LIBRARY_PATH: /app/lib (left out of the tests' environment)",
                                       "BASH_ENV: /home/agent/.bashrc (left out of the tests' environment)"]
    kept = harbor_task(tmp_path, "kept-ld", "true\n", toml='[verifier.env]\nLD_LIBRARY_PATH = "/app/lib"\n'
                       '[environment.env]\nLD_LIBRARY_PATH = "/app/lib"\n')
    assert workdir_path_risk(kept) == [
        "LD_LIBRARY_PATH: /app/lib (kept by [verifier.env] LD_LIBRARY_PATH, flagged in verifier_risks)"]


# -- through --remote: the verifier runs here, its sandbox on `sandfleet serve`

async def test_the_seal_and_provenance_hold_through_the_service(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("fastapi") is None:
        pytest.skip("the service needs the server extra")
    from sandfleet.client.remote import remote
    from sandfleet.server.testing import running_service

    tasks = [t for t in attack_tasks(tmp_path / "tasks") if t.name in ("prlimit", "swap", "watcher", "plugin")]
    with running_service(tmp_path / "svc") as svc:
        async with remote(svc.url, svc.token):
            cfg = RunConfig(backend="bwrap", n=1, concurrency=4, retry=RetryPolicy(max_attempts=1))
            report = await run_suite(tasks, OraclePolicy(), cfg, image_for=_host)
    assert sorted(r.task for r in report.results) == sorted(t.name for t in tasks)
    watcher = next(r for r in report.results if r.task == "watcher")
    for what in ("ptrace", "mem", "mem1", "kill-1", "SIGSTOP", "SIGKILL"):
        assert f"{what} done" not in watcher.verifier_output, watcher.verifier_output
    assert_zero(report.results)


@BACKENDS
async def test_the_agents_shell_session_is_found_for_same_shell_tests(backend: str) -> None:
    """TB1 run_tests_in_same_shell runs the tests in the agent's session, found by its state file's
    owner (gVisor refuses coreutils' statx: ls and stat found none there)."""
    from sandfleet.rollout.verifier import _session_state

    async with await create_sandbox(image="host", backend=backend) as sb:
        await sb.session().run("cd /tmp && export X=1")
        found = await _session_state(sb, "agent")
        assert found is not None and found.startswith("/tmp/.sandfleet-session-"), found
        assert await _session_state(sb, "verifier") is None


# -- 6. the warden: a process that leaves the tests' tree while they run (docs/security.md, "The warden")

WATCH_AND_OVERWRITE = '''import ctypes, os, time
if os.fork() == 0:
    os.setsid()
    if os.fork():
        os._exit(0)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init()
    libc.inotify_add_watch(fd, b"/logs/verifier", 0x8)  # IN_CLOSE_WRITE: test.sh's decision
    os.read(fd, 4096)
    time.sleep(0.05)
    open("/logs/verifier/reward.txt", "w").write("1")
    os._exit(0)
'''
QUIET_DOUBLE_FORK = '''import os, time
if os.fork() == 0:  # no setsid: the same session as test.sh, gone before test.sh ends
    if os.fork():
        os._exit(0)
    time.sleep(0.2)
    os._exit(0)
'''
TESTS_DECIDE_0 = f"cd /app && python3 solution.py\nsleep 0.5\necho 0 > {REWARD}\nsleep 1\n"


@MODES
@BACKENDS
async def test_a_daemon_of_the_code_under_test_scores_zero(tmp_path: Path, verify: str, backend: str) -> None:
    """The class of the third round's last forgeries: a process the code under test left behind
    writes after the tests decided (or rewrites what the grader reads). The warden sees it leave
    the tests' tree, whatever it does after, and the reward is not the tests'."""
    overwrite = harbor_task(tmp_path, "overwrite", TESTS_DECIDE_0)
    quiet = harbor_task(tmp_path, "quiet", f"cd /app && python3 solution.py\nsleep 0.5\necho 1 > {REWARD}\n")
    for task, code in ((overwrite, WATCH_AND_OVERWRITE), (quiet, QUIET_DOUBLE_FORK)):
        results = await rollouts([task], [write("/app/solution.py", code)], verify, backend)
        assert_zero(results, "tests_detached")
        assert "allow_detached" in (results[0].info.get("reward_error") or results[0].error or ""), results[0].info


async def test_background_jobs_of_the_test_script_are_its_own(tmp_path: Path) -> None:
    """What test.sh starts with & stays its child: not detached while it runs, and killed with
    the tests' namespace when it ends (a server left running, as test scripts do)."""
    task = harbor_task(tmp_path, "bg", f"sleep 30 &\npython3 -m http.server 8123 >/dev/null 2>&1 &\n"
                       f"sleep 0.3\necho 1 > {REWARD}\n")
    for r in await rollouts([task], ["true"]):
        assert r.reward == 1.0, (r.reason, r.info, r.verifier_output)
        assert not r.info.get("verifier_risks"), r.info


async def test_a_task_may_allow_its_tests_to_start_a_daemon(tmp_path: Path) -> None:
    script = f"(sleep 30 &)\nsleep 0.2\necho 1 > {REWARD}\n"
    allowed = harbor_task(tmp_path, "allowed", script, toml="allow_detached = true\n")
    for r in await rollouts([allowed], ["true"]):
        assert r.reward == 1.0, (r.reason, r.info, r.verifier_output)
        assert any("outlived the program that started them" in x for x in r.info["verifier_risks"]), r.info
    undeclared = harbor_task(tmp_path, "undeclared", script)
    assert_zero(await rollouts([undeclared], ["true"]), "tests_detached")


async def test_a_test_script_killed_after_its_reward_scores_zero(tmp_path: Path) -> None:
    """test.sh is pid 2 under the warden: what kills it (here itself) leaves no decision, even
    with a reward file written before."""
    task = harbor_task(tmp_path, "killed", f"echo 1 > {REWARD}\nkill -9 $$\n")
    assert_zero(await rollouts([task], ["true"]), "tests_killed")


# -- 7. the reward folders kept from the code under test (docs/security.md, "The reward folders kept ...")

SERVER_PY = '''import signal, sys, time
def stop(*_):
    try:
        open("/logs/verifier/reward.txt", "w").write("1")
        print("server wrote 1", flush=True)
    except OSError as e:
        print("server:", e.strerror, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("serving", flush=True)
while True:
    time.sleep(1)
'''
SERVER_C = r'''#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
static void stop(int s) {
    (void)s;
    int fd = open("/logs/verifier/reward.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) { write(fd, "1", 1); close(fd); write(1, "server wrote 1\n", 15); }
    else write(1, "server refused\n", 15);
    _exit(0);
}
int main(void) { signal(SIGTERM, stop); for (;;) pause(); }
'''
STOP_AT_END = (f"sleep 1\n[ \"$(cat /app/out.txt 2>/dev/null)\" = hello ] && echo 1 > {REWARD} || echo 0 > {REWARD}\n"
               "kill $SERVER; wait $SERVER\n")


@MODES
async def test_code_under_test_test_sh_runs_attached_cannot_write_the_reward(tmp_path: Path, verify: str) -> None:
    """A server of the workdir that test.sh starts with & and stops at the end: its SIGTERM
    handler runs after test.sh decided. A Python one (the seal's constructor), and a static C one
    (the library never loads into it: bash's exec of a workdir program takes the rule first)."""
    py = harbor_task(tmp_path, "py-server", "cd /app\npython3 /app/server.py &\nSERVER=$!\n" + STOP_AT_END)
    results = await rollouts([py], [write("/app/server.py", SERVER_PY)], verify)
    for r in results:
        assert "server: Permission denied" in r.verifier_output, r.verifier_output
    assert_zero(results)
    if not shutil.which("gcc"):
        pytest.skip("no gcc on this host for the static server")
    static = harbor_task(tmp_path, "c-server", "cd /app\nfile server | grep -o 'statically linked'\n./server &\n"
                         "SERVER=$!\n" + STOP_AT_END)
    results = await rollouts([static], [write("/app/server.c", SERVER_C),
                                        "cd /app && gcc -static -O1 -o server server.c"], verify)
    for r in results:
        assert "statically linked" in r.verifier_output and "server refused" in r.verifier_output, r.verifier_output
    assert_zero(results)


HONEST_WRITERS = '''mkdir -p /logs/verifier
cd /app
python3 -c "open('/logs/verifier/from-python-c.txt', 'w').write('ok')"
echo ok | tee /logs/verifier/from-tee.txt >/dev/null
cp /app/out.txt /logs/verifier/copied.txt
python3 /app/report.py > /logs/verifier/report.txt
python3 - <<'E'
open('/logs/verifier/from-heredoc.txt', 'w').write('ok')
E
sh -c 'echo ok > /logs/verifier/from-sh-c.txt'
PATH=/app/bin:$PATH sh -c 'exec tee /logs/verifier/path-walk.txt >/dev/null' <<< ok
(cd /logs/verifier && echo ok > relative.txt && echo ok > /logs/verifier/../verifier/dotdot.txt)
sh -c 'echo ok > /dev/stdout' > /logs/verifier/stdout.txt
[ "$(cat /logs/verifier/stdout.txt)" = ok ] || rm -f /logs/verifier/stdout.txt
sort -o /logs/verifier/sorted.txt /app/out.txt
find /app -name out.txt -fprint /logs/verifier/found.txt
python3 /tests/grade.py
'''


@BACKENDS
async def test_the_tests_own_writers_still_write_the_reward_folder(tmp_path: Path, backend: str) -> None:
    """What test scripts do stays as it was: a python -c, tee, cp of the agent's output, a
    redirect of the agent's program's output, a python heredoc, an sh -c, a grader of the tests'
    folder (round V's line: the system's tools and the tests' own one-liners and heredocs write),
    sort and find given the workdir writing there themselves (round XX: the system's programs known
    to run no code, seal.c's plain_tools, stay the tests' own).
    On gVisor too, where the code under test is a user of its own. And dash's own walk of a PATH
    whose first folder is the workdir's: its failed exec of /app/bin/tee kept nothing (the seal
    looks before it keeps), so the /usr/bin/tee it ran next still wrote."""
    grade = (f"import os\nok = all(os.path.exists('/logs/verifier/' + f) for f in ('from-python-c.txt', "
             f"'from-tee.txt', 'copied.txt', 'report.txt', 'from-heredoc.txt', 'from-sh-c.txt', "
             f"'path-walk.txt', 'relative.txt', 'dotdot.txt', 'stdout.txt', 'sorted.txt', 'found.txt'))\n"
             f"open('{REWARD}', 'w').write('1' if ok else '0')\n")
    task = harbor_task(tmp_path, "writers", HONEST_WRITERS, tests={"grade.py": grade})
    results = await rollouts([task], [write("/app/report.py", "print('report')\n"), "echo hello > /app/out.txt"],
                             backend=backend)
    for r in results:
        assert r.reward == 1.0, (r.reason, r.info.get("reward_error"), r.verifier_output)


SHADOW_GRADE = f"""import sys
sys.path.insert(0, '/tests')  # as pytest's rootdir puts it
sys.path.insert(0, '/app')  # as a test module does, to import the solution
from checks import out_ok  # the tests' own (/tests/checks.py); the agent has a checks.py of its own
from solution import answer  # the agent's module still imports
ok = out_ok() and answer() == 42
print('checks from', sys.modules['checks'].__file__, 'ok', ok)
open('{REWARD}', 'w').write('1' if ok else '0')
"""


@BACKENDS
async def test_the_tests_own_module_comes_before_the_workdirs_of_the_same_name(tmp_path: Path, backend: str) -> None:
    """Round XX's tests-helper-shadow, the honest side: a grader that puts the workdir first on sys.path
    imports its helper module from the tests' folder, though the agent has a module of that name (here
    an honest one of its own, without the helper's function: had it been found first, the import would
    fail and the reward be 0), and still imports the solution from the workdir."""
    checks = "def out_ok():\n    return open('/app/out.txt').read().strip() == 'hello'\n"
    task = harbor_task(tmp_path, "shadow", "cd /app && python3 /tests/grade.py\n",
                       tests={"grade.py": SHADOW_GRADE, "checks.py": checks})
    results = await rollouts([task], [write("/app/checks.py", "LINT = 'my own lint settings'\n"),
                                      write("/app/solution.py", "def answer():\n    return 42\n"),
                                      "echo hello > /app/out.txt"], backend=backend)
    for r in results:
        assert r.reward == 1.0 and "checks from /tests/checks.py" in r.verifier_output, (r.reason, r.verifier_output)


async def test_an_agents_own_test_module_named_like_the_tests_leaves_them_theirs(tmp_path: Path) -> None:
    """An honest agent that wrote tests of its own under the hidden tests' module name (/app/test_out.py):
    pytest, given /tests/test_out.py from the workdir, still runs the tests' module (the guard's finder
    now searches the tests' folders before the workdir, round XX: this keeps it so)."""
    test_sh = ("cd /app && python3 -m pytest -q -p no:cacheprovider --confcutdir=/tests /tests/test_out.py\n"
               "rc=$?\n" + BY_EXIT)
    task = harbor_task(tmp_path, "own-tests", test_sh, tests={
        "test_out.py": "def test_out():\n    assert open('/app/out.txt').read().strip() == 'hello'\n"})
    mine = "def test_mine():\n    assert open('/app/out.txt').read().startswith('h')\n"
    results = await rollouts([task], [write("/app/test_out.py", mine), "echo hello > /app/out.txt"])
    for r in results:
        assert r.reward == 1.0, (r.reason, r.verifier_output)


YAML_GRADE = f"""import datetime, yaml
with open('/app/config.yaml') as f:
    cfg = yaml.load(f, Loader=yaml.Loader)  # the full loader, Python tags and all
ok = cfg['start'] == datetime.date(2024, 1, 2) and cfg['pair'] == (1, 2)
print('config', cfg, ok)
open('{REWARD}', 'w').write('1' if ok else '0')
"""


async def test_an_honest_yaml_config_with_python_tags_still_loads(tmp_path: Path) -> None:
    """Round XX's yaml-apply-*, the honest side: a document whose Python tags make harmless objects
    (a date through !!python/object/apply, a tuple) loads as before under the guard, which runs each
    such call as the code under test's, and the grader that loaded it still writes the reward."""
    task = harbor_task(tmp_path, "yaml", "cd /app && python3 /tests/grade.py\n", tests={"grade.py": YAML_GRADE})
    config = "start: !!python/object/apply:datetime.date [2024, 1, 2]\npair: !!python/tuple [1, 2]\n"
    results = await rollouts([task], [write("/app/config.yaml", config)])
    for r in results:
        assert r.reward == 1.0, (r.reason, r.verifier_output)


EVAL_GRADE = f"""import dataclasses
with open('/app/answer.txt') as f:
    text = f.read()
# a grader of the tests' own that evaluates the agent's answer after transforming it (as sympy's sympify does)
code = ' '.join(text.replace('^', '**').split())
value = eval(compile(code, '<answer>', 'eval'), {{'__builtins__': {{}}}}, {{'x': 3}})
Score = dataclasses.make_dataclass('Score', ['value'])  # code compiled from a string after the read, too
ok = Score(value).value == 16
print('answer', code, '=', value, ok)
open('{REWARD}', 'w').write('1' if ok else '0')
"""


async def test_an_honest_answer_a_grader_evaluates_still_scores(tmp_path: Path) -> None:
    """Round XXI's sympify-*, the honest side: a grader that read a workdir file and then compiles strings
    at run time (the agent's answer, transformed, and a dataclass of its own) has the guard's gates on
    (what runs in a frame compiled from a string is the code under test's); the grader's own frames,
    which decide and write the reward, are still the tests'."""
    task = harbor_task(tmp_path, "evaluated", "cd /app && python3 /tests/grade.py\n", tests={"grade.py": EVAL_GRADE})
    results = await rollouts([task], [write("/app/answer.txt", "(x + 1)^2\n")])
    for r in results:
        assert r.reward == 1.0 and "= 16 True" in r.verifier_output, (r.reason, r.verifier_output)


ONE_LINERS = f"""mkdir -p /logs/verifier
cd /app
S=1
python3 -c "open('/logs/verifier/expanded.txt', 'w').write('$S')"
bash -c "$(cat /tests/cmd.sh)"
out=$(bash -c "$(cat /app/cmd.txt)")
echo "answer: $out"
ls /logs/verifier
if [ "$out" = hello ] && [ -f /logs/verifier/expanded.txt ] && [ -f /logs/verifier/from-tests-file.txt ] && \\
   [ ! -e /logs/verifier/agent.txt ]; then echo 1; else echo 0; fi > {REWARD}
"""


@BACKENDS
async def test_a_one_liner_is_the_tests_or_the_agents_by_whose_file_holds_its_text(tmp_path: Path,
                                                                                   backend: str) -> None:
    """Round XXI's bash-c-cat, both sides: a one-liner whose code is a workdir file's text (the agent's
    answer, run as `bash -c "$(cat /app/cmd.txt)"`) is the code under test, and can't write the reward
    folder (before: the tests' own by the one-liner rule, agent.txt was written); one whose text is a
    tests' file's, or made by the tests' shell from its own variables, still writes it."""
    task = harbor_task(tmp_path, "one-liners", ONE_LINERS, tests={
        "cmd.sh": "echo ok > /logs/verifier/from-tests-file.txt; echo the tests own command\n"})
    agent = "echo 1 > /logs/verifier/agent.txt 2>/dev/null; echo hello\n"
    results = await rollouts([task], [write("/app/cmd.txt", agent)], backend=backend)
    for r in results:
        assert r.reward == 1.0 and "answer: hello" in r.verifier_output, (r.reason, r.verifier_output)


FLOOD = ("python3 -c \"import os; os.makedirs('{d}', exist_ok=True); "
         "[open('{d}/f%d' % i, 'w').close() for i in range({n})]\"")
AGENT_ONE_LINER = "echo 1 > /logs/verifier/agent.txt 2>/dev/null; echo hello\n"


async def test_the_one_liners_walk_of_the_workdir_is_bounded(tmp_path: Path) -> None:
    """The walk that looks for a one-liner's text in the workdir has bounds (seal.c, kind_holds: 20000
    entries, 64 MiB): the workdir's own files first, then what lies deeper. A large tree deeper down
    (25,000 files) is no proof of an attack: the tests' one-liner made from their own variables still
    writes the reward folder, and the agent's one-liner at the top is still found. A flood at the top
    itself (20,001 files beside the agent's command) could hide the text behind the bound, so it counts
    as found: the agent's one-liner still can't write there, nor (the bound's cost) a one-liner the tests
    made from their own variable."""
    deep = harbor_task(tmp_path, "deep", ONE_LINERS.replace('bash -c "$(cat /tests/cmd.sh)"\n', "").replace(
        "[ -f /logs/verifier/from-tests-file.txt ] && ", ""))
    results = await rollouts([deep], [FLOOD.format(d="/app/data/deep", n=25000),
                                      write("/app/cmd.txt", AGENT_ONE_LINER)])
    for r in results:
        assert r.reward == 1.0 and "answer: hello" in r.verifier_output, (r.reason, r.verifier_output)
    # the tests' own one-liner made from their variable is kept there too (the bound's cost, said in
    # docs/security.md): at the top, the walk can't tell a flood from where the text lies
    top_sh = ('cd /app\nS=1\nbash -c "echo 1 > /logs/verifier/expanded.txt 2>/dev/null; echo the tests $S"\n'
              'out=$(bash -c "$(cat /app/cmd.txt)")\necho "answer: $out"\n'
              f'if [ "$out" = hello ] && [ ! -e /logs/verifier/agent.txt ] && [ ! -e /logs/verifier/expanded.txt ]; '
              f'then echo 1; else echo 0; fi > {REWARD}\n')
    top = harbor_task(tmp_path, "top", top_sh)
    results = await rollouts([top], [FLOOD.format(d="/app", n=20001), write("/app/cmd.txt", AGENT_ONE_LINER)])
    for r in results:
        assert r.reward == 1.0 and "answer: hello" in r.verifier_output, (r.reason, r.verifier_output)


LIB_PROBE = r"""#include <stdio.h>
#include <stdlib.h>
int add(int a, int b) { return a + b; }
void probe(void) {
    FILE *f = fopen("/logs/verifier/lib.txt", "w");
    if (f) { fputs("1", f); fclose(f); }
    char cmd[64];
    snprintf(cmd, sizeof cmd, "echo %s > /logs/verifier/sys.txt", "made-by-the-library");
    printf("system: %d\n", system(cmd));
    fflush(stdout);
}
void stop(void) { exit(0); }
"""
LIB_GRADE = f"""import ctypes
lib = ctypes.CDLL('/tmp/libsol.so')
assert lib.add(2, 3) == 5
lib.probe()
open('{REWARD.rsplit("/", 1)[0]}/grader.txt', 'w').write('ok')  # the grader's own write
print('grader wrote')
"""
LIB_HARNESS = """void probe(void);
int add(int a, int b);
int main(int argc, char **argv) { probe(); return argc < 2 || add(2, 3) != 5; }
"""
LIB_SH = f"""cd /app
gcc -shared -fPIC -o /tmp/libsol.so sol.c || exit 1
python3 /tests/grade.py; graded=$?
python3 -c "import ctypes; ctypes.CDLL('/tmp/libsol.so').stop()" /tests/cases.txt; stopped=$?
gcc -o /tmp/harness /tests/harness.c -L/tmp -lsol -Wl,-rpath,/tmp && /tmp/harness /tests/cases.txt; harness=$?
echo "graded=$graded stopped=$stopped harness=$harness"; ls /logs/verifier
if [ -f /logs/verifier/grader.txt ] && [ ! -e /logs/verifier/lib.txt ] && [ ! -e /logs/verifier/sys.txt ] && \\
   [ "$graded$stopped$harness" = 010 ]; then echo 1; else echo 0; fi > {REWARD}
"""


@BACKENDS
async def test_a_library_of_the_agents_in_a_tests_program_is_the_code_under_test(tmp_path: Path, backend: str) -> None:
    """Round XXI's ctypes-lib-* and harness-linked-watcher, as one honest grader: the agent's library,
    loaded by a tests' Python through ctypes and linked into a tests' C harness, computes what it is
    asked, but what it asks of libc as the tests' own program runs -- a write of the reward folder, a
    start (its command made at run time: no file holds it), an exit(0) that ends the grader before it
    decided -- is the code under test's: refused, kept, and a status of 1. The grader's own write after
    it still lands, and its own end is still 0. Before: lib.txt and sys.txt were written and the
    stopped Python exited 0; on gVisor the tests' harness did not build (gcc's as, judged the code
    under test, ran as the tests' user and could not write the driver's 0600 temporary: now handed).
    The stopped Python is a grader (it names /tests/cases.txt): not kept, only armed."""
    task = harbor_task(tmp_path, "library", LIB_SH, tests={"grade.py": LIB_GRADE, "harness.c": LIB_HARNESS,
                                                          "cases.txt": "2 3 5\n"})
    results = await rollouts([task], [write("/app/sol.c", LIB_PROBE)], backend=backend)
    for r in results:
        assert r.reward == 1.0 and "grader wrote" in r.verifier_output, (r.reason, r.verifier_output)


GIVEN_A_PROGRAM = f"""cd /app
gcc -o /tmp/prog main.c || exit 1
valgrind -q --error-exitcode=3 --suppressions=/tests/vg.supp /tmp/prog > /tmp/by-valgrind.txt
rc=$?
/lib64/ld-linux-x86-64.so.2 /tmp/prog /tests/vg.supp > /tmp/by-ldso.txt
rc2=$?
cat /tmp/by-valgrind.txt /tmp/by-ldso.txt; ls /logs/verifier
if [ "$rc$rc2" = 00 ] && grep -q hello /tmp/by-valgrind.txt && grep -q hello /tmp/by-ldso.txt && \\
   [ ! -e /logs/verifier/prog.txt ]; then echo 1; else echo 0; fi > {REWARD}
"""
PROG_WRITES = """#include <stdio.h>
int main(void) {
    FILE *f = fopen("/logs/verifier/prog.txt", "w");
    if (f) { fputs("1", f); fclose(f); }
    puts("hello");
    return 0;
}
"""


async def test_a_program_run_inside_valgrind_or_the_loader_is_the_code_under_test(tmp_path: Path) -> None:
    """Round XXI's valgrind-tests-supp and ldso-by-hand, both sides: the agent's program run by valgrind
    (with the tests' suppressions file) or by the dynamic loader by hand (with a tests' file as its
    argument) runs and prints as before, and can't write the reward folder (before: valgrind and ld.so
    named a tests' path, so they were graders, and the client's own seal fails open under valgrind)."""
    task = harbor_task(tmp_path, "given", GIVEN_A_PROGRAM, tests={"vg.supp": "# the tests' suppressions\n"})
    results = await rollouts([task], [write("/app/main.c", PROG_WRITES)])
    for r in results:
        assert r.reward == 1.0, (r.reason, r.verifier_output)


@pytest.mark.parametrize("backend", ["bwrap", GVISOR])
async def test_a_kernel_without_landlock_is_a_risk_on_the_row_when_the_tests_are_root(tmp_path: Path,
                                                                                       backend: str) -> None:
    """The seal's rule is Landlock's, or where the sandbox's kernel has none (gVisor) a uid of the
    tests' own (the next test). A task whose tests run as root there (`[verifier] user = "root"`)
    gets neither: its rows say that the reward folders were not kept from the code under test (the
    verifier asks the seal itself, in an exec of true, which ABI the tests get); `tasks validate`
    warns of it. On bwrap (Landlock) and for the default tests' user (the uid split, on by
    default), no such line; with the split turned off (SANDFLEET_SEAL_UID=0), every gVisor row."""
    from sandfleet.rollout.verifier import NO_LANDLOCK_RISK

    plain = harbor_task(tmp_path, "plain", DECIDE)
    root = harbor_task(tmp_path, "root", DECIDE, toml='user = "root"\n')
    os.environ["SANDFLEET_SEAL_UID"] = "0"  # no uid split
    try:
        results = await rollouts([plain, root], ["echo hello > /app/out.txt"], backend=backend)
    finally:
        del os.environ["SANDFLEET_SEAL_UID"]
    for r in results:
        assert r.reward == 1.0, (r.reason, r.info, r.verifier_output)
        risks = r.info.get("verifier_risks") or []
        assert (NO_LANDLOCK_RISK in risks) == (backend == "gvisor"), (backend, r.task, risks)
    # the default: the uid split, where the default tests' user is kept and root is not
    for r in await rollouts([plain, root], ["echo hello > /app/out.txt"], backend=backend):
        assert r.reward == 1.0, (r.reason, r.info, r.verifier_output)
        risks = r.info.get("verifier_risks") or []
        assert (NO_LANDLOCK_RISK in risks) == (backend == "gvisor" and r.task == "root"), (backend, r.task, risks)


UIDS_SH = '''id -u > /logs/verifier/tests-uid
python3 /app/prog.py
cd /app && python3 prog.py
sh -c 'id -u > /tmp/sh-c-uid'
python3 /tests/grade.py
'''
UIDS_GRADE = f'''import os
tests = open('/logs/verifier/tests-uid').read().split()
prog = open('/app/prog-uid').read().split()
lines = [f"tests {{tests}} prog {{prog}} sh-c {{open('/tmp/sh-c-uid').read().split()}}"]
print(*lines)
os.makedirs('/app/made-by-code', exist_ok=True)
want = os.environ['WANT'].split()
ok = tests == [want[0]] and prog == [want[1], want[1]]
open('{REWARD}', 'w').write('1' if ok else '0')
'''
PROG = """import os
open('/app/prog-uid', 'a').write(f"{os.getuid()}\\n")
open('/tmp/prog-wrote', 'a').write('x')  # a file of the code under test's own in /tmp, twice
"""


@pytest.mark.parametrize("backend", ["bwrap", GVISOR])
async def test_without_landlock_the_code_under_test_runs_as_the_tests_user_and_the_tests_as_root(
        tmp_path: Path, backend: str) -> None:
    """gVisor has no Landlock: the tests run as root, and the seal makes every program of the
    code under test (`python3 /app/prog.py`, from the workdir or not) the tests' user (uid 1001)
    before it runs, so that the reward folders (root's, 0755) are out of its reach, as are the
    tests' processes. The test script's own one-liners stay root. On bwrap (Landlock) both are the
    tests' user, as before. The code under test writes the workdir and /tmp as before."""
    want = "0 1001" if backend == "gvisor" else "1001 1001"  # the uid split: the default
    task = harbor_task(tmp_path, "uids", UIDS_SH, toml=f'[verifier.env]\nWANT = "{want}"\n',
                       tests={"grade.py": UIDS_GRADE})
    for r in await rollouts([task], [write("/app/prog.py", PROG)], backend=backend):
        assert r.reward == 1.0, (backend, r.reason, r.info.get("reward_error"), r.verifier_output)


TEMP_SH = f"""python3 - <<'E'
import os, subprocess, tempfile
with tempfile.TemporaryDirectory() as d:
    fd, name = tempfile.mkstemp()
    os.close(fd)
    sub = os.path.join(d, "proj")
    os.makedirs(sub)
    open(os.path.join(sub, "data.txt"), "w").write("root's")  # made inside the folder, as root
    subprocess.run(["python3", "/app/prog.py", d, name, os.path.join(sub, "data.txt")], check=True, cwd=sub)
    ok = all(open(p).read() == "hello" for p in (os.path.join(d, "out.txt"), name, os.path.join(sub, "data.txt"),
                                                 os.path.join(sub, "made.txt")))
open("{REWARD}", "w").write("1" if ok else "0")
E
"""
TEMP_PROG = """import os, sys
open(os.path.join(sys.argv[1], "out.txt"), "w").write("hello")
open(sys.argv[2], "w").write("hello")
open(sys.argv[3], "w").write("hello")
open("made.txt", "w").write("hello")
"""


@pytest.mark.parametrize("backend", ["bwrap", GVISOR])
async def test_the_tests_temporary_folders_reach_the_code_under_test_with_the_uid_split(
        tmp_path: Path, backend: str) -> None:
    """With gVisor's uid split the tests are root and the code under test a user of its own: a
    folder the tests make with tempfile (0700) and a file (0600), handed to the code under test to
    write, are that user's too (the guard chowns what the root tests' tempfile makes), and so is
    what the root tests made inside it and hand over as the program's cwd or argument (the seal
    hands it over as it drops the program to its user), as on bwrap, where the tests and the code
    are one user. Before, 15 of the 28 bundled tasks scored 0 on gVisor with the split for this."""
    task = harbor_task(tmp_path, "temp", TEMP_SH)
    for r in await rollouts([task], [write("/app/prog.py", TEMP_PROG)], backend=backend):
        assert r.reward == 1.0, (backend, r.reason, r.info.get("reward_error"), r.verifier_output)


async def test_a_one_liner_that_execs_the_solutions_text_runs_it_as_the_code_under_test(tmp_path: Path) -> None:
    """Round X: a tests' one-liner that exec()s a workdir file's text (test_reward_integrity.py's
    STDIN_RUN, before stop 53) runs the code under test: the guard seals the program when it
    compiles that text, so the code's write of reward.json is refused. Before, the write went
    through and the verifier's conflict rule (reward.json named by no test file) was what held."""
    one_liner = "cd /app && S=solution.py python3 -c 'import os; exec(open(os.environ[\"S\"]).read())'\n"
    task = harbor_task(tmp_path, "exec-one-liner", one_liner + DECIDE)
    solution = 'open("/logs/verifier/reward.json", "w").write(\'{"reward": 1}\')\n'
    for r in await rollouts([task], [write("/app/solution.py", solution), "echo goodbye > /app/out.txt"]):
        assert (r.status, r.reward, r.reason) == ("completed", 0.0, None), (r.reason, r.verifier_output)
        assert "Permission denied: '/logs/verifier/reward.json'" in r.verifier_output, r.verifier_output


async def test_the_uid_split_beside_landlock_keeps_the_tests_files_from_the_code(tmp_path: Path) -> None:
    """SANDFLEET_SEAL_SPLIT=1 on bwrap (Landlock): the tests run as root and each program of the
    code under test, in its Landlock domain, becomes the tests' user (uid 1001) too. Round X's
    offset write into the tests' log in the workdir and its write into the tests' mktemp file are
    then refused (both forge without the split: the code under test has the tests' uid). What the
    tests hand the code in their temporary folders still reaches it, and the honest graders of
    this file still score 1. (The rename over the log forges with the split too: the workdir is
    the code's own folder; docs/security.md, round X.)"""
    from sandfleet.tasks import load_tasks

    uids = harbor_task(tmp_path, "uids", UIDS_SH, toml='[verifier.env]\nWANT = "0 1001"\n',
                       tests={"grade.py": UIDS_GRADE})
    temp = harbor_task(tmp_path, "temp", TEMP_SH)
    grader = harbor_task(tmp_path, "grader", f"cd /tests && python3 /tests/grade.py || echo 0 > {REWARD}\n",
                         tests={"grade.py": HONEST_GRADE})
    attacks = [t for t in load_tasks(FIXTURES / "attacks-x")[0] if t.name in ("workdir-log-pwrite", "mktemp-log")]
    os.environ["SANDFLEET_SEAL_SPLIT"] = "1"
    try:
        honest = await rollouts([uids], [write("/app/prog.py", PROG)])
        honest += await rollouts([temp], [write("/app/prog.py", TEMP_PROG)])
        honest += await rollouts([grader], [write("/app/solution.py", HONEST_SOLUTION)])
        cfg = RunConfig(backend="bwrap", n=1, concurrency=2, retry=RetryPolicy(max_attempts=1))
        report = await run_suite(attacks, OraclePolicy(), cfg)
    finally:
        del os.environ["SANDFLEET_SEAL_SPLIT"]
    for r in honest:
        assert r.reward == 1.0, (r.task, r.reason, r.info.get("reward_error"), r.verifier_output)
    assert len(report.results) == 2
    for r in report.results:
        assert r.status == "completed" and r.reward == 0.0, (r.task, r.reason, r.reward, r.verifier_output)


LINKS = f"""import os
for at in ("/tmp/summary.txt", "/app/summary.txt", "/tmp/linkdir"):
    target = "/logs/verifier" if at.endswith("linkdir") else "{REWARD}"
    try:
        os.symlink(target, at)
    except OSError as e:
        print("plant:", e)
"""
LINKED_WRITES = (DECIDE + "python3 /app/links.py\n"
                 "echo 1 > /tmp/summary.txt; echo 1 > /app/summary.txt; echo 1 > /tmp/linkdir/reward.txt\n"
                 "python3 -c \"open('/tmp/summary.txt', 'w').write('1')\"\n"
                 "echo 1 | tee /tmp/linkdir/reward.txt >/dev/null\n")


@MODES
async def test_a_write_into_the_reward_folder_through_a_planted_link_is_refused(tmp_path: Path, verify: str) -> None:
    """The code under test plants links where test.sh writes after its decision: /tmp/summary.txt
    and /app/summary.txt to the reward file, /tmp/linkdir to the reward folder. test.sh's own
    redirects, a python one-liner's open and tee through them are refused (an open that lands in a
    kept folder must name it), and the 0 stands (round VII's tmp-symlink-redirect, in more forms)."""
    task = harbor_task(tmp_path, "links", LINKED_WRITES)
    results = await rollouts([task], [write("/app/links.py", LINKS)], verify=verify)
    for r in results:
        assert r.status == "completed" and r.reward == 0.0, (r.reason, r.info.get("reward_error"), r.verifier_output)
        assert "through a link refused" in r.verifier_output, r.verifier_output


@MODES
async def test_a_file_the_agent_left_in_tmp_does_not_stand_for_the_tests_own(tmp_path: Path, verify: str) -> None:
    """The agent leaves /tmp/report.txt (its own, 0644, in the sticky /tmp) saying "passed": the
    tests' later write of their own report there works (the verifier hands what the agent left in
    the shared temporary folders to the tests' user), and the tests read their own (round V's
    stale-junit-in-tmp). In a separate verifier there was never such a file."""
    test_sh = ("echo failed > /tmp/report.txt || true\n"
               f"if [ \"$(cat /tmp/report.txt)\" = passed ]; then echo 1; else echo 0; fi > {REWARD}\n")
    task = harbor_task(tmp_path, "stale", test_sh)
    results = await rollouts([task], ["echo passed > /tmp/report.txt && chmod 644 /tmp/report.txt"], verify=verify)
    for r in results:
        assert r.status == "completed" and r.reward == 0.0, (r.reason, r.info.get("reward_error"), r.verifier_output)


HONEST_SOLUTION = """import atexit, ctypes, dataclasses, os, sys, tempfile, threading
@dataclasses.dataclass
class Point:
    x: int
_fd, _tmp = tempfile.mkstemp()
os.close(_fd)
atexit.register(os.remove, _tmp)  # its own cleanup, at the end of whatever process imported it
def double(n):
    return n * 2
def greet():
    assert ctypes.CDLL(None).strlen(b"hello") == 5  # a libc function that writes, starts or ends nothing
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
    return "hello" if Point(1).x == 1 else "no"
def main(argv):  # a command line's entry point: it ends with sys.exit, as argparse's do
    sys.exit(0 if argv == ["ok"] else 2)
"""
HONEST_GRADE = f"""import dataclasses, multiprocessing, os, pickle, subprocess, sys
sys.path.insert(0, "/app")
import solution
@dataclasses.dataclass
class Case:
    x: int
with multiprocessing.get_context("fork").Pool(2) as pool:
    ok = pool.map(solution.double, [1, 2, 3]) == [2, 4, 6]
ok = ok and pickle.loads(pickle.dumps(Case(3))).x == 3 and solution.greet() == "hello"
try:
    solution.main(["ok"])
except SystemExit as e:
    ok = ok and e.code == 0
subprocess.run(["sh", "-c", "echo ok > /logs/verifier/from-grader-sh.txt"], check=True)
ok = ok and os.path.exists("/logs/verifier/from-grader-sh.txt")
open("{REWARD}", "w").write("1" if ok else "0")
sys.stdout.flush()
os._exit(0)
"""
EXEC_GRADE = f"""ns = {{}}
exec(compile(open("/app/solution.py").read(), "solution", "exec"), ns)  # the workdir's text, a name of its own
ok = ns["double"](5) == 10 and ns["greet"]() == "hello"
open("{REWARD}", "w").write("1" if ok else "0")
"""
HONEST_PYTEST = """import solution
def test_greet():
    assert solution.greet() == "hello"
def test_double():
    assert solution.double(4) == 8
def test_main():
    import pytest
    with pytest.raises(SystemExit) as e:
        solution.main(["ok"])
    assert e.value.code == 0
"""


@BACKENDS
async def test_a_graders_own_ways_inside_its_process_still_score_one(tmp_path: Path, backend: str) -> None:
    """What the guard watches inside a tests' process keeps honest graders whole: a grader that
    imports the solution, forks a pool of workers that run it, pickles its own data, starts a shell
    that writes the reward folder, writes the reward and ends with os._exit(0) (its own); a solution
    with dataclasses, a thread, an exit handler of its own and a harmless libc call through ctypes;
    and pytest over that solution, by its exit status; a grader that exec()s the solution's source
    text under a name of its own, and writes the reward itself."""
    grader = harbor_task(tmp_path, "grader", f"cd /tests && python3 /tests/grade.py || echo 0 > {REWARD}\n",
                         tests={"grade.py": HONEST_GRADE})
    exec_grader = harbor_task(tmp_path, "exec-grader", "cd /tests && python3 /tests/grade.py\n",
                              tests={"grade.py": EXEC_GRADE})
    pytest_task = harbor_task(tmp_path, "pytest", "cd /app && python3 -m pytest -q -p no:cacheprovider "
                              "--confcutdir=/tests /tests/test_out.py\nrc=$?\n" + BY_EXIT,
                              tests={"test_out.py": HONEST_PYTEST})
    tasks = [grader, pytest_task, exec_grader]
    for r in await rollouts(tasks, [write("/app/solution.py", HONEST_SOLUTION)], backend=backend):
        assert r.reward == 1.0, (backend, r.task, r.reason, r.info.get("reward_error"), r.verifier_output)


async def test_the_warden_and_the_reward_rule_hold_through_the_service(tmp_path: Path) -> None:
    """--remote: the warden's count comes back in the exec's exit record, and the seal's copy
    with its folders is what the guest runs."""
    import importlib.util

    if importlib.util.find_spec("fastapi") is None:
        pytest.skip("the service needs the server extra")
    from sandfleet.client.remote import remote
    from sandfleet.server.testing import running_service
    from sandfleet.tasks import load_tasks

    tasks = [t for t in load_tasks(FIXTURES / "attacks-iv")[0] if t.name in ("last-moment-orphan", "server-sigterm")]
    with running_service(tmp_path / "svc") as svc:
        async with remote(svc.url, svc.token):
            cfg = RunConfig(backend="bwrap", n=1, concurrency=2, retry=RetryPolicy(max_attempts=1))
            report = await run_suite(tasks, OraclePolicy(), cfg)
    by = {r.task: r for r in report.results}
    assert by["last-moment-orphan"].reason == "tests_detached", by["last-moment-orphan"]
    assert_zero(report.results)


def test_a_test_script_that_sources_what_the_agent_could_write_is_flagged() -> None:
    """A file of the agent's that a test script sources (bash runs it apart since round XXII, but the
    variables it leaves decide; sh's `.` and an eval run it in the script's own process): the verifier
    flags it as a risk. Of the bundled tasks and every fixture, only round V's exit-trap-in-env and
    round XXII's tasks that source or evaluate the workdir's files are flagged."""
    from sandfleet.tasks import load_tasks
    from sandfleet.tasks.scan import sourced_from_workdir

    root = FIXTURES.parent.parent
    flagged = {}
    for folder in (root / "examples" / "tasks", FIXTURES / "tasks", FIXTURES / "attacks-iii", FIXTURES / "attacks-iv",
                   FIXTURES / "attacks-v", FIXTURES / "attacks-vi", FIXTURES / "harbor-parity",
                   FIXTURES / "attacks-xxii"):
        for task in load_tasks(folder)[0]:
            found = sourced_from_workdir(task)
            if found:
                flagged[task.name] = found
    assert flagged.pop("exit-trap-in-env") == ["tests/test.sh:4: [ -f .env ] && . ./.env"]
    assert flagged.pop("eval-settings") == ["tests/test.sh:4: eval \"$(grep -v '^#' /app/.env)\""]
    assert flagged.pop("env-function-shadow") == ["tests/test.sh:4: . ./config.sh"]  # relative: the cwd's
    # round XXII's others but the two whose test script sources nothing (tests-pythonpath) or only the tests'
    # own library, which then loads the workdir's (tests-lib-loads-settings: a path in a variable)
    assert set(flagged) == {"activate-exit0", "env-background-rewrite", "exported-function-grader",
                            "settings-pythonpath", "source-process-subst", "settings-path-shadow",
                            "bash-c-source", "sh-dot-settings", "settings-pytest-plugins", "settings-read-answer",
                            "sourced-server"}, flagged  # (a bash -c of round VI's that sources the workdir's)


def test_a_test_script_that_writes_a_fixed_name_in_tmp_is_flagged() -> None:
    """Round VII's tmp-symlink-redirect: test.sh's own write to a fixed name in /tmp follows a link
    the code under test planted there (the write is the test script's: the seal can't refuse it).
    The verifier flags such a script; of the bundled tasks and every fixture, only that attack and
    round V's launcher (a heredoc into /tmp/serve) are."""
    from sandfleet.tasks import load_tasks
    from sandfleet.tasks.scan import shared_tmp_writes

    root = FIXTURES.parent.parent
    flagged = {}
    folders = [root / "examples" / "tasks", FIXTURES / "tasks", FIXTURES / "harbor-parity"]
    folders += [FIXTURES / f"attacks-{r}" for r in ("iii", "iv", "v", "vi", "vii")]
    for folder in folders:
        for task in load_tasks(folder)[0]:
            found = shared_tmp_writes(task)
            if found:
                flagged[task.name] = found
    assert flagged == {
        "tmp-symlink-redirect": ["tests/test.sh:6: python3 /app/solution.py --summary > /tmp/summary.txt"],
        "launcher-script": ["tests/test.sh:2: cat > /tmp/serve <<'E'"]}, flagged


def test_a_test_script_that_keeps_its_output_where_the_code_can_write_is_flagged() -> None:
    """Round X: test.sh sends the grader's output to a file in the workdir, or to one mktemp made,
    and greps it; the code under test the grader runs renames its own file over it or writes into it
    (the seal keeps the reward folder from it, not the tests' other files). The verifier flags such
    a script; of the bundled tasks and every fixture, only those three attacks are."""
    from sandfleet.tasks import load_tasks
    from sandfleet.tasks.scan import tests_data_writes

    root = FIXTURES.parent.parent
    flagged = {}
    folders = [root / "examples" / "tasks", FIXTURES / "tasks", FIXTURES / "harbor-parity"]
    folders += [FIXTURES / f"attacks-{r}" for r in ("iii", "iv", "v", "vi", "vii", "viii", "ix", "x", "xi")]
    for folder in folders:
        for task in load_tasks(folder)[0]:
            found = tests_data_writes(task)
            if found:
                flagged[task.name] = found
    log = "tests/test.sh:4: python3 /tests/grade.py > /app/grade.log 2>&1"
    assert flagged == {"workdir-log-rename": [log], "workdir-log-pwrite": [log],
                       "mktemp-log": ['tests/test.sh:5: python3 /tests/grade.py > "$log" 2>&1']}, flagged


async def test_the_sourcing_risk_reaches_the_row() -> None:
    """The flag is in the rollout's verifier_risks, and `tasks validate` warns of it."""
    from sandfleet.tasks import load_tasks
    from sandfleet.tasks.scan import SHARED_TMP_RISK, SOURCED_RISK, TESTS_DATA_RISK

    tasks = [t for t in load_tasks(FIXTURES / "attacks-v")[0] if t.name == "exit-trap-in-env"]
    tasks += [t for t in load_tasks(FIXTURES / "attacks-vii")[0] if t.name == "tmp-symlink-redirect"]
    tasks += [t for t in load_tasks(FIXTURES / "attacks-x")[0] if t.name == "mktemp-log"]
    cfg = RunConfig(backend="bwrap", n=1, concurrency=1, retry=RetryPolicy(max_attempts=1))
    report = await run_suite(tasks, OraclePolicy(), cfg)
    by = {r.task: r for r in report.results}
    risks = by["exit-trap-in-env"].info.get("verifier_risks", [])
    assert any(x.startswith(SOURCED_RISK) for x in risks), risks
    risks = by["tmp-symlink-redirect"].info.get("verifier_risks", [])
    assert any(x.startswith(SHARED_TMP_RISK) for x in risks), risks
    risks = by["mktemp-log"].info.get("verifier_risks", [])
    assert any(x.startswith(TESTS_DATA_RISK) for x in risks), risks


# -- what the tests' own tools read after the code under test ran (round VII)

HOMES_SH = '''cd /app
python3 /app/prog.py "$HOME"
git add -A 2> /tmp/git-err
cd /tests && python3 /tests/grade.py "$HOME"
'''
HOMES_GRADE = f'''import os, sys
tests_home = sys.argv[1]
code = dict(line.split("=", 1) for line in open("/app/prog.txt").read().split())
ok = {{
    "its own HOME": code["home"] != tests_home and os.path.isfile(os.path.join(code["home"], "mine")),
    "the tests' HOME kept from it": code["tests_home"] == "refused",
    "git's filter ran": os.path.exists("/app/filter-ran"),
    "the filter kept from the reward folder": not os.path.exists("/logs/verifier/filter.txt"),
}}
print(ok, open("/tmp/git-err").read())
open("{REWARD}", "w").write("1" if all(ok.values()) else "0")
'''
HOMES_PROG = """import os, sys
home = os.path.expanduser("~")
open(os.path.join(home, "mine"), "w").write("x")
try:
    open(os.path.join(sys.argv[1], ".curlrc"), "w").write('output = "/logs/verifier/reward.txt"\\n')
    tests_home = "written"
except OSError:
    tests_home = "refused"
with open("/app/.git/config", "a") as f:
    f.write('[filter "x"]\\n\\tclean = touch /app/filter-ran; echo 1 > /logs/verifier/filter.txt; cat\\n')
open("/app/.gitattributes", "w").write("* filter=x\\n")
open("/app/prog.txt", "w").write(f"home={home}\\ntests_home={tests_home}\\n")
"""


@BACKENDS
async def test_the_tests_own_tools_read_no_config_the_code_under_test_wrote(tmp_path: Path, backend: str) -> None:
    """Round VII: config that the code under test writes while the tests run, read by the tests'
    own tools afterwards. The code under test gets a HOME of its own (the seal puts it in its
    environment) and can't write the tests' HOME (a kept folder beside the reward folder; root's
    on gVisor), where git's and curl's configuration would be read from; a program that git starts
    (a filter of the repository's config, written after the verifier sanitized it) is the code
    under test, kept from the reward folder as such."""
    task = harbor_task(tmp_path, "homes", HOMES_SH, tests={"grade.py": HOMES_GRADE})
    agent = ["cd /app && git init -q && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m init",
             write("/app/prog.py", HOMES_PROG)]
    for r in await rollouts([task], agent, backend=backend):  # gVisor: the uid split (bwrap: Landlock)
        assert r.reward == 1.0, (backend, r.reason, r.info.get("reward_error"), r.verifier_output)


FD3_TEST = ("mkdir -p /logs/verifier\nexec 3>/logs/verifier/reward.txt\ncd /app && python3 /app/solution.py\n"
            "if [ \"$(cat /app/out.txt 2>/dev/null)\" = hello ]; then echo 1 >&3; else echo 0 >&3; fi\n")


@BACKENDS
async def test_a_reward_descriptor_the_tests_hand_down_writes_nowhere_for_the_code_under_test(
        tmp_path: Path, backend: str) -> None:
    """test.sh opens the reward file on descriptor 3, runs the solution, and writes its verdict there:
    the solution that writes 0.9 on the descriptor it inherited (the file read 0.90 once test.sh's 0
    followed, round IX's inherited-reward-fd) writes to /dev/null instead, in both verify modes; the
    honest solution still scores 1 through test.sh's own descriptor, and its output, which test.sh
    sends into the reward folder, is still there for the tests to read."""
    attack = harbor_task(tmp_path / "a", "fd3", FD3_TEST)
    forge = write("/app/solution.py", "import os\nos.write(3, b'0.9')\n")
    for verify in ("shared", "separate") if backend == "bwrap" else ("shared",):
        results = await rollouts([attack], [forge], verify=verify, backend=backend)
        assert_zero(results)
        for r in results:
            assert "a descriptor open for writing on the reward file" in (r.verifier_output or ""), r.verifier_output
    honest = harbor_task(tmp_path / "h", "fd3", FD3_TEST.replace(
        "python3 /app/solution.py\n", "python3 /app/solution.py > /logs/verifier/solution.log\n"
        "grep -qx said /logs/verifier/solution.log || exit 3\n"))
    solve = write("/app/solution.py", "print('said')\nopen('/app/out.txt', 'w').write('hello')\n")
    for r in await rollouts([honest], [solve], backend=backend):
        assert r.reward == 1.0, (backend, r.reason, r.verifier_output)


async def test_a_workdir_path_the_seal_cant_hold_is_a_risk_on_the_row(tmp_path: Path) -> None:
    """The seal's paths fit in 512 bytes. A workdir whose path leaves no room: the seal goes
    without its folders, and the row says so in verifier_risks (until this stop, only a log line
    said it); the honest solution still scores 1."""
    long = "/w" + "/" + "d" * 200 + "/" + "e" * 200
    task = harbor_task(tmp_path, "long-workdir", f'if [ "$(cat {long}/out.txt 2>/dev/null)" = hello ]; '
                       f"then echo 1; else echo 0; fi > {REWARD}\n")
    dockerfile = task.path / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("WORKDIR /app", f"WORKDIR {long}"))
    task = load_task(task.path)
    for r in await rollouts([task], [write(f"{long}/out.txt", "hello\n")]):
        assert r.reward == 1.0, (r.reason, r.verifier_output)
        assert any("the seal could not take all its paths" in x and "no folder is kept" in x
                   for x in r.info.get("verifier_risks") or []), r.info


REPO_CONFTEST = '''class Counter:
    def __init__(self):
        self.reports = 0

    def pytest_runtest_logreport(self, report):
        self.reports += 1


def pytest_configure(config):
    config.pluginmanager.register(Counter(), "counter")
'''


@BACKENDS
async def test_a_repositorys_conftest_registering_a_plugin_object_still_scores_one(tmp_path: Path,
                                                                                 backend: str) -> None:
    """Round XIX refuses a plugin the code under test registers with pytest inside the tests' process
    (its hooks would decide what pytest reports), and ends the process with status 1 where such a hook got
    into pytest's tables past the refusal. A repository's own conftest does register plugin objects in its
    pytest_configure (SWE-bench's repositories do): the tests run pytest inside the workdir over it, and
    an honest solution still scores 1 in both modes."""
    task = harbor_task(tmp_path, "repo-conftest",
                       "mkdir -p /logs/verifier\ncp /tests/test_out.py /app/test_out.py\ncd /app\n"
                       "python3 -m pytest -q -p no:cacheprovider test_out.py\nrc=$?\n" + BY_EXIT,
                       tests={"test_out.py": "def test_out():\n    assert open('/app/out.txt').read().strip() == "
                                             "'hello'\n"})
    for verify in ("shared", "separate"):
        results = await rollouts([task], [write("/app/conftest.py", REPO_CONFTEST), "echo hello > /app/out.txt"],
                                 verify, backend)
        for r in results:
            assert r.reward == 1.0, (verify, r.reason, r.verifier_output[-1500:])
