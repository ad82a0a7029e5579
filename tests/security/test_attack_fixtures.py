"""The attack fixtures of every round (scripts/make-attacks-iii.py, tests/fixtures/attacks-*), run
as the oracle agent replays each solve.sh, on each backend: every attack a mechanism holds scores 0
and is never masked (docs/security.md, "Attacks of our own: the tables"). A module of their own
(from test_reward_integrity_iii.py): their slow rows are a quarter of the slow pass, and a module
goes to one worker whole (--dist loadfile)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_reward_integrity_iii import GVISOR  # the same gvisor row

from sandfleet.rollout import OraclePolicy, RunConfig, run_suite
from sandfleet.rollout.runner import RetryPolicy
from sandfleet.rollout.verifier import AGENT_MODULE_RISK, AGENT_PROGRAM_RISK
from test_rollout_support import needs_bwrap

pytestmark = needs_bwrap()


# -- the attack fixtures of rounds III to XI (scripts/make-attacks-iii.py), each backend

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GAPS: dict[str, set[str]] = {"gvisor": {"tests-plant-pth-root"}}
"""Forged where the mechanism is missing (docs/security.md): with gVisor's uid split (the default), only a task
whose tests run as root there (no Landlock, and no user to split the code under test to: the row flagged).
Without the split (SANDFLEET_SEAL_UID=0) every attack that Landlock holds forges on gVisor, flagged on each
row."""
MICROVM = pytest.param("microvm", marks=[pytest.mark.slow, pytest.mark.skipif(
    not shutil.which("qemu-system-x86_64"), reason="QEMU not installed")])


STOP76 = frozenset({"runtime-module-report-patch", "runtime-exec-forged-name", "runtime-pyc-report-patch",
                    "marshal-blob-direct", "runtime-loader-forged-cache", "runner-callable-object",
                    "runner-class-replaced"})
"""Stop 76's rows: the Python guard's judgment inside the tests' process, the same code on every backend (bwrap
only here; `scripts/attack-table.py --tasks tests/fixtures/attacks-stop76` runs them everywhere)."""
STOP77 = frozenset({"runner-code-swapped", "runner-partial-padded", "runner-metaclass-call",
                    "hookimpl-function-swapped", "hookexec-replaced", "report-class-assigned",
                    "runner-closure-cell-swapped", "hookcaller-replaced", "hookexec-compiled-string",
                    "builtins-hasattr-swapped", "hookexec-before-manager", "hookimpl-plugin-swapped"})
"""Stop 77's rows: the runner's machinery changed in place inside the tests' process, the Python guard's judgment
again (bwrap only here, as stop 76's; report-outcome-traced, the tests' own data, is in the fixtures and the table
only)."""

STOP78 = frozenset({"root-ini-collect-only", "root-pyproject-co", "root-setupcfg-help", "root-ini-conftest",
                    "root-ini-link-workdir", "root-conftest-rootdir", "code-skips-test", "code-xfails-test",
                    "code-eq-skips", "code-import-skip-module", "code-exit-zero", "code-collect-skip",
                    "code-future-reraise", "code-partial-skip-slot", "code-mock-side-effect", "code-linecache-forged",
                    "code-xfail-marker-added", "code-unregisters-judge", "code-drops-judge-impl",
                    "code-property-exit-line"})
"""Stop 78's rows: what configures the runner (a root agent's ini file or conftest at /) and who raised a test's
outcome (a skip, xfail or exit through the code under test's frame, or from a line of the tests' that names none; an
xfail marker that came as the test ran), the Python guard's judgment (bwrap only here, as stops 76 and 77)."""


