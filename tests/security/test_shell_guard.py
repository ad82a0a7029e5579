"""The tests' shell guard (round XXII, docs/security.md "Code the tests' shell sources"): a file the
tests' bash sources that is not the tests' own runs in a bash of its own, as the code under test, and
only its variables come back, as data.

The first tests run the guard in the host's own bash (no sandbox: the quick tier), as the verifier
writes it, with a workdir and a tests' folder of their own; the last runs it where it matters, in the
verifier of real rollouts on bwrap and gVisor, the seal keeping the reward folder from the file apart.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_reward_integrity import write
from test_reward_integrity_iii import BACKENDS, REWARD, harbor_task, rollouts

from sandfleet.rollout.shellguard import GUARD_NAME, SH_GUARD, shell_env

pytestmark = pytest.mark.skipif(not shutil.which("bash"), reason="no bash")


def _run(tmp_path: Path, script: str, files: dict[str, str], env: dict[str, str] | None = None,
         ) -> subprocess.CompletedProcess[str]:
    """``script`` as the tests' bash (cwd: the workdir), the guard as its BASH_ENV, ``files`` written
    first (relative to tmp_path: app/... is the workdir's, tests/... the tests')."""
    guard = tmp_path / "py"
    guard.mkdir(exist_ok=True)
    (guard / GUARD_NAME).write_text(SH_GUARD)
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "app").mkdir(exist_ok=True)
    (tmp_path / "tests" / "test.sh").write_text(script)
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "home"),
            "PYTHONPATH": str(guard), "SANDFLEET_UNTRUSTED": str(tmp_path / "app"),
            "SANDFLEET_TESTS_DIRS": str(tmp_path / "tests"), **(env or {})}
    base.update(shell_env(base, str(guard)))
    return subprocess.run(["bash", str(tmp_path / "tests" / "test.sh")], cwd=tmp_path / "app", env=base,
                          capture_output=True, text=True, timeout=60)


AGENTS_SETTINGS = r"""GREETING=hello
export VIRTUAL_ENV=/app/.venv
export PATH="/app/.venv/bin:$PATH"
export PYTHONPATH=/app/src
MULTI=$'one\ntwo\n'
unset DROPPED
export LD_PRELOAD=/app/evil.so HOME=/app PS4='$(touch pwned)' IFS=, BASH_ENV=/app/x PYTHONSTARTUP=/app/s.py \
       GIT_CONFIG_COUNT=0 SANDFLEET_SEAL_NATIVE=0 PYTHONNOUSERSITE=
