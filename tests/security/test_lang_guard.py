"""The tests' Node.js and Perl guards (round XXIII, docs/security.md "Graders in other languages"): a
grader that loads the agent's code in its own process keeps its exit status the tests' own.

These run each guard in the host's own interpreter (no sandbox: the quick tier), as the verifier writes
it and names it in the tests' environment, with a workdir and a tests' folder of their own outside the
shared temporary folders (whose files are the agent's to the guards); the rows of
tests/fixtures/attacks-xxiii run them where it matters (test_attack_fixtures.py, scripts/attack-table.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_reward_integrity_iii import BACKENDS, harbor_task, rollouts

from sandfleet.rollout.langguard import NODE_GUARD, NODE_GUARD_NAME, PERL_GUARD, PERL_GUARD_NAME, lang_env


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder outside /tmp (a shared temporary folder's files are the agent's to the guards)."""
    d = Path(tempfile.mkdtemp(prefix="sandfleet-langguard-", dir=Path.home()))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _run(place: Path, argv: list[str], files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run from the workdir with the guards as the verifier sets them; ``files`` written first
    (app/... the workdir's, tests/... the tests')."""
    guard = place / "py"
    guard.mkdir(exist_ok=True)
    (guard / NODE_GUARD_NAME).write_text(NODE_GUARD)
    (guard / PERL_GUARD_NAME).write_text(PERL_GUARD)
    for d in ("app", "tests"):
        (place / d).mkdir(exist_ok=True)
    for rel, text in files.items():
        (place / rel).write_text(text)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(place),
           "SANDFLEET_UNTRUSTED": str(place / "app"), "SANDFLEET_TESTS_DIRS": str(place / "tests")}
    env.update(lang_env({"PERL5OPT": "-w"}, str(guard)))
    return subprocess.run([a.replace("@", str(place)) for a in argv], cwd=place / "app", env=env,
                          capture_output=True, text=True, timeout=60)


NODE_BY_EXIT = "const s = require('@/app/solution.js');\nprocess.exit(s.greet() === 'hello' ? 0 : 1);\n"
NODE_BY_ASSERT = ("const assert = require('assert');\nconst s = require('@/app/solution.js');\n"
                  "assert.strictEqual(s.greet(), 'hello');\n")
NODE_CASES = {
    # (check, solution, the tests' status is 0): an honest answer passes, a wrong one fails
    "honest-exit": (NODE_BY_EXIT, "exports.greet = () => 'hello';\n", True),
    "honest-assert": (NODE_BY_ASSERT, "exports.greet = () => 'hello';\n", True),
    "wrong-answer": (NODE_BY_EXIT, "exports.greet = () => 'bye';\n", False),
    # the forgeries: each ended the grader with 0 before the guard
    "exit0-in-call": (NODE_BY_EXIT, "exports.greet = () => process.exit(0);\n", False),
    "exit0-from-a-string": (NODE_BY_EXIT, "exports.greet = new Function('process.exit(0)');\n", False),
    "reallyExit-at-load": (NODE_BY_EXIT, "process.reallyExit(0);\n", False),
    "timer-exit0": (NODE_BY_ASSERT, "exports.greet = () => { setTimeout(process.exit, 0, 0); return 'bye'; };\n",
                    False),
    "assert-replaced": (NODE_BY_ASSERT, "require('assert').strictEqual = () => {};\nexports.greet = () => 'bye';\n",
                        False),
    "exit-handler-zero": (NODE_BY_ASSERT, "process.on('exit', () => { process.exitCode = 0; });\n"
                                          "exports.greet = () => 'bye';\n", False),
    "uncaught-swallowed": (NODE_BY_ASSERT, "process.on('uncaughtException', () => {});\n"
                                           "exports.greet = () => 'bye';\n", False),
}


@pytest.mark.skipif(not shutil.which("node"), reason="no node on this host")
def test_the_node_guard_leaves_the_agents_own_programs_and_the_tests_libraries_alone(place: Path) -> None:
    """A program of the workdir ends as it likes; a library that wraps process.emit and process.exit
    (signal-exit's way) still works under the guard, and the tests' own exit(0) stays 0."""
    r = _run(place, ["node", "@/app/own.js"], {"app/own.js": "process.exitCode = 3;\nprocess.exit(0);\n"})
    assert r.returncode == 0, r.stderr
    wrapper = ("const emit = process.emit;\nprocess.emit = function (ev) { if (ev === 'exit') console.log('wrapped');\n"
               "  return emit.apply(this, arguments); };\nconst exit = process.exit;\n"
               "process.exit = function (c) { console.log('exit', c); return exit.call(process, c); };\n")
    r = _run(place, ["node", "@/tests/check.js"],
             {"tests/lib.js": wrapper, "tests/check.js": f"require('{place}/tests/lib.js');\nprocess.exit(0);\n"})
    assert r.returncode == 0 and r.stdout.split() == ["exit", "0", "wrapped"], (r.stdout, r.stderr)


@pytest.mark.skipif(not (shutil.which("node") and shutil.which("npm")), reason="no node and npm on this host")
def test_the_systems_node_tools_keep_their_own_status(place: Path) -> None:
    """npm ends by process.exit from a callback of its own (no frame of the tests' files on the stack, only
    the system's): under the guard `npm --version` and a passing `npm test` still exit 0, a failing one
    its own status (found when the first draw counted only the tests' files as theirs)."""
    r = _run(place, ["npm", "--version"], {})
    assert r.returncode == 0, r.stderr
    for script, ok in (("process.exit(0)", True), ("process.exit(3)", False)):
        pkg = json.dumps({"name": "t", "version": "1.0.0", "scripts": {"test": f'node -e "{script}"'}})
        r = _run(place, ["npm", "test", "--prefix", "@/tests"], {"tests/package.json": pkg})
        assert (r.returncode == 0) == ok, (script, r.returncode, r.stdout[-500:], r.stderr[-1500:])


@pytest.mark.skipif(not shutil.which("node"), reason="no node on this host")
def test_a_status_set_back_to_0_after_the_graders_last_line(place: Path) -> None:
    """Where process.exitCode is a plain property (Node.js before 20, Debian bookworm's 18), a callback of
    the agent's can't set the grader's failed status back to 0; Node.js 20 made it an accessor that can't be
    redefined (round XXIII's node-exitcode-reset: its named residual there)."""
    probe = subprocess.run(["node", "-e", "process.stdout.write(String("
                            "Object.getOwnPropertyDescriptor(process, 'exitCode').configurable))"],
                           capture_output=True, text=True, timeout=60)
    if probe.stdout != "true":
        pytest.skip(f"this host's node ({probe.stdout or probe.stderr[-200:]}): exitCode not configurable")
    r = _run(place, ["node", "@/tests/check.js"],
             {"tests/check.js": f"const s = require('{place}/app/solution.js');\n"
                                "if (s.greet() !== 'hello') process.exitCode = 1;\n",
              "app/solution.js": "setImmediate(() => { process.exitCode = 0; });\nexports.greet = () => 'bye';\n"})
    assert r.returncode == 1 and "back to 0" in r.stderr, (r.returncode, r.stderr)


PERL_BY_EXIT = 'use strict;\nuse warnings;\nrequire "@/app/solution.pl";\nexit(greet() eq "hello" ? 0 : 1);\n'
PERL_BY_DIE = ('use strict;\nuse warnings;\nrequire "@/app/solution.pl";\n'
               'die "wrong answer\\n" unless greet() eq "hello";\n')
PERL_CASES = {
    "honest-exit": (PERL_BY_EXIT, 'sub greet { "hello" }\n1;\n', True),
    "honest-die": (PERL_BY_DIE, 'sub greet { "hello" }\n1;\n', True),
    "wrong-answer": (PERL_BY_EXIT, 'sub greet { "bye" }\n1;\n', False),
    "exit0-in-call": (PERL_BY_EXIT, "sub greet { exit 0 }\n1;\n", False),
    "exit0-in-string-eval": (PERL_BY_EXIT, "sub greet { eval q{exit 0} }\n1;\n", False),
    "end-block-zero": (PERL_BY_DIE, "END { $? = 0 }\nsub greet { 'bye' }\n1;\n", False),
    "end-block-after-error": (PERL_BY_EXIT, "END { $? = 0 }\nsub greet { my $x; $x->m }\n1;\n", False),
}


GRADERS = {"node": ("js", NODE_CASES), "perl": ("pl", PERL_CASES)}


@pytest.mark.parametrize(("lang", "case"), [
    pytest.param(lang, case, marks=pytest.mark.skipif(not shutil.which(lang), reason=f"no {lang} on this host"))
    for lang, (_, cases) in GRADERS.items() for case in sorted(cases)])
def test_a_graders_status_is_the_tests(place: Path, lang: str, case: str) -> None:
    """A grader that loads the agent's file and decides by its status: (check, solution, the tests'
    status is 0) for each case of the language."""
    ext, cases = GRADERS[lang]
    check, solution, passes = cases[case]
    r = _run(place, [lang, f"@/tests/check.{ext}"], {f"tests/check.{ext}": check.replace("@", str(place)),
                                                      f"app/solution.{ext}": solution})
    assert (r.returncode == 0) == passes, (lang, case, r.returncode, r.stderr[-2000:])
    if lang == "perl":
        assert "Useless use" not in r.stderr and "redefined" not in r.stderr, r.stderr  # quiet under -w


@pytest.mark.skipif(not shutil.which("perl"), reason="no perl on this host")
def test_the_perl_guard_leaves_the_agents_own_programs_and_the_tests_one_liners_alone(place: Path) -> None:
    r = _run(place, ["perl", "@/app/own.pl"], {"app/own.pl": "END { $? = 0 }\ndie 'own';\n"})
    assert r.returncode == 0, r.stderr  # the workdir's program: its END is its own business
    r = _run(place, ["perl", "-e", 'require "@/app/solution.pl"; exit(greet() eq "hello" ? 0 : 1)'],
             {"app/solution.pl": 'sub greet { "hello" }\n1;\n'})
    assert r.returncode == 0, r.stderr
    r = _run(place, ["perl", "-e", "eval { die 'caught' }; exit 0"], {})
    assert r.returncode == 0, r.stderr  # a die inside eval is no failure


def test_the_guards_come_before_what_the_image_set() -> None:
    env = lang_env({"NODE_OPTIONS": "--max-old-space-size=512", "PERL5OPT": "-w"}, "/g/")
    assert env == {"NODE_OPTIONS": "--require /g/sandfleet-node.js --max-old-space-size=512",
                   "PERL5OPT": "-I/g -Msandfleet_guard -w"}


# -- in the verifier: what an honest solution does with the same shapes still scores 1

VENV_TESTS = """mkdir -p /logs/verifier
cd /app
python3 -m venv --without-pip /app/.testenv
. /app/.testenv/bin/activate
[ "$VIRTUAL_ENV" = /app/.testenv ] && python3 /tests/@ && echo 1 > /logs/verifier/reward.txt || \\
echo 0 > /logs/verifier/reward.txt
"""
PERL_TESTS = ("mkdir -p /logs/verifier\ncd /app\nperl /tests/@ && echo 1 > /logs/verifier/reward.txt || "
              "echo 0 > /logs/verifier/reward.txt\n")
CHECK_PY = ("import sys\nimport helper  # the agent's package, on the venv's path by its .pth\n"
            "sys.exit(0 if helper.GREETING == open('/app/out.txt').read().strip() == 'hello' else 1)\n")
HONEST = [
    # the agent's venv in the workdir, which the tests' `python3 -m venv` keeps: a .pth that names a folder and
    # one that runs an import line (an editable install's way), and a program of the agent's that exits 0
    "python3 -m venv --without-pip /app/.testenv",
    "site=$(/app/.testenv/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])') && "
    "mkdir -p /app/src && echo /app/src > \"$site/app_src.pth\" && "
    "echo 'import sys; sys.flags' > \"$site/zz_editable_hook.pth\"",
    "echo \"GREETING = 'hello'\" > /app/src/helper.py && echo hello > /app/out.txt",
    "printf 'import sys\\nsys.exit(0)\\n' > /app/prog.py",
    "printf 'sub greet { \"hello\" }\\nEND { 1 }\\n1;\\n' > /app/solution.pl",
    "printf \"process.on('exit', () => {});\\nexports.greet = () => 'hello';\\n\" > /app/solution.js",
]
NODE_TESTS = PERL_TESTS.replace("perl", "node")


@BACKENDS
async def test_honest_solutions_in_a_venv_and_a_perl_grader_still_score_one(tmp_path: Path, backend: str) -> None:
    """The agent's venv in the workdir (its .pth files run as the tests' Python starts: the seal arms it until
    the guard loads, and the guard then judges the rest as a grader's), the agent's own program run from it,
    and Perl and Node.js graders that load the agent's file and decide by their status (the module's own
    'exit' handler too): each scores 1."""
    tasks = [harbor_task(tmp_path, "venv-check", VENV_TESTS.replace("@", "check.py"), tests={"check.py": CHECK_PY}),
             harbor_task(tmp_path, "venv-own-program", VENV_TESTS.replace("/tests/@", "/app/prog.py")),
             harbor_task(tmp_path, "perl-exit", PERL_TESTS.replace("@", "check.pl"),
                         tests={"check.pl": PERL_BY_EXIT.replace("@", "")}),
             harbor_task(tmp_path, "perl-die", PERL_TESTS.replace("@", "check.pl"),
                         tests={"check.pl": PERL_BY_DIE.replace("@", "")})]
    if shutil.which("node"):  # (the host's image: its node, in the sandbox)
        tasks += [harbor_task(tmp_path, "node-exit", NODE_TESTS.replace("@", "check.js"),
                              tests={"check.js": NODE_BY_EXIT.replace("@", "")}),
                  harbor_task(tmp_path, "node-assert", NODE_TESTS.replace("@", "check.js"),
                              tests={"check.js": NODE_BY_ASSERT.replace("@", "")})]
    for r in await rollouts(tasks, HONEST, backend=backend):
        assert r.status == "completed" and r.reward == 1.0, (r.task, r.reason, r.verifier_output)