MICROVM_SAME = frozenset({
    # links and files the preparation removes or overrides (prepare.c, the guest agent's own on every backend)
    "git-textconv", "junit-rewrite", "symlink-into-reward", "answer-key-link", "answer-key-link-chain",
    "answer-key-climb", "tmp-symlink-redirect",
    # the tools' config the verifier's environment overrides (git's, curl's, bash's, Python's user site)
    "git-filter-after-decision", "git-home-attributes", "curlrc-redirect", "tests-arg-curlrc", "bash-env-home",
    "user-site-pth", "guard-on-pythonpath",
    # which process is the tests' own (the seal line): one way of starting the server is kept on microvm
    # (module-server, cleanup-after-decision), the others differ only in how it is started
    "dash-c-server", "launcher-script", "runpy-server", "pythonpath-server", "tests-cwd-server",
    "stale-junit-in-tmp", "tool-from-sealed", "fresh-env-oneliner", "cwd-in-rewards",
    # the image's make and awk, the names the preparation prints back
    "make-recipe-rewrites-tests", "awk-program-file", "note-newline-module", "note-newline-conftest",
    # the seal's list of plain tools (round XX; valgrind under TCG alone takes minutes)
    "sqlite-dot-shell", "sqlite-db-arg", "valgrind-client", "dc-bang", "m4-esyscmd", "tar-wildcard-options",
    "yaml-apply-system", "yaml-apply-decoded", "tests-helper-shadow", "sqlite-clean-env",
    # the seal's programs given a program and one-liners from the workdir, the guard's compiled strings
    # (round XXI; valgrind and gcc under TCG take minutes)
    "valgrind-tests-supp", "ldso-by-hand", "bash-c-cat", "python-c-line", "sympify-exit0", "sympify-watcher",
    "jinja-template-ssti", "sympify-program-output", "ctypes-lib-watcher", "ctypes-lib-exit0",
    "harness-linked-watcher", "shlex-argv-nospace", "ctypes-lib-libc-handle", "ctypes-lib-undumpable",
    # the tests' shell guard, the same bash text everywhere (round XXII; tests-pythonpath runs there: the seal's
    # guard-first on the microVM's own kernel and libc; its mark holds there in the rows of round XXI)
    "exit-trap-in-env", "activate-exit0", "bash-c-source", "env-background-rewrite", "env-function-shadow",
    "exported-function-grader", "settings-pythonpath", "source-process-subst", "tests-lib-loads-settings",
    "settings-pytest-plugins", "settings-read-answer",
    # the seal's arming and the guards' text, the same everywhere (round XXIII: 10/4/0 on microvm in both modes
    # in its table, the four forged rows the named residuals)
    "venv-pth-exit0", "venv-pth-sysexit", "venv-pth-open-swap", "perl-require-exit0", "perl-end-status",
    "perl-posix-exit0", "eval-function-shadow", "eval-short-lines",
    # the seal's times against the preparation's (round XXIV; pip installs under TCG take minutes: the table
    # runs them on microvm)
    "venv-runner-script", "venv-runner-module", "venv-pip-conf-wheel", "tmp-venv-runner", "tests-venv-exit0",
    "tests-venv-m-exit0", "tb1-tests-venv-summary",
    # the seal's interpreter rule (round XXV; the same pip installs)
    "venv-python-script", "venv-python-true-link", "venv-runner-by-path", "venv-dependency-planted",
    "venv-runner-oneliner",
    # the record of the image's venvs (round XXVI): the record's clock and a microVM's change times run in
    # image-venv-script; the rest is the same preparation and seal
    "image-venv-module", "image-venv-internal", "image-venv-pyc", "image-venv-remade", "image-venv-cfg-gone",
    "image-venv-bin-link", "image-venv-pth-exit0", "venv-pth-guard-loaded", "image-venv-home",
    "image-venv-activate-path", "image-venv-entry-point", "image-venv-pip-conf", "image-venv-sourceless",
    # a root agent's programs in the image's system folders (stop 74): the seal's rule is the same code everywhere
    # (the attack table runs them on microvm: contained)
    "path-eacces-decoy", "root-elf-first-on-path", "root-exempt-timeout", "root-link-target-rewritten",
    # (the preparation's confinement and the seal's stdin are its native code's, the script's refusal the host's;
    # gcc -static under TCG took 20 s: the attack table runs them there, issue 43)
    "prep-probe-static-true", "prep-drains-seal", "prep-forced-to-script", "prep-fork-chain",
    # a root agent's files outside the system's program folders (stop 75): the seal's change times and the Python
    # guard's reads, the same code everywhere (the attack table runs them on microvm)
    "root-stdlib-module", "root-system-pth", "root-image-sitecustomize", "root-user-site", "root-forged-pyc",
    "root-pytest-plugin", "root-pytest-patched", "root-ld-preload", "tests-plant-pth-root", "root-tmp-sitecustomize",
    "tests-plant-sitecustomize-root", *STOP76, *STOP77, *STOP78,
})
"""The rows whose mechanism is the same code on every backend (the guest agent's preparation, the
verifier's environment, the seal line): on bwrap and gVisor only. A microVM differs in its own
kernel (the stop, pidfd, ptrace, /proc, core_pattern, kernel threads), in every command being root
and in its channel to the host: those rows (35 of 72) run there. All 62 took 139-186 s of the
slow pass under TCG (issue 43); `scripts/attack-table.py --backends microvm` runs every one."""


GVISOR_SAME = frozenset({
    # the tools' config the verifier's environment overrides (git's, curl's, bash's, Python's user site): variables
    # set by the same code on every backend, no path of gVisor's own (its uid split, its kernel, prepare.c's walk)
    "git-filter-after-decision", "git-home-attributes", "curlrc-redirect", "tests-arg-curlrc", "bash-env-home",
    "user-site-pth", "guard-on-pythonpath",
    # which program or text is the code under test: the seal's and the guards' judgment, the same code on every
    # backend. What follows a judgment is gVisor's own (no Landlock: the program a user of its own, the uid
    # split), and the rows kept there run it for each round's kind: a plain tool and a loader's tag (XX:
    # sqlite-dot-shell, valgrind-client, yaml-apply-system), a program given a program, a one-liner, a string
    # compiled at run time, the agent's library and libc asked through it (XXI: valgrind-tests-supp,
    # python-c-line, sympify-exit0, jinja-template-ssti, ctypes-lib-exit0, harness-linked-watcher,
    # ctypes-lib-libc-handle), a file the tests' shell sources and its background writer (XXII: activate-exit0,
    # env-background-rewrite, settings-read-answer, tests-pythonpath)
    "sqlite-db-arg", "dc-bang", "m4-esyscmd", "tar-wildcard-options", "yaml-apply-decoded", "tests-helper-shadow",
    "sqlite-clean-env",
    "bash-c-cat", "sympify-watcher", "sympify-program-output", "ctypes-lib-watcher", "shlex-argv-nospace",
    "ctypes-lib-undumpable", "ldso-by-hand",
    "bash-c-source", "env-function-shadow", "exported-function-grader", "settings-pythonpath", "source-process-subst",
    "tests-lib-loads-settings", "settings-pytest-plugins",
    # round XXIV's rows that gVisor runs the same way as bwrap (pip under ptrace: 10 s each), and round XXV's but
    # its first (the seal's interpreter rule, the same code; venv-python-script runs it there)
    "venv-runner-script", "tmp-venv-runner", "tests-venv-m-exit0", "tb1-tests-venv-summary",
    "venv-python-true-link", "venv-runner-by-path", "venv-dependency-planted", "venv-runner-oneliner",
    # round XXVI's but its first (gVisor's clock and change times against the record: image-venv-script)
    "image-venv-module", "image-venv-internal", "image-venv-pyc", "image-venv-remade", "image-venv-cfg-gone",
    "image-venv-bin-link", "image-venv-pth-exit0", "image-venv-pth-guard-loaded", "image-venv-home",
    "image-venv-activate-path", "image-venv-entry-point", "image-venv-pip-conf", "image-venv-sourceless",
    # stop 74's but prep-probe-static-true (no Landlock there: the reaping alone)
    "path-eacces-decoy", "root-elf-first-on-path", "root-exempt-timeout", "root-link-target-rewritten",
    "prep-forced-to-script", "prep-drains-seal",
    # stop 75's but the seal's own rows (a .pth's imports deferred, a library of the agent's kept from the reward
    # folders without Landlock): the Python guard's reads, the same code
    "root-stdlib-module", "root-image-sitecustomize", "root-user-site", "root-forged-pyc", "root-pytest-plugin",
    "root-pytest-patched", "tests-plant-pth", "root-tmp-sitecustomize", "tests-plant-sitecustomize",
    "tests-plant-sitecustomize-root", *STOP76, *STOP77, *STOP78,
})
"""The rows that run on bwrap (and microVMs, outside MICROVM_SAME) but not on gVisor, where nothing in their
mechanism differs there (the seal's times on gVisor, a birth time of 0, run in round XXIV's other rows). The
gVisor row took 141-180 s of the slow pass with all of them (issue 43); `scripts/attack-table.py --backends
gvisor` runs every one."""