export PYTEST_PLUGINS=passer CC=/app/evil-cc
declare -a LIST=(a b)
python3() { return 0; }
alias ls=true
trap 'echo "the EXIT trap of the settings ran"' EXIT
set +e
cd /
echo "settings say: arg1=${1-none} caller=$$ secret=${secret-unseen}"
return 3
"""

TESTS_LIB = r"""declare -A MAP=([k]=v)
lib_fn() { echo "lib_fn"; }
LIB_VAR=lib
"""

CHECKS = r"""set -euo pipefail
export DROPPED=old
caller=$$
f() { . "$TESTS/lib.sh"; echo "in f: ${MAP[k]}"; }
f
source "$TESTS/lib.sh"
lib_fn
echo "lib: ${MAP[k]} $LIB_VAR"
rc=0
secret=the-tests-own
source /APP/settings.sh || rc=$?
echo "status: $rc"
echo "GREETING=$GREETING VIRTUAL_ENV=$VIRTUAL_ENV exported=$(env | grep -c '^GREETING=' || true)"
echo "PATH first: ${PATH%%:*}"
echo "PYTHONPATH=$PYTHONPATH"
printf 'MULTI=[%s]\n' "$MULTI"
echo "DROPPED=${DROPPED-unset}"
echo "kept: LD_PRELOAD=${LD_PRELOAD-} HOME=$HOME PS4=$PS4 IFS=[$IFS] BASH_ENV=${BASH_ENV##*/} \
PYTHONSTARTUP=${PYTHONSTARTUP-} GIT_CONFIG_COUNT=${GIT_CONFIG_COUNT-} MARK=${SANDFLEET_SEAL_NATIVE-} \
PYTHONNOUSERSITE=${PYTHONNOUSERSITE-}"
echo "LIST=${LIST-none}"
echo "unnamed: $(env | grep -c -e '^PYTEST_PLUGIN' -e '^C[C]=' || true)"
echo "python3 is $(type -t python3)"
echo "cwd is $PWD"
case $- in *e*) echo "errexit: on" ;; *) echo "errexit: off" ;; esac
source <(printf 'FROM_PIPE=yes\n')
echo "FROM_PIPE=$FROM_PIPE"
source /dev/fd/6 6< /APP/fd6.sh
echo "FROM_FD6=$FROM_FD6"
bash -c 'source /APP/settings.sh >/dev/null 2>&1; echo "nested python3 is $(type -t python3)"'
echo end
"""


def test_a_sourced_file_of_the_agents_runs_apart_and_only_its_variables_come_back(tmp_path: Path) -> None:
    app, tests = tmp_path / "app", tmp_path / "tests"
    script = CHECKS.replace("/APP", str(app)).replace("$TESTS", str(tests))
    settings = AGENTS_SETTINGS.replace("/app", str(app))
    r = _run(tmp_path, script, {"app/settings.sh": settings, "tests/lib.sh": TESTS_LIB, "app/fd6.sh": "FROM_FD6=a\n"},
             env={"PYTHONNOUSERSITE": "1", "GIT_CONFIG_COUNT": "3"})
    out = r.stdout
    assert r.returncode == 0 and out.endswith("end\n"), (r.returncode, out, r.stderr)
    # the tests' own library: sourced in their shell (a function's local array, its functions)
    assert "in f: v\nlib_fn\nlib: v lib\n" in out
    # the agent's file: its status and output, its $1 not the guard's
    assert "settings say: arg1=none" in out and "status: 3" in out
    assert "secret=unseen" in out  # the tests' environment only, as a program of the agent's would have it
    assert f"caller={os.getpid()}" not in out
    # its variables the tests' files name: set, exported as it exported them, unset; PYTHONPATH keeps the
    # guard's folder first
    assert f"GREETING=hello VIRTUAL_ENV={app}/.venv exported=0" in out
    assert f"PATH first: {app}/.venv/bin" in out
    assert f"PYTHONPATH={tmp_path}/py:{app}/src" in out
    assert "MULTI=[one\ntwo\n]" in out and "DROPPED=unset" in out
    # never the loader's, the shell's, sandfleet's, the tests' HOME, git's, Python's start-up
    assert (f"kept: LD_PRELOAD= HOME={tmp_path}/home PS4=+  IFS=[ \t\n] BASH_ENV={GUARD_NAME} PYTHONSTARTUP= "
            "GIT_CONFIG_COUNT=3 MARK= PYTHONNOUSERSITE=1") in out
    # nor its arrays, functions, aliases, traps, options, working folder (its EXIT trap ran at its own end)
    # nor a variable no tests' file names (one only a program reads by itself: a tool's configuration)
    assert "unnamed: 0" in out
    assert "LIST=none" in out and "python3 is file" in out and f"cwd is {app}" in out and "errexit: on" in out
    assert "the EXIT trap of the settings ran" in out and not (app / "pwned").exists()
    # a process substitution's text, and a bash the tests start that sources the file (the guard is its BASH_ENV)
    assert "FROM_PIPE=yes" in out and "nested python3 is file" in out
    assert "FROM_FD6=a" in out  # a regular file on a descriptor: sourced apart as itself


def test_what_is_the_tests_own_file(tmp_path: Path) -> None:
    """The tests' folders and the system's root-owned folders are the tests' own; the workdir, a
    temporary folder, a link from the workdir that leads to the tests' file (its real path: theirs), a
    file bash finds by its name in the cwd, a system file below a folder others may write: not."""
    app, tests = tmp_path / "app", tmp_path / "tests"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (app).mkdir()
    (app / "link.sh").symlink_to(tests / "lib.sh")
    script = f"""probe() {{ __sandfleet_own "$(readlink -f "$1")" && echo "own $1" || echo "apart $1"; }}