@pytest.mark.parametrize("backend", ["bwrap", GVISOR, MICROVM])
async def test_the_attack_fixtures_score_zero(backend: str) -> None:
    """Every attack task of rounds III to XXVII that a mechanism holds (its solve.sh the attack,
    replayed by the oracle agent) scores 0 and is never masked: the table of docs/security.md, as
    a test (round V's and VI's forged rows are the line's limits, named there)."""
    from sandfleet.tasks import load_tasks

    names = {"iii": ["git-textconv", "inotify-overwrite", "junit-rewrite", "pidfd-grader", "symlink-into-reward"],
             "iv": ["last-moment-orphan", "server-sigterm", "static-server-sigterm", "subreaper-shield",
                    "kill-test-script"],
             # round V: code under test that the line of the seal used to call the tests' own (a
             # module, a one-liner's import, runpy, a launcher outside the system's folders, a
             # cleanup script of the workdir after the decision)
             "v": ["module-server", "dash-c-server", "launcher-script", "runpy-server", "cleanup-after-decision",
                   "pythonpath-server", "tests-cwd-server", "stale-junit-in-tmp",
                   "exit-trap-in-env"],  # (test.sh sources the workdir's .env: forged until round XXII's guard)
             # round VI: test.sh's background job racing the warden's stop at its end, the parent-death
             # signal, the reward folder swapped under its path, a system tool or a fresh environment
             # started by the code under test, the reward folder as its cwd
             "vi": ["parent-death-race", "pdeathsig-writer", "swap-reward-folder", "tool-from-sealed",
                    "fresh-env-oneliner", "cwd-in-rewards"],
             # round VII: config the code under test writes while the tests run (the repository's, the
             # tests' HOME), read by the tests' git and curl after their decision, also by a solution
             # that the tests hand a path of theirs; a static program of the workdir that a grader
             # starts by posix_spawn
             "vii": ["git-filter-after-decision", "git-home-attributes", "curlrc-redirect", "posix-spawn-static",
                     "posix-spawn-static-kill", "tests-arg-curlrc", "tmp-symlink-redirect"],
             # round X: the image's make and awk given the agent's Makefile and program file
             "x": ["make-recipe-rewrites-tests", "awk-program-file"],
             # round XI: the verifier's preparation: a newline in a name it prints back, its binary and
             # the shell (root's where the agent is a user), the script behind it after a deep walk
             # (microvm runs every command as root: the image is the agent's to change in shared mode,
             # bash too; the guest agent's helpers run from its own image, never the file at its path)
             "xi": ["note-newline-module", "note-newline-conftest", "deep-workdir-planted", "guard-on-pythonpath",
                    "fake-guest-agent"] + (["replace-bash"] if backend != "microvm" else []),
             # round XII: the guest agent's own stream to the host (its descriptors through /proc,
             # pidfd_getfd, ptrace; as the agent user and as root), flooded with forged replies
             # (tests/security/test_agent_channel.py checks the descriptors themselves)
             "xii": ["channel-proc-fd", "channel-pidfd-getfd", "channel-ptrace", "channel-proc-fd-root"],
             # round XIII: a daemon a root agent leaves under a uid of its own with root's capabilities (it
             # kills the verifier's list of the uids left, stops its steps before their exec, or every new
             # process), and the agent's own daemon stopping its commands before their exec
             "xiii": ["cap-daemon-uid-list", "cap-daemon-stop-before-exec", "cap-daemon-stop-all",
                      "stop-before-exec-user"],
             # round XIV: the host's process spawner hunted from inside (every socket descriptor it can
             # see, through pidfd_getfd, and every unix socket of /proc/net/unix), as the agent and as root
             "xiv": ["spawner-hunt", "spawner-hunt-root"],
             # round XV: the stop's end (a microVM's stop passes over the kernel's threads and ends when
             # nothing is left): a daemon dressed as a kernel thread, a helper the kernel starts for each
             # core dump (where core_pattern is the agent's: a microVM), a fork chain racing the scan
             "xv": ["kthread-disguise", "core-pattern-helper", "fork-chain", "fork-chain-root"],
             # round XVI: what the agent leaves for the verifier's own tools: a conftest planted in the tests'
             # folder by a root agent before the upload, a .pth in the agent's user site, the reward folder under
             # a read-only mount (inode-flood, a verifier_setup_failed 0, is in the fixtures and the table only)
             "xvi": ["tests-preplant-root", "user-site-pth", "reward-folder-ro-mount"],
             "xvii": ["answer-key-link", "answer-key-link-chain", "answer-key-proc-cwd", "bash-env-home"]
             + (["ld-library-path-image"] if backend != "microvm" else []),  # (gcc under TCG: 20 s)
             # round XVIII: a link whose way enters the reward folder through another link of the agent's and
             # climbs out to the tests' answer, the tests' bash patched through /proc/PID/mem by the code it
             # runs, a set-user-ID root program with file capabilities (link-flood, git-config-fifo and
             # output-flood are in the fixtures and the table only: each takes 10-40 s; ld-so-preload-root is a
             # root agent's change to the image, which shared mode runs the tests over)
             "xviii": ["answer-key-climb", "parent-mem-patch", "setuid-caps-program"],
             # round XX: the workdir's code run by a system program the seal took for one that runs no code
             # (sqlite3's dot commands, valgrind's client, dc's !, m4's esyscmd) or given the agent's file
             # names as its options (tar's --checkpoint-action in a `tar *`) or started by a loader from a file's
             # text (PyYAML's os.system tag, decoded or not), in tasks that allow detached processes (the warden's
             # count off), and a tests' helper module shadowed from the workdir: the seal's list of plain tools,
             # its option rule, the guard's starts from read text, YAML's calls and the tests' modules first
             "xx": ["sqlite-dot-shell", "sqlite-db-arg", "valgrind-client", "dc-bang", "m4-esyscmd",
                    "tar-wildcard-options", "yaml-apply-system", "yaml-apply-decoded", "tests-helper-shadow",
                    "sqlite-clean-env"],
             # round XXI: a program that runs another in its own process (valgrind, ld.so by hand) given a tests'
             # path too, a one-liner whose code the tests' shell read from the workdir, the agent's text that a
             # tests' library evaluates after transforming it (sympy's sympify, a Jinja2 template), a library of
             # the agent's loaded by a tests' program (ctypes, a harness linked to it): the seal's
             # given_a_program, one_liner_from_workdir and asked_by_code, the guard's gates on strings compiled
             # at run time and on an agent's library loaded, an exit before the tests' Python finalized
             # (and the programs such a process starts, through libc's own functions too: the parent's maps,
             # the guard's mark in the environment)
             "xxi": ["valgrind-tests-supp", "ldso-by-hand", "bash-c-cat", "python-c-line", "sympify-exit0",
                     "sympify-watcher", "jinja-template-ssti", "sympify-program-output", "ctypes-lib-watcher",
                     "ctypes-lib-exit0", "harness-linked-watcher", "shlex-argv-nospace", "ctypes-lib-libc-handle",
                     "ctypes-lib-undumpable"],
             # round XXII: code the tests' shell sources from a file of the agent's (a venv's activate, the
             # workdir's settings through a process substitution, a tests' library or a bash -c of the tests)
             # and a PYTHONPATH without the Python guard: the shell guard runs such a file apart, as the code
             # under test, and takes back only its variables; the seal keeps the guard first on PYTHONPATH
             "xxii": ["activate-exit0", "bash-c-source", "env-background-rewrite", "env-function-shadow",
                      "exported-function-grader", "settings-pythonpath", "source-process-subst",
                      "tests-lib-loads-settings", "tests-pythonpath", "settings-pytest-plugins",
                      "settings-read-answer"],
             # round XXIII: the agent's code that a tests' interpreter runs at its start (a .pth of a venv the
             # tests make in the workdir) or in its process (a Perl grader that requires it), and an eval of a
             # settings file's text: the seal arms such a Python until its guard loads, the guard refuses
             # builtins the start-up code replaced, the Perl guard and the seal keep the grader's status the
             # tests', and the shell guard's eval gate runs the text apart (the Node.js rows need an image
             # with nodejs: scripts/attack-table.py and the host's node in test_lang_guard.py run them)
             "xxiii": ["venv-pth-exit0", "venv-pth-sysexit", "venv-pth-open-swap", "perl-require-exit0",
                       "perl-end-status", "perl-posix-exit0", "eval-function-shadow", "eval-short-lines"],
             # round XXIV: the tests' own venv made over a folder the agent left at its name (in the workdir, or
             # a shared /tmp): its runner (a console script, a -m package) is the agent's though pip and venv
             # seem to have written it, or a pip.conf of the folder's installs the agent's wheel: the seal's
             # sandfleet_seal_planted, by the files' change and birth times against the preparation's; and the
             # code under test inside the tests' own fresh venv's pytest (Terminal-Bench's .tbench-testing),
             # which the guard now judges as a grader's runner (venv-runner-symlink and tests-venv-rewritten
             # are residuals: the table only)
             "xxiv": ["venv-runner-script", "venv-runner-module", "venv-pip-conf-wheel", "tmp-venv-runner",
                      "tests-venv-exit0", "tests-venv-m-exit0", "tb1-tests-venv-summary"],
             # round XXV: what runs as the venv's python, in a venv the tests made over the agent's folder: a
             # bin/python that venv kept (a #! script, a link to /bin/true: the seal took any program named python
             # whose executable is not the agent's for the venv's interpreter), the venv's interpreter given the
             # agent's runner by path, and a dependency of pytest's that pip calls installed (held by round XXIV's
             # rule as written: no rule aimed at it)
             "xxv": ["venv-python-script", "venv-python-true-link", "venv-runner-by-path", "venv-dependency-planted",
                     "venv-runner-oneliner"],
             # round XXVI: the image's own venv in the workdir, whose runner the tests trust: a changed program,
             # -m module, module the runner imports, byte-compiled file, the venv made again, its pyvenv.cfg gone,
             # its bin a link (the record taken before the agent's first command: rollout/envrecord.py); and a
             # .pth's import lines, which ran before the Python guard and could end the seal's pre-arm themselves
             # (the seal keeps them until the guard, armed, runs them); its pyvenv.cfg's home, where the
             # interpreter finds its standard library, and its pip.conf, which the tests' pip reads (a Python of a
             # venv whose own files changed does not run);
             # its activate, which the tests source (the shell guard sources no file of it that changed); a
             # distribution of the agent's in it whose entry point pytest loads as a plugin (the guard's scan of
             # distributions judges their files)
             "xxvi": ["image-venv-script", "image-venv-module", "image-venv-internal", "image-venv-pyc",
                      "image-venv-remade", "image-venv-cfg-gone", "image-venv-bin-link", "image-venv-pth-exit0",
                      "image-venv-pth-guard-loaded", "venv-pth-guard-loaded", "image-venv-home",
                      "image-venv-activate-path", "image-venv-entry-point", "image-venv-pip-conf",
                      "image-venv-sourceless"],
             # round XXVII: the stop of a root agent in one request (the guest agent's KILL of USER "*"): a daemon
             # under the guest agent's own uid or one at an end of the range, a pair that forks itself again under
             # a fresh uid the moment one dies, a pid namespace of its own (each backend's pid 1 and uid map: all)
             "xxvii": ["stop-guest-uid", "stop-respawn-pair", "stop-pid-namespace"],
             # stops 73 and 74 (hand-written): a root agent's program in the image's system folders, which the
             # tests run by name -- a python3 first on PATH past a non-executable decoy (a #! script; a compiled
             # one), the file the image's python3 link leads to rewritten, a process-control tool the seal leaves
             # in its parent's domain replaced: changed after the record taken before the agent's first command,
             # each is the code under test (seal.c, agent_changed), and the row says so; and a static `true` that
             # the preparation's probe of the seal ran as root, which left a daemon writing 1 after the tests
             # (forged on microvm): the preparation's programs run confined, and nothing they leave outlives them;
             # and a workdir too deep for the guest agent's preparation, which left its steps to the script (the
             # image's programs, the agent's `find` among them, as root): not for a root agent's sandbox; and the
             # sanitizer's `find` reading the preparation's stdin, where the seal was still to come (forged on
             # every backend): their stdin is /dev/null, and a seal not whole is the preparation's failure; and a
             # fork chain the sanitizer's `find` left, which outran the reaping where there is no subreaper (gVisor:
             # it emptied the seal): there every process but pid 1 is killed at once
             "stop73": ["path-eacces-decoy"],
             "stop74": ["root-elf-first-on-path", "root-exempt-timeout", "root-link-target-rewritten",
                        "prep-probe-static-true", "prep-forced-to-script", "prep-drains-seal", "prep-fork-chain",
                        "root-stdlib-module"],
             # stop 75: a root agent's files outside the workdir and the system's program folders -- the standard
             # library's module, a .pth of site-packages, the image's sitecustomize, a cache over the image's
             # source, a pytest plugin's distribution, the runner's own module, /etc/ld.so.preload (root's user
             # site: the tests' HOME is not root's): a change time between the record and the preparation makes
             # any such file the agent's (seal.c, agent_touched; the guard's agent_file). root-pytest-main (the
             # runner the agent's from its package up: its own status, flagged) is in the table only
             "stop75": ["root-system-pth", "root-image-sitecustomize", "root-user-site", "root-forged-pyc",
                        "root-pytest-plugin", "root-pytest-patched", "root-ld-preload",
                        # and a root program of the workdir's that the tests run, which writes the image's code
                        # for their later programs (after the preparation: the tests' own, by its time): where the
                        # code under test is root (root tests; every command on a microVM), /usr and the loader's
                        # preload list are kept from it (the seal's "x:", Landlock)
                        "tests-plant-pth", "tests-plant-pth-root",
                        # written against those: a folder of /tmp put on every Python's path by the agent's .pth
                        # path line, with a sitecustomize there (the image's own removed); a program the tests run
                        # as root appending to the image's sitecustomize, Debian's in /etc (the guard: one changed
                        # since the preparation is the code under test's)
                        "root-tmp-sitecustomize", "tests-plant-sitecustomize", "tests-plant-sitecustomize-root"],
             # stop 76: the runner's function replaced by one whose file the guard trusted -- a module the code under
             # test writes as the tests run, a name given at compile time, a sourceless cache, a blob unmarshalled,
             # a loader of its own giving a cache for pytest's own source (the guard's marks for code the code under
             # test compiled, made or loaded from bytes, asked by runner_intact too); and no function at all in the
             # runner's place: a partialmethod, a class of its own (the check reads the code a value runs)
             "stop76": sorted(STOP76),
             # stop 77: the runner's machinery changed in place -- a function's code or a value its closure holds,
             # pluggy's record of a module plugin's hook, its manager's hook caller (a function compiled from a string
             # too) and its relay's, a report's class, a builtin the runner calls -- or the code's own behind what the
             # check read (600 arguments of padding, a metaclass's __call__): the audit's refusal of such changes, and
             # the end's judgment of what changed since the code loaded by the code it runs
             "stop77": sorted(STOP77),
             # stop 78: what configures the runner -- a root agent's ini file at / (--collect-only, --version; a link
             # of its own into the workdir), a conftest at / that pytest loads -- and who raised a test's outcome: a
             # skip, an xfail, a SkipTest or pytest.exit from the code under test (its frame in the traceback), at
             # collection too: the runner's own reads of a root agent's files, and the outcome's traceback
             "stop78": sorted(STOP78)}
    tasks = [t for r, wanted in names.items() for t in load_tasks(FIXTURES / f"attacks-{r}")[0]
             if t.name in wanted and t.name not in GAPS.get(backend, set())]
    assert {t.name for t in tasks} >= (MICROVM_SAME | GVISOR_SAME) - GAPS.get(backend, set())
    if backend == "microvm":
        tasks = [t for t in tasks if t.name not in MICROVM_SAME]
    if backend == "gvisor":
        tasks = [t for t in tasks if t.name not in GVISOR_SAME]
    cfg = RunConfig(backend=backend, n=1, concurrency=2, retry=RetryPolicy(max_attempts=1))
    report = await run_suite(tasks, OraclePolicy(), cfg)  # gVisor: the uid split (the default) holds the line
    assert len(report.results) == len(tasks)
    for r in report.results:
        assert r.status == "completed" and r.reward == 0.0, (backend, r.task, r.reason, r.reward, r.verifier_output)
        if r.task in names["stop73"] + names["stop74"][:-1] and r.reason != "verifier_setup_failed":
            assert any(x.startswith(AGENT_PROGRAM_RISK) for x in r.info.get("verifier_risks", [])), (backend, r.info)


async def test_a_root_agents_own_programs_still_run_for_the_tests(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The honest side of stop 74's rule: a program a root agent installs in the image's system folders, or
    pytest's console script it installed again, still runs for the tests (as the code under test: kept from the
    reward folders) and the reward is the tests' 1, the row flagged; a program the tests install themselves,
    after the preparation, is theirs (root tests), unflagged. An agent that rewrote the tests' own interpreter
    scores 0 (the grader it runs can't write the reward: the tests' programs were the agent's to break, never a
    mask), flagged. The preparation's script (where the guest agent's can't run) does the same: the record's
    time for the seal, the programs noted."""
    from sandfleet.tasks import load_task

    base = FIXTURES / "attacks-stop73" / "path-eacces-decoy"  # (its image: cached; a root agent)
    PY_DIR = "python3 -c 'import os, sys; m = __import__(sys.argv[1]); print(os.path.dirname(m.__file__))'"
    READS_JSON = ("python3 -c \"import json; open('/logs/verifier/reward.txt', 'w').write(json.dumps(int("
                  "open('/app/out.txt').read().strip() == 'hello')))\"")
    tests_file = ('printf "def test_out():\\n    assert open(\\"/app/out.txt\\").read().strip() == \\"hello\\"\\n"'
                  ' > /tmp/t_out.py')
    cases = {  # name: (before the answer, as root; the test script's line; the reward; flagged)
        "tool-installed": ('printf "#!/bin/sh\\necho hello\\n" > /usr/local/bin/greet; chmod 755 /usr/local/bin/greet',
                           '[ "$(greet)" = hello ] && python3 /tests/grade.py', 1.0, True),
        "pytest-reinstalled": ('f=$(command -v pytest); cp -p "$f" /tmp/p; cat /tmp/p > "$f"',
                               tests_file + '; if pytest -q -p no:cacheprovider /tmp/t_out.py; then echo 1; '
                               'else echo 0; fi > /logs/verifier/reward.txt', 1.0, True),
        "tests-install-tool": ("true", 'printf "#!/bin/sh\\necho hello\\n" > /usr/local/bin/greet2; chmod 755 '
                               '/usr/local/bin/greet2; [ "$(greet2)" = hello ] && python3 /tests/grade.py', 1.0, False),
        "python-rewritten": ('r=$(readlink -f "$(command -v python3)"); cp -p "$r" /tmp/py; cat /tmp/py > "$r"',
                             "python3 /tests/grade.py", 0.0, True),
        # stop 75: a root agent's Python files outside the workdir. The agent's own run of Python wrote the caches
        # of the standard library's json and encodings (loaded before the guard), which the image had none of: the
        # tests' Python reads the image's sources (json) or finds the cache the same code (encodings), 1 unflagged
        "stdlib-caches-by-agent": (f"for m in json encodings; do rm -rf $({PY_DIR} $m)/__pycache__; done; "
                                   "python3 -c 'import json'", READS_JSON, 1.0, False),
        # a module the agent installed, which the tests import: the code under test in their process, 1, flagged
        "module-installed": ("p=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); "
                             "mkdir -p $p; printf 'def hi():\\n    return \"hello\"\\n' > $p/greetlib.py",
                             "python3 -c \"import greetlib; open('/logs/verifier/reward.txt', 'w').write("
                             "'1' if greetlib.hi() == open('/app/out.txt').read().strip() else '0')\"", 1.0, True),
        # a module of the tests' runner written again by the agent (the same text): pytest's functions from it are
        # the code under test's, which replaced the runner's, and pytest exits 1: 0, flagged (the cost of the rule)
        "runner-module-rewritten": (f"f=$({PY_DIR} _pytest)/runner.py; cp -p $f /tmp/r; cat /tmp/r > $f",
                                    tests_file + "; if python3 -m pytest -q -p no:cacheprovider /tmp/t_out.py; "
                                    "then echo 1; else echo 0; fi > /logs/verifier/reward.txt", 0.0, True),
    }
    tasks = []
    for name, (before, line, _, _) in cases.items():
        folder = tmp_path / name
        shutil.copytree(base, folder)
        (folder / "solution" / "solve.sh").write_text(f"#!/bin/bash\nset -e\n{before}\necho hello > /app/out.txt\n")
        (folder / "tests" / "test.sh").write_text(f"#!/bin/bash\nmkdir -p /logs/verifier\ncd /tests && {line}\n")
        if name == "tests-install-tool":  # the tests as root (TB1's), who may write the system's folders
            toml = (folder / "task.toml").read_text()
            (folder / "task.toml").write_text(toml.replace("[verifier]\n", '[verifier]\nuser = "root"\n'))
        tasks.append(load_task(folder))
    report = await run_suite(tasks, OraclePolicy(), RunConfig(backend="bwrap", n=1, concurrency=2))
    assert len(report.results) == len(cases)
    for r in report.results:
        _, _, want, flagged = cases[r.task]
        assert r.status == "completed" and r.reward == want, (r.task, r.reason, r.verifier_output[-800:])
        risks = [x for x in r.info.get("verifier_risks", []) if x.startswith((AGENT_PROGRAM_RISK, AGENT_MODULE_RISK))]
        assert bool(risks) == flagged, (r.task, r.info)
    monkeypatch.setenv("SANDFLEET_NATIVE_HELPERS", "0")  # the script prepares
    decoy = load_task(FIXTURES / "attacks-stop73" / "path-eacces-decoy")
    report = await run_suite([tasks[0], decoy], OraclePolicy(), RunConfig(backend="bwrap", n=1, concurrency=2))
    for r in report.results:
        assert [s.get("by") for s in r.spans if s.get("what") == "clear tests and rewards"] == ["script"]
        assert r.status == "completed" and r.reward == (1.0 if r.task == "tool-installed" else 0.0), (
            r.task, r.reason, r.verifier_output[-800:])
        assert any(x.startswith(AGENT_PROGRAM_RISK) for x in r.info.get("verifier_risks", [])), (r.task, r.info)


# -- the code under test inside a tests' process (round VIII: the guard's stack, agent/seal.c's exit)

IN_PROCESS = {"v": ["in-process-exit0"], "vi": ["pickle-exit0", "grader-atexit"],
              "viii": ["atexit-copyfile", "timer-thread-copyfile", "weakref-finalize-copy", "thread-exit0",
                       "ctypes-exit0", "pickle-system", "import-systemexit", "exec-true-at-import",
                       "fork-child-ctypes-write", "ctypes-open-write", "pytest-report-patch",
                       "raise-systemexit-in-call"],
              "ix": ["systemexit-real-class", "sys-exit-swapped", "excepthook-exit0", "signal-partial-exit0",
                     "profile-reinit-exit-status", "builtins-open-swap"],
              "x": ["exec-source-text", "exec-short-exit0"]}
"""What a grader's own process runs of the workdir's (it imports the solution, or unpickles the
agent's data): every one forged before the guard watched the stack (round V's and VI's three on
every backend; round VIII's written against it; raise-systemexit-in-call until the guard judged
whose SystemExit ends the process, docs/security.md, "In the tests' process")."""
IN_PROCESS_NATIVE = {"in-process-exit0", "pickle-exit0", "ctypes-exit0", "thread-exit0", "pickle-system",
                     "exec-true-at-import", "fork-child-ctypes-write", "ctypes-open-write", "exec-source-text",
                     "exec-short-exit0"}
"""The ones held below Python (the seal's `_exit`, `system` and exec, Landlock keeping a forked child,
libc's functions kept from ctypes): on microvm (its own kernel, libc and Landlock ABI) only these;
the others are the Python guard's alone, the same code on every backend, and run on bwrap and
gVisor (all 23 on microvm took 93-118 s of the slow pass, issue 43)."""


@pytest.mark.parametrize("backend", ["bwrap", GVISOR, MICROVM])
async def test_code_under_test_inside_a_tests_process_scores_zero(backend: str) -> None:
    """The grader's process runs the code under test in itself: whatever that code does there -- an
    exit handler or a timer thread of library functions, a finalizer, os._exit or libc's _exit,
    SystemExit as it is imported, an exec of the process, a pickle that starts a shell, a child
    forked to write through libc, pytest's own functions replaced -- the reward stays the 0 the
    tests decided, and is never masked. On bwrap in both verify modes; on gVisor with its uid split
    (the default: the shell a pickle starts, the child the code forks, are the tests' user there,
    where Landlock keeps them elsewhere)."""
    from sandfleet.tasks import load_tasks

    tasks = [t for r, wanted in IN_PROCESS.items() for t in load_tasks(FIXTURES / f"attacks-{r}")[0]
             if t.name in wanted]
    assert len(tasks) == sum(len(w) for w in IN_PROCESS.values())
    assert IN_PROCESS_NATIVE <= {t.name for t in tasks}
    if backend == "microvm":
        tasks = [t for t in tasks if t.name in IN_PROCESS_NATIVE]
    for verify in ("shared", "separate") if backend == "bwrap" else ("shared",):
        cfg = RunConfig(backend=backend, n=1, concurrency=2, retry=RetryPolicy(max_attempts=1), verify=verify)
        report = await run_suite(tasks, OraclePolicy(), cfg)
        assert len(report.results) == len(tasks)
        for r in report.results:
            assert r.status == "completed" and r.reward == 0.0, (backend, verify, r.task, r.reason, r.reward,
                                                                 r.verifier_output)


# -- round XIX: rewards read from the tests' output (TB1's pytest parser, SWE-bench's log), a stream the
# code under test writes to as well (docs/security.md, "Rewards read from the tests' output")

OUTPUT_READ = ["tb1-fake-summary-exit0", "tb1-fake-summary-kill", "tb1-report-patch", "tb1-writer-swap",
               "tb1-session-data-writer", "swebench-status-lines", "swebench-writer-decoy", "tb1-witness-close"]
"""Each forged on every backend in both modes before round XIX (ed91c60; tb1-session-data-writer and
swebench-writer-decoy until the witness, adf4e3a). tb1-witness-forge, written against the witness (the code
under test writes the witness's descriptor itself, then silences it), forges: in the table only."""
RUNNER_HOOKS = ["pytest-plugin-register", "pytest-plugin-private", "tb1-plugin-register"]
"""A plugin the code under test adds to pytest's hooks: forged on every backend before 26ee541."""


@pytest.mark.parametrize("backend", ["bwrap", GVISOR, MICROVM])
async def test_output_read_rewards_need_the_tests_own_status(backend: str) -> None:
    """A summary of passes the code under test prints into pytest's output (then SIGKILLs or _exits
    pytest, or prints through pytest's own writer, or patches its reports, or keeps pytest's failure count
    at 0 besides), or a PASSED line and an exit code it prints into SWE-bench's log (or a decoy failure
    line): each scores 0 with the reason that names it (tests_status: the output and the test command's
    own status, or pytest's own outcomes to the witness, disagree; tests_killed), never masked. A plugin
    the code under test adds to pytest's hooks scores 0 too. And TB1's same shell runs the tests in the
    agent's session: forged there (flagged on the row), held by --verify separate."""
    from sandfleet.rollout.verifier import OUTPUT_STATUS_REASON, SAME_SHELL_RISK
    from sandfleet.tasks import load_tasks

    loaded = {t.name: t for t in load_tasks(FIXTURES / "attacks-xix")[0]}
    assert {*OUTPUT_READ, *RUNNER_HOOKS, "tb1-same-shell-state", "tb1-witness-forge"} == set(loaded)
    del loaded["tb1-witness-forge"]
    if backend == "microvm":  # the rules are the host's and the guard's, the same code everywhere: in a guest,
        # a signal's status, the kept status and the witness's descriptor (all 12: 60 s of the slow pass)
        loaded = {n: t for n, t in loaded.items()
                  if n in ("tb1-fake-summary-kill", "swebench-status-lines", "tb1-witness-close", "tb1-plugin-register",
                           "tb1-same-shell-state")}
    for verify in ("shared", "separate") if backend == "bwrap" else ("shared",):
        cfg = RunConfig(backend=backend, n=1, concurrency=2, retry=RetryPolicy(max_attempts=1), verify=verify)
        report = await run_suite(list(loaded.values()), OraclePolicy(), cfg)
        rows = {r.task: r for r in report.results}
        for name in [n for n in [*OUTPUT_READ, *RUNNER_HOOKS] if n in rows]:
            r = rows[name]
            assert r.status == "completed" and r.reward == 0.0, (backend, verify, name, r.reason, r.verifier_output)
            if name in OUTPUT_READ:  # named; the runner's hooks: the tests themselves decided 0 (refused, or 1)
                assert r.reason in (OUTPUT_STATUS_REASON, "tests_killed"), (backend, verify, name, r.reason)
        same = rows["tb1-same-shell-state"]
        if verify == "shared":  # the agent's session decides what runs: by design, and said on the row
            assert SAME_SHELL_RISK in same.info.get("verifier_risks", []), same.info
        else:
            assert same.reward == 0.0, (backend, same.reason, same.verifier_output)


async def test_an_honest_tb1_run_that_prints_megabytes_still_scores_one(tmp_path: Path) -> None:
    """The honest side of round XIX: TB1's summary comes last, and a test command keeps the first bytes
    of its output, so tests that printed more than a command's 1 MiB lost their summary and an honest
    solution scored 0. An output-read reward keeps 16 MiB a stream (and flags a cut): 3 MiB of output
    before a passing pytest is a 1, with the tests' status 0 confirming it."""
    from sandfleet.tasks import load_task

    attack = FIXTURES / "attacks-xix" / "tb1-writer-swap"
    folder = tmp_path / "tb1-loud"
    (folder / "tests").mkdir(parents=True)
    (folder / "Dockerfile").write_text((attack / "Dockerfile").read_text())  # (the attacks' image: cached)
    (folder / "task.yaml").write_text('instruction: "Write hello into /app/out.txt."\nparser_name: pytest\n')
    (folder / "solution.sh").write_text("#!/bin/bash\necho hello > /app/out.txt\n")
    (folder / "tests" / "test_outputs.py").write_text(
        "def test_out():\n    assert open('/app/out.txt').read().strip() == 'hello'\n")
    (folder / "run-tests.sh").write_text(
        "#!/bin/bash\ncd /app\nhead -c 3000000 /dev/zero | tr '\\0' x | fold -w 100\n"
        'python3 -m pytest -p no:cacheprovider "$TEST_DIR/test_outputs.py" -rA\n')
    report = await run_suite([load_task(folder)], OraclePolicy(), RunConfig(backend="bwrap", n=1))
    r = report.results[0]
    assert r.status == "completed" and r.reward == 1.0, (r.reason, r.verifier_output[-500:])
    assert not r.info.get("verifier_risks"), r.info


async def test_the_images_own_venv_runs_the_tests_runner(tmp_path: Path) -> None:
    """The honest side of round XXVI: the image's venv in the workdir, whose runner the tests run (its
    console script, `python -m pytest` from it, pytest after sourcing its activate), scores 1 on a right
    answer and 0 on a wrong one in both verify modes; an agent that adds a module to that venv and runs
    its Python (which writes byte-compiled files there) keeps its 1; and two of the round's attacks are
    held in both modes (the list made in the agent's sandbox and carried to the fresh one)."""
    from sandfleet.tasks import load_task

    attack = FIXTURES / "attacks-xxvi" / "image-venv-script"
    installs = ('site=$(/app/.venv/bin/python3 -c "import sysconfig; print(sysconfig.get_paths()[\\"purelib\\"])")\n'
                'echo "VALUE = 1" > "$site/agenthelper.py"\nrm -rf "$site/iniconfig/__pycache__"\n'
                '/app/.venv/bin/python -c "import agenthelper, iniconfig"\n')
    cases = [(".venv/bin/pytest", "hello", ""), (".venv/bin/pytest", "bye", ""),
             (".venv/bin/python -m pytest", "hello", ""), (".venv/bin/python -m pytest", "bye", ""),
             ("source .venv/bin/activate && pytest", "hello", ""), (".venv/bin/pytest", "hello", installs)]
    tasks = []
    for i, (runner, answer, before) in enumerate(cases):
        folder = tmp_path / f"case{i}-{answer}"
        shutil.copytree(attack, folder)  # (its image: cached)
        test = (attack / "tests" / "test.sh").read_text()
        assert ".venv/bin/pytest " in test
        (folder / "tests" / "test.sh").write_text(test.replace(".venv/bin/pytest ", runner + " "))
        (folder / "solution" / "solve.sh").write_text(f"#!/bin/bash\nset -e\n{before}echo {answer} > /app/out.txt\n")
        tasks.append(load_task(folder))
    attacks = [load_task(FIXTURES / "attacks-xxvi" / n) for n in ("image-venv-script", "image-venv-pyc")]
    for verify in ("shared", "separate"):  # (the attack suite runs the rows in the agent's sandbox: shared)
        report = await run_suite(tasks + attacks, OraclePolicy(),
                                 RunConfig(backend="bwrap", n=1, concurrency=2, verify=verify))
        assert len(report.results) == len(tasks) + len(attacks)
        for r in report.results:
            want = 1.0 if r.task.endswith("hello") else 0.0
            assert r.status == "completed" and r.reward == want, (verify, r.task, r.reason, r.verifier_output[-800:])
            changed = [x for x in r.info.get("verifier_risks", []) if "image's venv" in x]
            assert bool(changed) == (r.task.startswith(("case5", "image-venv"))), (verify, r.task, r.info)
            if r.task == "image-venv-script":  # refused by the seal, not failed on its own
                assert "was changed by the agent; it does not run" in r.verifier_output, (verify, r.verifier_output)


async def test_the_tests_own_venv_in_the_workdir_runs_their_runner(tmp_path: Path) -> None:
    """The honest side of round XXIV: a test script that makes its venv in the workdir (Terminal-Bench's
    `.tbench-testing`), installs pytest there and runs it as `python -m pytest` (which scored 0 until
    1bfe107: the guard took pytest's own functions for the workdir's code) or by its console script scores
    1 on a right answer and 0 on a wrong one, in both verify modes."""
    from sandfleet.tasks import load_task

    attack = FIXTURES / "attacks-xxiv" / "venv-runner-module"
    tasks = []
    # (not the console script's wrong answer: its right one and the module's two tell it; issue 43)
    for runner, answer in (("python -m pytest", "hello"), ("python -m pytest", "bye"), ("pytest", "hello")):
        folder = tmp_path / f"{runner.split()[0]}-{answer}"
        shutil.copytree(attack, folder)  # (its image: the venv tasks', cached)
        test = (attack / "tests" / "test.sh").read_text()
        (folder / "tests" / "test.sh").write_text(test.replace("python -m pytest", runner))
        (folder / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {answer} > /app/out.txt\n")
        tasks.append(load_task(folder))
    for verify in ("shared", "separate"):
        report = await run_suite(tasks, OraclePolicy(), RunConfig(backend="bwrap", n=1, concurrency=2, verify=verify))
        for r in report.results:
            want = 1.0 if r.task.endswith("hello") else 0.0
            assert r.status == "completed" and r.reward == want, (verify, r.task, r.reason, r.verifier_output[-800:])