probe {tests}/lib.sh
probe {app}/settings.sh
probe {app}/link.sh
probe /etc/os-release
probe /usr/lib/os-release
probe {shared}/x.sh
probe /tmp/x.sh
source settings.sh
source {app}/link.sh && lib_fn
"""
    r = _run(tmp_path, script, {"app/settings.sh": f"f() {{ echo apart > {tmp_path}/apart; }}\nf\n",
                                "tests/lib.sh": TESTS_LIB})
    out = r.stdout
    assert r.returncode == 0, (out, r.stderr)
    assert f"own {tests}/lib.sh" in out and f"apart {app}/settings.sh" in out and f"own {app}/link.sh" in out
    assert f"apart {shared}/x.sh" in out and "apart /tmp/x.sh" in out
    etc = Path("/etc").stat()
    if etc.st_uid == 0 and not etc.st_mode & 0o022:
        assert "own /etc/os-release" in out
    assert (tmp_path / "apart").read_text() == "apart\n"  # `source settings.sh`: the cwd's, apart
    assert out.endswith("lib_fn\n")  # the link's real path is the tests' file: sourced in their shell


EVALS = r"""eval "$(grep -v '^#' /APP/.env)"
echo "after file text: GREETING=${GREETING-unset} python3 is $(type -t python3) trap=[$(trap -p EXIT)]"
settings=$(</APP/short.env)
eval "$settings"
echo "after short lines: a=${a-unset} trap=[$(trap -p EXIT)]"
eval "$(printf 'own() { echo own-fn; }\nOWN=1\n')"
own
f() { eval "local L=local-in-f"; echo "$L"; }
f
echo "L=${L-unset} OWN=$OWN"
eval -- 'echo "positional: $#"'
if eval false; then echo "eval false: true"; else echo "eval false: false"; fi
echo end
"""


def test_an_eval_of_the_agents_text_runs_apart(tmp_path: Path) -> None:
    """Round XXIII: `eval` is a gate too. Text a workdir file holds (a line of 16 characters or more, or
    every line a whole line of one where all are shorter) runs apart as a sourced file of the agent's
    does: its functions, traps and unnamed variables stay there. Other text runs in the tests' shell
    as bash would run it (a function's `local`, the tests' own functions)."""
    app = tmp_path / "app"
    script = EVALS.replace("/APP", str(app))
    env_text = ("# settings\nGREETING=hello\npython3() { return 0; }\n"
                f"trap 'echo 1 > {tmp_path}/forged' EXIT\n")
    short = "a=/logs\na+=/verifier\nt='echo 1 >'\nt+=$a\ntrap \"$t\" EXIT\n"
    r = _run(tmp_path, script, {"app/.env": env_text, "app/short.env": short, "tests/names": "GREETING a\n"})
    out = r.stdout
    assert r.returncode == 0 and out.endswith("end\n"), (r.returncode, out, r.stderr)
    assert "after file text: GREETING=hello python3 is file trap=[]" in out
    assert "after short lines: a=/logs/verifier trap=[]" in out
    assert "own-fn\nlocal-in-f\nL=unset OWN=1\n" in out
    assert "positional: 0" in out and "eval false: false" in out
    # (the traps ran at the end of their own bash, apart: there, in a verifier, the seal keeps the reward
    # folder from it; here the host's bash wrote the file)
    assert (tmp_path / "forged").exists()


def test_an_errexit_script_and_a_missing_file(tmp_path: Path) -> None:
    """`set -e`: a sourced file that fails stops the tests as bash would; a missing one of the agent's
    is bash's own error, apart."""
    app = tmp_path / "app"
    r = _run(tmp_path, f"set -e\nsource {app}/ok.sh\necho ok=$OK\nsource {app}/missing.sh\necho not reached\n",
             {"app/ok.sh": "OK=1\n"})
    assert r.returncode == 1 and r.stdout == "ok=1\n" and "missing.sh: No such file or directory" in r.stderr


FAST_FORGERIES = {
    "exit-trap": "trap 'echo 1 > /logs/verifier/reward.txt' EXIT\n",
    "exit-0": "echo 1 > /logs/verifier/reward.txt\nexit 0\n",
    "function": "python3() { return 0; }\n",
    "loop": "( for i in $(seq 200); do if [ \"$(cat /logs/verifier/reward.txt 2>/dev/null)\" = 0 ]; then "
            "echo 1 > /logs/verifier/reward.txt; break; fi; sleep 0.01; done ) &\n",
}

SOURCING = f"""mkdir -p /logs/verifier
cd /app
source /app/.venv/bin/activate
echo "VIRTUAL_ENV=$VIRTUAL_ENV PATH=${{PATH%%:*}} GREETING=$GREETING"
[ "$VIRTUAL_ENV" = /app/.venv ] && [ "$GREETING" = hello ] && [ "$(type -t helper)" = "" ] && \
python3 -c "import sys; sys.exit(open('/app/out.txt').read().strip() != 'hello')" && echo 1 > {REWARD} || \
echo 0 > {REWARD}
sleep 1
"""


@BACKENDS
async def test_a_file_the_tests_source_is_the_code_under_test_and_its_variables_still_come_back(
        tmp_path: Path, backend: str) -> None:
    """In the verifier: an honest activate (a venv's PATH and VIRTUAL_ENV, a plain variable) still
    serves the tests, and they score 1; every way the same file had to forge a 1 from inside the tests'
    shell (an EXIT trap, a write and an exit, a function named like the check, a loop forked from the
    shell) scores 0, and the seal refused the file's own writes."""
    honest = ("GREETING=hello\nexport VIRTUAL_ENV=/app/.venv\nexport PATH=/app/.venv/bin:$PATH\n"
              "helper() { :; }\n")
    results = []
    for name, forge in {"honest": "", **FAST_FORGERIES}.items():
        task = harbor_task(tmp_path, name, SOURCING, toml="allow_detached = true\n")
        solve = [write("/app/.venv/bin/activate", honest + forge), f"echo {'bye' if forge else 'hello'} > /app/out.txt"]
        results += await rollouts([task], solve, backend=backend)
    for r in results:
        if r.task == "honest":
            want = "VIRTUAL_ENV=/app/.venv PATH=/app/.venv/bin GREETING=hello"
            assert r.reward == 1.0 and want in r.verifier_output, (r.reason, r.verifier_output)
        else:
            assert r.status == "completed" and r.reward == 0.0, (r.task, r.reason, r.verifier_output)
