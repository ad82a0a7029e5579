"""What the verifier puts around the tests so that the agent's workdir can't raise the reward
(docs/security.md, "Reward integrity"). Each piece runs in the sandbox as its root:

- :data:`SANITIZE_GIT`: every git repository under the workdir keeps only an allowlist of
  config keys (no ``core.fsmonitor``, hooks path, pager, drivers, aliases, includes, credential
  helpers, ...), its hooks folders are emptied, and a ``.git`` file, link or ``commondir``
  that leads out of the workdir is removed. :func:`git_env` adds command-line config that
  switches off what a repository could still ask for.
- :data:`PY_GUARD`: a ``sitecustomize`` in a root-owned folder put first on the tests'
  ``PYTHONPATH``. It installs a meta-path finder that resolves a top-level module found in
  a trusted ``sys.path`` entry (the standard library, site-packages; not the workdir, not
  the cwd) from there first, so a workdir ``json.py`` never replaces the standard library's,
  while a workdir module no trusted entry has still imports. It then runs the image's own
  ``sitecustomize``, if any.

(The test command itself runs as the first process of a pid namespace of its own, which the
guest agent makes before its seccomp filter: when it exits, the kernel kills every process
it left before the exec returns; ``Sandbox.exec(pid_namespace=True)``.)
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

GIT_ALLOWED = (
    "core.repositoryformatversion core.filemode core.bare core.logallrefupdates core.ignorecase "
    "core.precomposeunicode core.symlinks core.autocrlf core.eol core.safecrlf core.worktree "
    "core.sharedrepository core.quotepath core.checkstat core.trustctime core.untrackedcache "
    "core.splitindex core.commitgraph core.multipackindex core.sparsecheckout core.sparsecheckoutcone "
    "core.abbrev core.compression core.bigfilethreshold extensions.objectformat extensions.worktreeconfig "
    "extensions.refstorage extensions.partialclone extensions.preciousobjects extensions.noop "
    "user.name user.email init.defaultbranch index.version index.sparse gc.auto "
    "remote.*.url remote.*.pushurl remote.*.fetch remote.*.push remote.*.tagopt remote.*.promisor "
    "remote.*.partialclonefilter branch.*.remote branch.*.merge branch.*.rebase branch.*.pushremote "
    "submodule.*.url submodule.*.active submodule.*.branch"
)
"""The git config keys a repository of the agent keeps (``*``: any subsection): none runs a
program."""

GIT_OVERRIDES = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("protocol.ext.allow", "never"),
    ("credential.helper", ""),
    ("safe.bareRepository", "explicit"),
    ("safe.directory", "*"),
    ("gc.autoDetach", "false"),
)
"""Command-line config (``GIT_CONFIG_COUNT``, git >= 2.31) of the tests: it wins over any
repository's config. ``safe.bareRepository=explicit``: a bare repository is never found by
walking up from the cwd (a folder of the workdir laid out as one, whose config nobody
sanitized, is not a repository to the tests' git). ``gc.autoDetach=false``: an automatic gc
runs in the foreground, not as a daemon the verifier's warden would count. ``safe.directory=*``:
every repository the tests reach was sanitized here, so git works for them whoever owns it (on
microvm the tests run as root over a workdir of another uid: git refused it as of "dubious
ownership")."""

# The git config filter: only allowlisted keys with plain values (no quotes, backslashes or
# comments), each re-emitted under a header written here. What it can't parse is dropped, so
# whatever the input, the output holds allowlisted keys only.
_GIT_AWK = r"""
BEGIN { n = split(allow, a, " "); for (i = 1; i <= n; i++) ok[a[i]] = 1 }
{
  t = $0; sub(/^[ \t]+/, "", t); sub(/[ \t\r]+$/, "", t)
  if (t == "" || t ~ /^[#;]/) next
  if (substr(t, 1, 1) == "[") {
    sec = ""; name = ""
    if (t ~ /^\[[A-Za-z0-9-]+\]$/) { sec = tolower(substr(t, 2, length(t) - 2)) }
    else if (t ~ /^\[[A-Za-z0-9-]+ "[^"\\]*"\]$/) {
      sp = index(t, " "); sec = tolower(substr(t, 2, sp - 2)); name = substr(t, sp + 2, length(t) - sp - 3)
    }
    next
  }
  raw = t; sub(/[ \t]*=.*/, "", raw)
  if (sec == "" || t !~ /^[A-Za-z][A-Za-z0-9-]*([ \t]*=[ \t]*[^"\\;#]*)?$/) { printf "%s ", raw > "/dev/stderr"; next }
  eq = index(t, "=")
  if (eq) { key = substr(t, 1, eq - 1); val = substr(t, eq + 1) } else { key = t; val = "true" }
  sub(/[ \t]+$/, "", key); sub(/^[ \t]+/, "", val); key = tolower(key)
  full = (name == "") ? sec "." key : sec ".*." key
  if (!(full in ok)) { printf "%s.%s ", sec, key > "/dev/stderr"; next }
  if (name == "") print "[" sec "]"; else print "[" sec " \"" name "\"]"
  print "\t" key " = " val
}
"""

SANITIZE_GIT = r"""
gitlike() {
  [ -e "$1/HEAD" ] || [ -L "$1/HEAD" ] || [ -e "$1/commondir" ] || [ -L "$1/commondir" ] ||
  [ -e "$1/objects" ] || [ -L "$1/objects" ] || [ -e "$1/refs" ] || [ -L "$1/refs" ]
}
sanitize_git() {
  w=$1
  [ -d "$w" ] && [ ! -L "$w" ] || return 0
  # one walk of the tree finds all three kinds (each list is worked through in this order)
  # (a pipe into the loop, which runs in this shell: lastpipe; not <(...), which needs /dev/fd,
  # and a microvm guest had none: the walk found nothing and nothing was sanitized there)
  local pointers=() configs=() hooks=() e lp
  lp=$(shopt -p lastpipe); set +m; shopt -s lastpipe
  find "$w" \( \( -name .git -o -name commondir \) \( -type f -o -type l \) -printf 'P%p\0' \) -o \
       \( \( -name config -o -name config.worktree \) \( -type f -o -type l \) -printf 'C%p\0' \) -o \
       \( -name hooks \( -type d -o -type l \) -printf 'H%p\0' \) 2>/dev/null |
  while IFS= read -r -d '' e; do
    case $e in P*) pointers+=("${e#?}") ;; C*) configs+=("${e#?}") ;; H*) hooks+=("${e#?}") ;; esac
  done
  $lp
  # pointers that lead out of the workdir: a .git file or link, a worktree's commondir
  for f in "${pointers[@]}"; do
    if [ -L "$f" ]; then t=$(readlink -m -- "$f")
    else
      IFS= read -r t < "$f" || true
      case ${f##*/} in .git) t=${t#gitdir: } ;; esac
      case $t in /*) ;; *) t=${f%/*}/$t ;; esac
      t=$(readlink -m -- "$t")
    fi
    case $t in "$w"|"$w"/*) ;; *) rm -f -- "$f"; echo "removed $f (leads to $t)" ;; esac
  done
  # every config of a folder git could read as a git folder, found the way git finds them (a
  # HEAD of any kind, a dangling link included; objects or refs, as a worktree's common
  # folder has without a HEAD; a commondir), not only folders with a HEAD: allowlisted keys only
  for f in "${configs[@]}"; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    d=${f%/*}
    [ "${f##*/}" = config.worktree ] || gitlike "$d" || continue
    tmp=$(mktemp -- "$d/.sandfleet-config.XXXXXXXX") || continue
    if [ -L "$f" ]; then printf '[core]\n\trepositoryformatversion = 0\n' > "$tmp"; dropped="(a link)"
    else dropped=$(awk -v allow="$GIT_ALLOWED" "$GIT_AWK" < "$f" 2>&1 > "$tmp") || { : > "$tmp"; dropped="(all)"; }; fi
    [ -z "$dropped" ] || echo "sanitized $f, removed: $(printf '%s' "${dropped% }" | head -c 400)"
    chmod 0644 -- "$tmp"; mv -f -T -- "$tmp" "$f"
  done
  # hooks folders of git folders: emptied (a link is replaced by an empty folder)
  for h in "${hooks[@]}"; do
    gitlike "${h%/*}" || continue
    if [ -L "$h" ] || [ -n "$(find "$h" -mindepth 1 -maxdepth 1 ! -name '*.sample' -print -quit)" ]; then
      echo "emptied $h"
    fi
    rm -rf -- "$h"; mkdir -m 0755 -- "$h"
  done
}
"""


def sanitize_git_script() -> str:
    """The bash function :data:`SANITIZE_GIT` with its allowlist and filter bound."""
    from shlex import quote

    return f"GIT_ALLOWED={quote(GIT_ALLOWED)}\nGIT_AWK={quote(_GIT_AWK)}\n{SANITIZE_GIT}"


def git_env(env: Mapping[str, str]) -> dict[str, str]:
    """``GIT_CONFIG_COUNT``/``KEY_n``/``VALUE_n`` adding :data:`GIT_OVERRIDES` after any
    command-line config ``env`` already has."""
    try:
        start = max(0, int(env.get("GIT_CONFIG_COUNT", "0")))
    except ValueError:
        start = 0
    out = {"GIT_CONFIG_COUNT": str(start + len(GIT_OVERRIDES))}
    for i, (key, value) in enumerate(GIT_OVERRIDES, start):
        out[f"GIT_CONFIG_KEY_{i}"], out[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return out


PY_GUARD = r'''"""sandfleet's verifier guard (docs/security.md): a module of the agent's workdir never
replaces a standard-library or installed one, and what the workdir's code does inside a tests'
process is the code under test's. Made by root; read-only for the tests."""


def _sandfleet_guard():
    import os
    import sys
    from importlib.machinery import PathFinder

    here = os.path.dirname(os.path.realpath(__file__))
    real_open = open  # (the guard's own, taken before any code of the agent's ran)
    mine = sys._getframe(0).f_code.co_filename
    untrusted = [p.rstrip("/") for p in os.environ.get("SANDFLEET_UNTRUSTED", "").split(":") if p]
    verdicts = {}

    def in_workdir(real):
        return any(real == u or real.startswith(u + "/") for u in untrusted)

    def untrusted_path(p):
        real = os.path.realpath(str(p))
        return real == here or (in_workdir(real) and not tests_venv_file(real))

    tests_venv = {}  # real path -> a file of the tests' own venv, in a program the seal keeps
    ask_seal = []

    def tests_venv_file(real):
        """REAL is a file of a venv the tests made in the workdir (not over a folder of the agent's) and wrote
        after the preparation (seal.c, sandfleet_seal_tests_venv), and this program is one the seal keeps from
        the reward folders as the workdir's (their venv's console script, python -m pytest from it): their
        pytest's frames are theirs, and the code under test it imports is judged inside it as in any grader
        (round XXIV: until then such a pytest's status was the code's to set, os._exit(0) at an import). Not in
        a program the seal does not keep: what the tests' installer wrote may have been steered by the agent's
        files (uv reads the cwd's uv.toml), and there it would be trusted beside the reward folders."""
        theirs_file = tests_venv.get(real)
        if theirs_file is None:
            if not ask_seal:
                try:
                    import ctypes

                    lib = ctypes.CDLL(None)
                    kept = getattr(lib, "sandfleet_seal_program_code", None)
                    ask = getattr(lib, "sandfleet_seal_tests_venv", None)
                    ask_seal.append(ask if kept is not None and ask is not None and kept() else None)
                except (ImportError, OSError):
                    ask_seal.append(None)
            theirs_file = bool(ask_seal[0] and ask_seal[0](os.fsencode(real)))
            if len(tests_venv) < 8192:
                tests_venv[real] = theirs_file
        return theirs_file

    def trusted(entry):
        if not isinstance(entry, str) or entry in ("", "."):
            return False
        return not untrusted_path(entry)

    # the tests' own folders (/tests): an entry under one that joins sys.path later (pytest's rootdir, a
    # test module's own insert) is searched before the workdir's too (round XX's tests-helper-shadow)
    tests_dirs = [p.rstrip("/") for p in os.environ.get("SANDFLEET_TESTS_DIRS", "").split(":") if p]
    tests_entries = {}
    shadowed = set()

    def tests_entry(entry):
        if not tests_dirs or not isinstance(entry, str) or not entry.startswith("/"):
            return False
        own = tests_entries.get(entry)
        if own is None:
            real = os.path.realpath(entry)
            own = any(real == t or real.startswith(t + "/") for t in tests_dirs) and not untrusted_path(entry)
            if len(tests_entries) < 1024:
                tests_entries[entry] = own
        return own

    # The witness (round XIX): where the tests' reward is read from their output, each pytest of theirs
    # writes every test's outcome to a kept file, from a plugin of this file's, through a descriptor the
    # verifier's wrapper opened on it before the test command ran (the seal keeps the reward folders
    # from a pytest run in the workdir, as `python -m pytest` there is: an open of its own is refused).
    # Each Python says it ran before any code of the workdir's does; each pytest, that it started.
    witness_fd = []
    fd = os.environ.get("SANDFLEET_WITNESS_FD", "")
    if fd.isdigit():
        try:
            os.fstat(int(fd))
            os.write(int(fd), b"python\t%d\n" % os.getpid())
            witness_fd.append(int(fd))
        except OSError:
            pass

    def witness_module():
        """The plugin pytest loads by name (a default plugin, added as pytest is imported)."""
        import types

        def out(line):
            try:
                os.write(witness_fd[0], line.encode("utf-8", "replace"))
            except (OSError, IndexError):
                pass

        def pytest_configure(config):
            out("start\t%d\n" % os.getpid())

        def pytest_runtest_logreport(report):
            if report.failed or report.skipped or (report.when == "call" and report.passed):
                out("%s\t%s\n" % (report.outcome, " ".join(str(report.nodeid).split())))

        def pytest_sessionfinish(session, exitstatus):
            out("finish\t%d\n" % int(exitstatus))

        module = types.ModuleType("sandfleet_witness")
        module.pytest_configure = pytest_configure
        module.pytest_runtest_logreport = pytest_runtest_logreport
        module.pytest_sessionfinish = pytest_sessionfinish
        return module

    # Who decided a test's outcome (stop 78). pytest reports a test skipped, xfailed, or a session ended by
    # pytest.exit, from an exception: Skipped, XFailed, unittest.SkipTest, Exit. Raised from the tests' own code it is
    # their decision; raised from the code under test's (a solution whose answer() calls pytest.skip(), an object
    # whose __eq__ raises SkipTest as the tests' assert compares it: code-skips-test, code-eq-skips) the failing test
    # scored as not failed, and pytest exited 0. Not knowing which exception or how it was made: one whose
    # traceback passed through a frame of the code under test's decides nothing -- the test failed (the session
    # ended by it: the program exits 1). The test's own function is the tests' even where it is the workdir's
    # (SWE-bench's repositories hold their tests).
    def outcome_kinds():
        kinds = []
        outcomes = sys.modules.get("_pytest.outcomes")
        for name in ("Skipped", "XFailed", "Exit"):
            kind = getattr(outcomes, name, None)
            if isinstance(kind, type):
                kinds.append(kind)
        unittest = sys.modules.get("unittest")
        if isinstance(getattr(unittest, "SkipTest", None), type):
            kinds.append(unittest.SkipTest)
        return tuple(kinds)

    def passed_through_code(excinfo, own=None):
        """Where EXCINFO's exception, an outcome of the runner's, came from the code under test, said; or None:
        - it passed through a frame of the code's (OWN, the test's own function, is the tests');
        - or the frame that raised it, the innermost that is not the runner's, is the tests' (or a library's) at a
          line that names no skip, xfail or exit: a value the line used raised it (a class of the code's whose
          __eq__ is functools.partial(pytest.skip), a MagicMock of the code's with a Skipped as its side effect:
          the runner's own functions, and no frame of the code's)."""
        value = getattr(excinfo, "value", None)
        if value is None or not isinstance(value, outcome_kinds()):
            return None
        tb = getattr(value, "__traceback__", None)
        innermost = None
        while tb is not None:
            f = tb.tb_frame
            module = f.f_globals.get("__name__")
            if not (isinstance(module, str) and module.split(".")[0] in runners):
                if f.f_code is not own and code_verdict(f.f_code.co_filename):
                    return "%s:%d" % (f.f_code.co_filename, tb.tb_lineno)
                innermost = (f, tb.tb_lineno)
            tb = tb.tb_next
        if innermost is not None:
            f, line = innermost
            if not names_an_outcome(source_line(f.f_code.co_filename, line)):
                return "%s:%d, whose line names no skip, xfail or exit" % (f.f_code.co_filename, line)
        return None

    def names_an_outcome(text):
        """TEXT (a line, lower case) calls or raises an outcome of the runner's by name: skip(, xfail(, exit(,
        importorskip(, skipTest(, SkipTest(, skip.Exception -- not a word that only holds one (an exit_code)."""
        import re

        return re.search(r"\b(skip|xfail|exit|importorskip|skiptest)\s*\(|\bskip\.exception\b", text) is not None

    def source_line(name, line):
        """Line LINE of the file NAME, lower case, read from the file itself: not linecache's, whose cache the code
        under test can fill (the tests' files are not the agent's to write). "" where there is none."""
        try:
            with real_open(name, "rb") as f:
                for number, text in enumerate(f, 1):
                    if number == line:
                        return text.decode("utf-8", "replace").lower()
        except (OSError, TypeError, ValueError):
            pass
        return ""

    def outcomes_module():
        """The plugin that judges who raised a test's outcome, outermost of the report's makers."""
        import types

        hookimpl = sys.modules["pytest"].hookimpl  # (patch_pytest asks for it first)

        def to_failed(report, kind, where):
            report.outcome = "failed"
            report.longrepr = ("sandfleet: the code under test decided this outcome (%s, raised through %s): "
                               "the test failed" % (kind, where))
            if "wasxfail" in getattr(report, "__dict__", {}):
                del report.wasxfail

        statics = {}  # id(item) -> it had an xfail marker as its setup ended (the tests' own, or a fixture's)

        def pytest_runtest_makereport(item, call):
            obj = getattr(item, "obj", None)
            own = getattr(getattr(obj, "__func__", obj), "__code__", None)
            where = passed_through_code(call.excinfo, own)
            kind = type(call.excinfo.value).__name__ if where else None
            if call.when == "setup":
                statics[id(item)] = any(True for _ in item.iter_markers(name="xfail"))
            outcome = yield
            report = outcome.get_result()
            if report is None:
                return
            if where and (report.outcome != "failed" or hasattr(report, "wasxfail")):
                to_failed(report, kind, where)
            elif call.when == "call" and sealed and hasattr(report, "wasxfail") and call.excinfo is not None and \
                    not isinstance(call.excinfo.value, outcome_kinds()) and not statics.get(id(item), True):
                # a test that failed (its own exception) reported xfailed by a marker that came while its call ran, in
                # a program that loaded the code under test (code-xfail-marker-added: the code found the item)
                to_failed(report, "an xfail marker added as the test ran", "the test's item")

        def pytest_make_collect_report(collector):
            outcome = yield
            report = outcome.get_result()
            call = getattr(report, "call", None)  # (pytest keeps its CallInfo on the report)
            where = passed_through_code(getattr(call, "excinfo", None)) if report is not None else None
            if where and report.outcome != "failed":
                to_failed(report, type(call.excinfo.value).__name__, where)

        def pytest_keyboard_interrupt(excinfo):
            where = passed_through_code(excinfo)
            if where:
                print("sandfleet: the code under test ended the test session (%s, raised through %s); it exits 1"
                      % (type(excinfo.value).__name__, where), file=sys.stderr, flush=True)
                os._exit(1)

        def pytest_configure(config):
            judged.append([config.pluginmanager, module, None])

        def pytest_unconfigure(config):
            for entry in judged:
                if entry[0] is config.pluginmanager and entry[2] is None:
                    entry[2] = judge_removed(entry[0], module) or ""

        module = types.ModuleType("sandfleet_outcomes")
        wrap = hookimpl(hookwrapper=True, tryfirst=True)
        module.pytest_runtest_makereport = wrap(pytest_runtest_makereport)
        module.pytest_make_collect_report = wrap(pytest_make_collect_report)
        module.pytest_keyboard_interrupt = pytest_keyboard_interrupt
        module.pytest_configure = pytest_configure
        module.pytest_unconfigure = pytest_unconfigure
        return module

    judged = []  # [plugin manager, the judging plugin, what it lost as pytest unconfigured] of each pytest here

    def judge_removed(pm, module):
        """The hook of PM that lost the judging plugin MODULE's implementation (the code under test took it out of
        pluggy's record), or None."""
        relay = own_dict(pm).get("hook")
        for hook in ("pytest_runtest_makereport", "pytest_make_collect_report", "pytest_keyboard_interrupt"):
            caller = own_dict(relay).get(hook) if relay is not None else None
            impls = impls_of(caller) if caller is not None else []
            want = own_dict(module).get(hook)
            if not any(own_dict(i).get("function") is want for i in impls):
                return hook
        return None

    def judge_lost():
        """What a pytest of this program lost of the judging plugin (code-unregisters-judge), said, or None: its
        hooks as pytest unconfigured itself, or the plugin itself (unregistered: its unconfigure never ran)."""
        for pm, module, lost in judged:
            if lost is None:
                return "the plugin, unregistered"
            if lost:
                return lost
        return None

    def patch_pytest(module):
        config = sys.modules.get("_pytest.config")
        plugins = getattr(config, "default_plugins", None)
        if not isinstance(plugins, tuple):
            return
        add = []
        # (the judge's hooks are wrappers: a pytest without hookimpl's marks gets the witness alone, as before)
        if "sandfleet_outcomes" not in plugins and getattr(module, "hookimpl", None) is not None:
            sys.modules["sandfleet_outcomes"] = outcomes_module()
            add.append("sandfleet_outcomes")
        if witness_fd and "sandfleet_witness" not in plugins:
            sys.modules["sandfleet_witness"] = witness_module()
            add.append("sandfleet_witness")
        config.default_plugins = plugins + tuple(add)

    # site runs before the cwd or script folder is put first on sys.path: none of them is here
    paths = [p for p in sys.path if trusted(p)]
    builtin = set(sys.builtin_module_names)
    try:
        from _imp import is_frozen
    except ImportError:
        def is_frozen(name):
            return False

    runpy = os.path.join(os.path.dirname(os.__file__), "runpy.py")  # python -m's bottom frame
    sealed = []  # the seal's rule asked for (this program loaded the workdir's code)
    inside = []  # a grader that loaded it: its writes, starts and exits are watched by the stack
    armed = []  # the exit status is the tests' (its main program is theirs)
    running_code = [0]  # inside an unpickling, or a handler the code under test registered
    lib = []

    def seal_lib():
        if not lib:
            try:
                import ctypes

                lib.append(ctypes.CDLL(None))
                lib[0].sandfleet_seal_rewards  # a seal is loaded
            except (ImportError, OSError, AttributeError):
                lib[:] = [None]
        return lib[0]

    # A root agent's files (stop 75): in the agent's own sandbox a root agent can change what no workdir rule
    # names -- the standard library, site-packages, a .pth file, the image's sitecustomize, a pytest plugin's
    # distribution. A file whose change time falls between the record taken before the agent's first command and
    # the preparation is the agent's, wherever it is (seal.c, agent_touched): a module read from one is the code
    # under test's, as a workdir module is. No record (a non-root agent, a fresh sandbox), no reads of it at all.
    window = []
    touched = {}

    def agent_window():
        """A root agent's record is known here (where not, agent_file is False without a look)."""
        if not window:
            window.append(None)  # (while it is read: what it opens, ctypes' modules, is asked of no seal)
            try:
                with open(os.path.join(here, "image-envs"), "rb") as f:
                    known = f.read(1) == b"s"
            except OSError:
                known = False
            seal = seal_lib() if known else None
            window[0] = getattr(seal, "sandfleet_seal_agent_touched", None) if seal is not None else None
        return window[0] is not None

    def agent_file(path):
        """PATH (a module's source, its compiled cache, an extension, a distribution's metadata) is a file a
        root agent changed outside the workdir."""
        if not agent_window() or not isinstance(path, (str, bytes)):
            return False
        key = os.path.abspath(os.fsdecode(path))
        got = touched.get(key)
        if got is None:  # (not this guard's folder and the workdir, which the preparation itself wrote and gave to
            # the tests' user before its time was taken: the workdir's own rules judge them, an image's venv there by
            # its record, round XXVI; a shared temporary folder's are asked too: a .pth path line of the agent's put
            # /tmp on every Python's path, root-tmp-sitecustomize)
            real = os.path.realpath(key)
            got = not real.startswith(here + "/") and not in_workdir(real) and bool(window[0](os.fsencode(key)))
            if len(touched) < 16384:
                touched[key] = got
        return got

    def source_of(name):
        """A compiled cache's source (folder/__pycache__/NAME.TAG.pyc -> folder/NAME.py); any other file itself."""
        if name.endswith(".pyc"):
            folder, base = os.path.split(name)
            if os.path.basename(folder) == "__pycache__":
                return os.path.join(os.path.dirname(folder), base.split(".")[0] + ".py")
        return name

    def code_path(name):
        """The file NAME (a code object's) is the agent's: the workdir's, or one a root agent changed."""
        return untrusted_path(name) or agent_file(name)

    def code_verdict(name):
        """A code object's file name is the code under test's: a file of the agent's (code_path), or a string's
        code ("<...>", not the interpreter's frozen modules). Once per name: an armed program's end asks it of
        every function of the runner's (runner_intact), thousands, and each realpath is a stat per folder of
        the path (an `import pytest` ended in 44,000 stats, 13 s of the verifier's 60 under TCG)."""
        bad = verdicts.get(name)
        if bad is None:
            bad = not name.startswith("<frozen") if name.startswith("<") else code_path(name)
            verdicts[name] = bad
        return bad

    def by_code():
        """What runs now is the code under test's: the Python stack holds code of the workdir's, or
        code compiled from a string (not the tests' own one-liner at its bottom), or runs inside an
        unpickling or a handler the code under test registered; or it does not start at the main
        program (an atexit handler, a thread's target: what the code under test left to run later
        runs without its own frame, so only the main program's own stack is the tests')."""
        if running_code[0]:
            return True
        f = sys._getframe(1)
        bottom = None
        while f is not None:
            name = f.f_code.co_filename
            if name != mine:
                bad = code_verdict(name)
                if bad and not (f.f_back is None and name in ("<string>", "<stdin>") and
                                f.f_globals.get("__name__") == "__main__"):
                    return True
                bottom = f
            f = f.f_back
        return bottom is None or not (bottom.f_globals.get("__name__") == "__main__" or
                                      bottom.f_code.co_filename in ("<frozen runpy>", runpy))

    runners = ("_pytest", "pytest", "pluggy", "unittest")
    before = {}  # the runner's functions as the code under test found them (arm): stamp of each
    modules_then = set()  # the runner's modules as arm found them, whole (not still being imported)
    plain = (int, float, complex, str, bytes, bytearray)  # values that run nothing
    special = ("__call__", "__get__", "__set__", "__getattr__", "__getattribute__")  # what runs an object in use
    RUNS_CAP = 4096  # objects runs() reads for one value (the runner's own read at most a few hundred)
    # a class's own dictionary, its method resolution order and its __module__, read through type's own slots: no
    # descriptor or metaclass of the code under test's runs to answer
    dict_of = type.__dict__["__dict__"].__get__
    mro_of = type.__dict__["__mro__"].__get__
    module_of = type.__dict__["__module__"].__get__

    def closure_values(function, empty=None):
        """The values FUNCTION's closure holds (EMPTY for an empty cell)."""
        out = []
        for cell in function.__closure__ or ():
            try:
                out.append(cell.cell_contents)
            except ValueError:
                out.append(empty)
        return out

    def stamp(value):
        """What identifies VALUE as the runner had it: the object, and for a function its code and the values its
        closure holds (a function object kept while its code or a cell's value changed: stop 77's
        runner-code-swapped)."""
        import types

        if not isinstance(value, types.FunctionType):
            return id(value)
        return id(value), id(value.__code__), tuple(id(v) for v in closure_values(value, empty=stamp))

    def runner_values():
        """(module, attribute, value) of the test runner's modules and their classes; and the builtins every
        function of theirs calls (stop 77's builtins-hasattr-swapped: pytest's session counts a failed report as
        an expected failure where hasattr(report, "wasxfail") says so)."""
        import builtins as names

        for attr, value in list(vars(names).items()):
            yield "builtins", attr, value
        for mod_name, module in list(sys.modules.items()):
            if module is None or mod_name.split(".")[0] not in runners:
                continue
            for attr, value in list(vars(module).items()):
                yield mod_name, attr, value
                owner = getattr(value, "__module__", None)
                if isinstance(value, type) and isinstance(owner, str) and owner.split(".")[0] in runners:
                    for name, member in list(vars(value).items()):
                        yield mod_name, attr + "." + name, member

    def runs(value):
        """The code objects VALUE runs where the runner calls it, binds it or makes one of it: a function's and the
        values its closure holds; through a method, a static or class method, a property's accessors, a
        functools.partial(method)'s function and the callables among its arguments, a class's functions (its own
        and its bases') and its metaclass's, an object's class's __call__, __get__, __set__, __getattr__ and
        __getattribute__. Read from the objects' own slots and class dictionaries: nothing of the code under test
        runs to answer (stop 76's runner-callable-object: a partialmethod of the code's own in TestReport.__init__'s
        place, which no check of functions, methods and properties saw). More than RUNS_CAP objects to read ends
        the list with None, which foreign takes for the code's: the walk never stops short of what it did not read
        (stop 77's runner-partial-padded hid its function behind 600 arguments, past a cap that ended the walk)."""
        import functools
        import types

        out, todo, seen = [], [value], set()
        while todo:
            v = todo.pop()
            if v is None or isinstance(v, plain) or id(v) in seen:
                continue
            if len(seen) >= RUNS_CAP:
                out.append(None)
                break
            seen.add(id(v))
            if isinstance(v, types.FunctionType):
                out.append(v.__code__)
                todo.extend(closure_values(v))
            elif isinstance(v, (types.MethodType, staticmethod, classmethod)):
                todo.append(v.__func__)
            elif isinstance(v, property):
                todo.extend((v.fget, v.fset, v.fdel))
            elif isinstance(v, (functools.partial, functools.partialmethod)):
                todo.append(v.func)
                todo.extend(v.args)
                todo.extend((v.keywords or {}).values())
            elif isinstance(v, type):  # its functions, and its metaclass's (whose __call__ makes its objects:
                # stop 77's runner-metaclass-call, a class with no function of its own)
                for klass in mro_of(v) + mro_of(type(v)):
                    if klass is not object and klass is not type:
                        todo.extend(dict_of(klass).values())
            elif not isinstance(v, (tuple, list, dict, set, frozenset, types.ModuleType, types.BuiltinFunctionType)):
                for klass in mro_of(type(v)):
                    if klass is not object:
                        todo.extend(dict_of(klass).get(name) for name in special)
        return out

    def foreign(value, known):
        """VALUE runs code (runs) the code under test wrote: of a file of the workdir's or a root agent's, or
        one it compiled, made or loaded under any name (code_verdict); or, where it replaced one the runner had
        (KNOWN), compiled from a string."""
        for code in runs(value):
            if code is None:
                return True
            name = code.co_filename
            if isinstance(name, str) and (known or not name.startswith("<")) and code_verdict(name):
                return True
        return False

    def runner_intact():
        """As an armed process ends: the test runner's own functions (pytest's, pluggy's, unittest's)
        were not replaced by the code under test's, which would decide what the runner reports (a
        test that failed reported passed), nor did its hooks gain one of the code's (a plugin object
        the code registered: round XIX). Either: the process exits 1, and says what."""
        for mod_name, attr, value in runner_values():
            was = before.get((mod_name, attr))
            if was is not None and was == stamp(value) or was is None and mod_name == "builtins":
                continue  # (a name new to builtins shadows nothing the runner calls)
            # (a value new in a module that was whole at arm, other than a class, is judged as a replaced one: code
            # compiled from a string counts too; a module imported since, or a class, may hold code generated from
            # strings of its own, dataclasses')
            if foreign(value, was is not None or (mod_name in modules_then and not isinstance(value, type))):
                print("sandfleet: the code under test replaced %s.%s of the test runner inside the tests' "
                      "process; it exits 1" % (mod_name, attr), file=sys.stderr, flush=True)
                os._exit(1)
        removed = judge_lost()
        if removed is not None:
            print("sandfleet: the code under test took the guard's judgment of outcomes out of the test runner's hooks "
                  "(%s) inside the tests' process; it exits 1" % removed, file=sys.stderr, flush=True)
            os._exit(1)
        hook = foreign_hook()
        if hook is not None:
            print("sandfleet: the code under test put its own code in the test runner's hooks (%s) inside the tests' "
                  "process; it exits 1" % hook, file=sys.stderr, flush=True)
            os._exit(1)

    def runners_object(value):
        """VALUE is an object of a class of the test runner's (the class's own __module__, from its dictionary)."""
        owner = module_of(type(value))
        return isinstance(owner, str) and owner.split(".")[0] in runners

    def initializing(module):
        """MODULE is still being imported (its body runs: what it defines later is new, not added)."""
        spec = own_dict(module).get("__spec__")
        return getattr(spec, "_initializing", False) is True

    def own_dict(value):
        """An object's own attributes: its dictionary and its slots (pluggy's hook callers and implementations have
        slots), each read through its class's own descriptor (only asked of the runner's own objects)."""
        import types

        if isinstance(value, types.ModuleType):
            return types.ModuleType.__dict__["__dict__"].__get__(value)
        out = {}
        for klass in mro_of(type(value)):
            for name, slot in list(dict_of(klass).items()):
                if name == "__dict__" and isinstance(slot, types.GetSetDescriptorType) or \
                        isinstance(slot, types.MemberDescriptorType):
                    try:
                        got = slot.__get__(value)
                    except AttributeError:  # (an empty slot)
                        continue
                    if name == "__dict__":
                        out.update((k, v) for k, v in list(got.items()) if k not in out)
                    else:
                        out.setdefault(name, got)
        return out

    def machinery_of(pm):
        """(key, value) of a plugin manager's machinery: its own attributes (pluggy's _inner_hookexec, which
        every hook call goes through), its hook relay's callers, and each caller's own attributes. A value that
        is not an object of the runner's is given as it is, never read into."""
        d = own_dict(pm)
        for k, v in list(d.items()):
            yield ("manager", k), v
        relay = d.get("hook")
        if relay is None or not runners_object(relay):
            return
        for name, caller in list(own_dict(relay).items()):
            yield ("hook", name), caller
            if runners_object(caller):
                for k, v in list(own_dict(caller).items()):
                    yield (name, k), v

    def managers(found):
        pluggy = sys.modules.get("pluggy")
        manager = getattr(pluggy, "PluginManager", None)
        if manager is None:
            return []
        return [o for o in found if issubclass(type(o), manager) and runners_object(o)]

    def foreign_hook():
        """What of a pluggy plugin manager's (pytest's) machinery runs the code under test's, said, or None:
        - the manager's own attributes, its relay's hook callers and theirs (stop 77's hookexec-replaced: pluggy's
          _inner_hookexec, which every hook call goes through), judged as replaced functions of the runner's are: code
          compiled from a string counts (pluggy's and pytest's own are functions and objects of their files);
        - a hook implementation whose function runs the code's, unless its plugin is one pytest registered itself
          once the code had loaded (a conftest module of the workdir's, a plugin of a repository's) or one a
          conftest registered (a repository's plugin object), and, for a module, the function is one of that
          module's own. The code under test can't register a plugin (refuse_plugins); one made to look registered
          in pluggy's record (stop 77's hookimpl-plugin-swapped named the solution's module as the plugin of the
          runner's implementation) or a function swapped into a module's implementation (hookimpl-function-swapped)
          is the code's."""
        import gc
        import types

        for pm in managers(gc.get_objects()):
            for key, v in machinery_of(pm):
                if foreign(v, True):
                    return "%s of the plugin manager" % ".".join(key)
            relay = own_dict(pm).get("hook")
            if relay is None or not runners_object(relay):
                continue
            for caller in list(own_dict(relay).values()):
                if not runners_object(caller):
                    continue
                for impl in impls_of(caller):
                    if not runners_object(impl):
                        return "an implementation of %s that is not pluggy's" % getattr(caller, "name", "?")
                    d = own_dict(impl)
                    plugin, function = d.get("plugin"), d.get("function")
                    registered = (id(plugin) in by_runner or id(plugin) in by_conftest) and not agents_plugin(plugin)
                    if isinstance(plugin, types.ModuleType):
                        own = any(function is v for v in list(own_dict(plugin).values()))
                        if own and registered:
                            continue
                        bad = foreign(function, not own)  # (a module of the image's own: as any of its values)
                    else:
                        bad = not registered and foreign(function, True) or id(plugin) not in by_conftest and \
                            foreign(function, False)
                    if bad:
                        return "%s of %r" % (getattr(caller, "name", "?"), d.get("plugin_name"))
        return None

    def agents_plugin(plugin):
        """PLUGIN is a module of a root agent's outside the workdir (a conftest at /, which pytest imports where its
        rootdir is /: stop 78's root-conftest-rootdir), by the path it was loaded from or the file it leads to: the
        runner registered it, but it is not the tests' nor the workdir's (the flagged residual)."""
        import types

        if not isinstance(plugin, types.ModuleType):
            return False
        where = own_dict(plugin).get("__file__")
        return isinstance(where, str) and (agent_input(where) or agent_file(where))

    def impls_of(caller):
        """The hook implementations in pluggy's record of CALLER, read from its own dictionary: _hookimpls from pluggy
        1.1, _nonwrappers and _wrappers before (Debian bookworm's python3-pytest 7.2 has pluggy 1.0, where stop 77's
        reading of _hookimpls alone found none)."""
        d = own_dict(caller)
        out = []
        for name in ("_hookimpls", "_nonwrappers", "_wrappers"):
            impls = d.get(name)
            if isinstance(impls, list):
                out += list(impls)
        return out

    by_conftest = set()  # ids of the plugin objects a conftest module registered (a repository's own)
    by_runner = set()  # ids of the plugins the runner registered itself once the code had loaded (conftest modules)

    def in_conftest():
        """A frame of the stack runs a conftest module pytest imported (its file's module in sys.modules):
        a repository's conftest registers plugin objects of its own (SWE-bench's repositories do)."""
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if name.endswith("/conftest.py") and untrusted_path(name):
                module = sys.modules.get(f.f_globals.get("__name__", ""))
                if getattr(module, "__file__", None) == name:
                    return True
            f = f.f_back
        return False

    def refuse_plugins():
        """A plugin the code under test registers with the test runner (its hooks would decide what the
        runner reports) is refused: PermissionError, said on stderr. pytest's own registrations (its
        plugins, the conftest modules it imports) run with no frame of the workdir's on the stack; a
        conftest's own (a repository's hook registering a plugin object) is kept, and known at the end."""
        pluggy = sys.modules.get("pluggy")
        manager = getattr(pluggy, "PluginManager", None)
        if manager is None or getattr(manager.register, "sandfleet_guard", False):
            return
        real_register = manager.register

        def register(self, plugin, name=None):
            if by_code():  # (one walk of the stack: pytest registers some 50 plugins of its own)
                if not in_conftest():
                    print("sandfleet: the code under test registered a plugin with the test runner inside the "
                          "tests' process; refused", file=sys.stderr, flush=True)
                    raise PermissionError("sandfleet: the code under test may not register a plugin with the test "
                                          "runner")
                by_conftest.add(id(plugin))
            else:
                by_runner.add(id(plugin))
            return real_register(self, plugin, name)

        register.sandfleet_guard = True
        manager.register = register

    def main_module_untrusted():
        """`python -m MODULE` whose MODULE is found in the workdir (a venv's there too): its main program is
        the workdir's, as the console script of a venv there is (seal.c's module_in_workdir, round XXIV)."""
        argv = list(getattr(sys, "orig_argv", None) or [])
        i = 1
        while i < len(argv):
            a = argv[i]
            if not a.startswith("-") or a in ("-", "--") or a.startswith("--") or "c" in a[1:2]:
                return False
            at = a.find("m", 1)
            if at > 0 and not any(ch in a[1:at] for ch in "WX"):
                mod = a[at + 1:] or (argv[i + 1] if i + 1 < len(argv) else "")
                top = mod.split(".")[0]
                try:
                    spec = PathFinder.find_spec(top, [os.getcwd()] + [p for p in sys.path if p]) if top else None
                except (ImportError, OSError, ValueError):
                    return False
                where = spec and (spec.origin if spec.origin not in (None, "namespace") else
                                  next(iter(spec.submodule_search_locations or []), None))
                return bool(where) and code_path(where)
            i += 2 if a in ("-W", "-X") else 1
        return False

    def arm():
        """The exit status of this program is the tests' when its main program is: an _exit the
        code under test makes reports no success (agent/seal.c, seal_exit)."""
        if armed:
            return
        armed.append(1)
        main = sys.modules.get("__main__")
        where = getattr(main, "__file__", None)
        if where is not None and code_path(where):
            return  # the workdir's program (or a root agent's): its exit status is its own
        if main_module_untrusted():
            return  # `python -m pytest` of the agent's venv in the workdir: as its console script, bin/pytest
        seal = seal_lib()
        if seal is not None:
            seal.sandfleet_seal_arm_exit()
        real_exit = os._exit

        def _exit(n):
            if not by_code() and seal is not None:
                seal.sandfleet_seal_sanction_exit()
            real_exit(n)

        os._exit = _exit
        import atexit

        refuse_plugins()
        before.update(((m, a), stamp(v)) for m, a, v in runner_values())
        modules_then.update(m for m, module in list(sys.modules.items()) if m.split(".")[0] in runners and
                            module is not None and not initializing(module))
        if seal is not None:  # the very last: this program finalized, its exit is its own (seal.c, seal_fini)
            atexit.register(seal.sandfleet_seal_finalized)
        atexit.register(runner_intact)  # the first handler of the rest: it runs last of them
        watch_exit_status()

    # Whose SystemExit ends the program. The code under test can raise one inside a call the tests
    # make (solution.answer() raising SystemExit(0) through the grader's frames), and it ends the
    # tests' program with the code's status. Every SystemExit the tests' Python makes is made by the
    # builtins' name or sys.exit, both of them this subclass from here on; one made while the stack
    # is the tests' own (by_code) is theirs, with the status it was made with. As the interpreter
    # ends the program with a SystemExit (it reads .code with no Python frame left), one that is not
    # the tests' -- made by the code under test, or by a way around this class, or its status changed
    # since -- reports no success.
    real_system_exit = SystemExit
    theirs = {}  # id -> (weak reference, status as made): the SystemExits the tests' own code made

    def forget(key):
        return lambda ref: theirs.pop(key, None) if theirs.get(key, (None,))[0] is ref else None

    def mark(exc, status):
        try:
            theirs[id(exc)] = (_weakref.ref(exc, forget(id(exc))), status)
        except TypeError:  # builtins' own class (no weak references): not the tests' by this class
            pass

    class SandfleetSystemExit(real_system_exit):
        def __init__(self, *args):
            real_system_exit.__init__(self, *args)
            if not (armed and by_code()):
                mark(self, real_status.__get__(self))

    SandfleetSystemExit.__module__, SandfleetSystemExit.__name__ = "builtins", "SystemExit"
    SandfleetSystemExit.__qualname__ = "SystemExit"  # tracebacks and pickles read as builtins' own
    real_status = real_system_exit.__dict__["code"]

    def sys_exit(*args):
        if len(args) > 1:
            raise TypeError("exit expected at most 1 argument, got %d" % len(args))
        if not args:
            raise SandfleetSystemExit()
        raise SandfleetSystemExit(*args[0]) if isinstance(args[0], tuple) else SandfleetSystemExit(args[0])

    def exit_status(self):
        """SystemExit.code: as the interpreter ends an armed program, the tests' status or 1."""
        status = real_status.__get__(self)
        if not armed or (type(status) is int and status != 0):
            return status
        try:
            sys._getframe(1)
            return status  # read by Python code: what was raised, as it was
        except ValueError:
            pass
        made = theirs.get(id(self))
        if made is not None and made[0]() is self and made[1] is status:
            return status
        # on the descriptor, and no method of the status called: sys.stderr and the status may be the
        # code under test's objects by now
        shown = repr(status) if type(status) in (int, type(None)) else "..."
        try:
            os.write(2, ("sandfleet: a SystemExit(%s) that the tests did not make ends the tests' process (the "
                         "code under test raised it, or changed it); it exits 1\n" % shown).encode())
        except OSError:
            pass
        return 1

    def set_status(self, value):
        real_status.__set__(self, value)
        if armed and by_code():
            theirs.pop(id(self), None)  # the code under test changed it: no longer the tests'
        else:
            mark(self, real_status.__get__(self))  # the tests' own (a subclass of theirs sets it)

    def watch_exit_status():
        """SystemExit's own .code (a C member) becomes a property, in the type's dictionary, for
        the instances a way around the subclass made too."""
        try:
            import ctypes
            import gc

            gc.get_referents(real_system_exit.__dict__)[0]["code"] = property(exit_status, set_status)
            ctypes.pythonapi.PyType_Modified(ctypes.py_object(real_system_exit))
        except Exception as e:  # an interpreter without it: the subclass alone
            print("sandfleet sitecustomize: SystemExit.code: %s: %s" % (type(e).__name__, e), file=sys.stderr)

    import _weakref
    import builtins

    builtins.SystemExit = SandfleetSystemExit
    sys_exit.__doc__, sys_exit.__name__ = sys.exit.__doc__, "exit"
    sys.exit = sys_exit

    def as_code(handler):
        """A callable the code under test registered, run as the code under test's (by_code)."""
        if not callable(handler):
            return handler

        def run(*args, **kwargs):
            running_code[0] += 1
            try:
                return handler(*args, **kwargs)
            finally:
                running_code[0] -= 1

        return run

    def watch_handlers(seal):
        """In a grader that loaded the workdir's code: a signal handler that code sets runs as its
        own (it would run on top of the tests' stack); a child it forks is kept at once, in the kernel
        (agent/seal.c, sandfleet_seal_keep_self); the exec of the tests' process itself is refused
        unless the tests' own code asks for it."""
        import _signal

        real_signal = _signal.signal

        def signal(signum, handler):
            return real_signal(signum, as_code(handler) if by_code() else handler)

        _signal.signal = signal
        if hasattr(os, "register_at_fork"):
            forked = []

            def child():
                if forked and forked.pop() and seal.sandfleet_seal_keep_self() == 2:
                    demote(seal)

            os.register_at_fork(before=lambda: forked.append(by_code()),
                                after_in_parent=lambda: forked.pop() if forked else None, after_in_child=child)

    def demote(seal):
        """No Landlock, the tests root: from here on this program is the tests' user, in every
        thread (glibc's setresuid does them all)."""
        import ctypes

        seal.sandfleet_seal_uid.restype = ctypes.c_long
        uid = seal.sandfleet_seal_uid()
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        except (OSError, ValueError):
            os.write(2, b"sandfleet: could not run the code under test as the tests' user; stopped\n")
            os._exit(126)

    def go_inside(seal):
        """From here on this program's writes, starts and exits are judged by the stack (by_code): once."""
        if not inside:
            inside.append(1)
            watch_handlers(seal)

    def seal_rewards():
        """This program loads code of the workdir: the seal's rule (agent/seal.c,
        sandfleet_seal_rewards) keeps the reward folders from it, unless it is a grader."""
        if sealed:
            return
        sealed.append(1)
        seal = seal_lib()
        if seal is None:
            return
        arm()
        rc = seal.sandfleet_seal_rewards()
        if rc == 0:
            go_inside(seal)  # a grader: the code runs among the tests' own
        if rc == 2:
            demote(seal)
        if rc in (1, 2):  # kept: the code under test's own HOME, not the tests'
            import ctypes

            seal.sandfleet_seal_code_home.restype = ctypes.c_char_p
            home = seal.sandfleet_seal_code_home()
            if home:
                os.environ["HOME"] = os.fsdecode(home)

    def agents_library(name):
        """A library ctypes loads from the workdir, a shared temporary folder or a memfd (a build of the
        agent's: ctypes.CDLL('/tmp/libsol.so')): its constructor and functions run in this program as
        the workdir's modules do. A bare name (libc.so.6) is the loader's to find in the system's. (Also
        asked of a venv's site folder, round XXIII: its .pth files ran as this program started.)"""
        if "/" not in name:
            return False
        real = os.path.realpath(name)
        return in_workdir(real) or real.startswith(("/tmp/", "/var/tmp/", "/dev/shm/", "/memfd:"))

    def main_compiles():
        """The compile being audited is asked by the main program's code or what it calls: not by
        this guard, not as the interpreter starts (site, .pth files, before the main program runs), and
        not the interpreter's own compile of a -c one-liner (no Python frame asks for it)."""
        try:
            f = sys._getframe(2)  # audit's caller
        except ValueError:  # none: the interpreter's own compile
            return False
        if f.f_code.co_filename == mine:
            return False
        while f is not None:
            if f.f_code.co_filename != mine and f.f_globals.get("__name__") == "__main__":
                return True
            f = f.f_back
        return False

    def watch_strings():
        """This program compiles a string at run time: what it compiles may be the agent's text after a
        transformation -- sympy's sympify of the agent's answer file or of its program's output, a
        template engine, a parser that builds code -- which no comparison of text finds, and which may
        have come through a pipe rather than a file this program opened (round XXI's sympify-*). by_code
        already counts a frame of code compiled from a string as the code under test's; the gates that
        ask it (a start, a write of a kept folder, an _exit, a SystemExit, a signal handler, a fork) now
        ask here too, as in a grader that imported the workdir's code (most graders). Nothing is kept
        from the tests' own frames of the main program."""
        if inside or sealed:
            return  # gated already, or kept whole
        seal = seal_lib()
        if seal is None:
            return
        arm()
        go_inside(seal)

    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    changes = {"os.rename": 2, "os.link": 2, "os.symlink": 2, "os.truncate": 1, "os.remove": 1, "os.rmdir": 1,
               "os.chmod": 1, "os.chown": 1, "os.mkdir": 1, "os.utime": 1, "shutil.rmtree": 1}
    # libc's ways to write, start, signal or end, which the audit events above don't see when the code
    # under test calls them through ctypes (by name: a leading underscore dropped)
    native = frozenset(("open", "open64", "openat", "openat64", "creat", "creat64", "fopen", "fopen64", "freopen",
                        "rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat", "unlink",
                        "unlinkat", "truncate", "truncate64", "syscall", "execve", "execv", "execvp", "execvpe",
                        "execl", "execlp", "fexecve", "fork", "vfork", "clone", "clone3", "system", "popen",
                        "posix_spawn", "posix_spawnp", "kill", "tgkill", "ptrace", "process_vm_writev", "exit",
                        "Exit", "chmod", "chown", "fchmodat", "fchownat", "mkdir", "mkdirat"))
    starts = frozenset(("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn", "os.fork",
                        "os.forkpty", "pty.spawn"))

    def opens_to_write(args):
        """An "open" audit event's (path, mode, flags) ask to write."""
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        mode = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
        return bool(flags & writes) or any(c in mode for c in "wax+")

    def kept(path):
        if isinstance(path, int):
            return False
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        seal = seal_lib()
        return seal is not None and seal.sandfleet_seal_kept(os.fsencode(real)) == 1

    read = {}  # workdir files this program opened to read: their text, once a compile asks (64 at most)
    paths_seen = {}

    def workdir_text(source, name):
        """SOURCE, compiled under NAME (no file: a name the tests gave it), is text of a workdir file
        this program read: exec(compile(open('/app/solution.py').read(), 'solution', 'exec')) runs
        the code under test under a name of the tests' choosing (round X's exec-source-text); so
        does eval() of a file's text, however short."""
        if not read or not name or (not name.startswith("<") and os.path.isfile(name)):
            return False
        return held_in_read(source, both_ways=True)

    def held_in_read(source, both_ways=False, words=False):
        """SOURCE is the whole text of a workdir file this program read (any length), or 16 characters
        at least of it lie in one (and, BOTH_WAYS, one in it: a function cut out, a header added).
        WORDS: a part counts only if it holds a space (a command line, code), never a single word (a
        path, an option), which a file may name without being where it came from."""
        if isinstance(source, bytes):
            source = source.decode("utf-8", "replace")
        if not isinstance(source, str) or not source.strip():
            return False
        source = source.strip()
        part_ok = not words or any(c.isspace() for c in source)
        for path, text in list(read.items()):
            if text is None:
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                    try:
                        text = os.read(fd, 1 << 20).decode("utf-8", "replace").strip()
                    finally:
                        os.close(fd)
                except OSError:
                    text = ""
                read[path] = text
            if text and (source == text or part_ok and min(len(source), len(text)) >= 16 and
                         (source in text or both_ways and text in source)):
                return True
        return False

    def start_from_read(args):
        """A start (os.system's command, an argv's element) whose text is a workdir file's this program
        read: the code under test's, whatever frames asked for it -- a loader that builds calls from the
        file's data (PyYAML's !!python/object/apply:os.system, round XX's yaml-apply-system), a grader
        that runs a command it read there. A path or an option is not text (WORDS)."""
        if not read:
            return False
        for a in args:
            for x in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(x, (str, bytes)) and held_in_read(x, words=True):
                    return True
        return False

    def asked_by_python():
        """The audited event has a Python frame below the hook (not the interpreter's own compile of its
        main script)."""
        try:
            sys._getframe(2)
        except ValueError:
            return False
        return True

    code_ends = (".py", ".pyc", ".pyw", ".so", ".pth")

    # Code the code under test loads from bytes (marshal.loads: a sourceless .pyc it imports, a blob it unmarshals
    # itself, a compiled cache its own loader gives for a source) names whatever file its maker gave it, as code
    # compiled from a string does: pytest's own reports.py, say, whose functions would then replace the runner's as
    # if they were its own (stop 76's runtime-pyc-report-patch, marshal-blob-direct, runtime-loader-forged-cache).
    # Every file name in it, and the source the import system names it after, is the code under test's, as
    # compile's and code.__new__'s are (audit, below). Only the image's own cache of a module's source, read by
    # the import system as it is on disk, is judged by where that source is, as a module compiled from it would be.
    unmarshalling = []
    code_type = type(_sandfleet_guard.__code__)

    def cache_read(data):
        """(the source the import system reads DATA for, or None; whether DATA is that source's own compiled cache
        in the image): the cache in the __pycache__ beside that source (where only who can write the source can
        write), the same bytes, there before the preparation (this guard's own file's time), and no root agent's.
        Not bytes a loader of the code's own gave (the reader then sets every file name in it to the source's it was
        told: stop 76's runtime-loader-forged-cache named pytest's own reports.py), nor a cache the code under test
        wrote as the tests ran (root tests), nor one under a sys.pycache_prefix (an agent's folder, say)."""
        try:
            reader = sys._getframe(2)
        except ValueError:
            return None, False
        if reader.f_code.co_name != "_compile_bytecode" or not reader.f_code.co_filename.startswith("<frozen"):
            return None, False
        source, cached = reader.f_locals.get("source_path"), reader.f_locals.get("bytecode_path")
        if not isinstance(source, str):
            return None, False
        if not isinstance(cached, str) or agent_file(cached):
            return source, False
        try:
            from importlib.util import cache_from_source

            if sys.pycache_prefix is not None or \
                    os.path.abspath(cache_from_source(source)) != os.path.abspath(cached):
                return source, False  # (only the __pycache__ beside the source: the image's, as the source is)
            with open(cached, "rb") as f:
                st = os.fstat(f.fileno())
                same = f.read()[16:] == bytes(data)  # (the reader is given what follows the 16-byte header)
            return source, same and st.st_ctime_ns <= os.stat(__file__).st_ctime_ns
        except (OSError, ValueError, NotImplementedError):
            return source, False

    def code_loaded(data):
        unmarshalling.append(1)
        try:
            import marshal

            todo = [marshal.loads(data)]
        except Exception:  # not code, or not for this Python: nothing of it runs as code
            return
        finally:
            unmarshalling.pop()
        while todo:
            item = todo.pop()
            if isinstance(item, code_type):
                verdicts[item.co_filename] = True
                todo.extend(item.co_consts)
            elif isinstance(item, (tuple, list, frozenset, set)):
                todo.extend(item)
            elif isinstance(item, dict):
                todo.extend(item.values())

    def not_the_codes(target, attr):
        """TARGET's ATTR (a function's code or defaults, an object's class) is not the code under test's to change:
        a function whose code is not its own (the runner's, the tests', the library's: stop 77's
        runner-code-swapped kept the runner's function object and swapped its code), an object or module of the
        test runner's (report-class-assigned gave pytest's reports a class of the code's own)."""
        import types

        if attr != "__class__":
            return isinstance(target, types.FunctionType) and not code_verdict(target.__code__.co_filename)
        if isinstance(target, types.ModuleType):
            name = own_dict(target).get("__name__")
            return isinstance(name, str) and name.split(".")[0] in runners
        return runners_object(target)

    # The runner's own inputs (stop 78): what pytest reads to configure itself -- its ini file (pytest.ini, tox.ini,
    # setup.cfg, pyproject.toml), found in the tests' folder or any folder above it, the filesystem's root too -- is
    # data, not code, and no rule above judged it. A root agent's /pytest.ini whose addopts is --collect-only makes
    # pytest exit 0 having run nothing (root-ini-collect-only); --version, --deselect, a confcutdir of / that loads
    # its conftest do as much. Not knowing which option: a file a root agent changed outside the workdir (the record's
    # rule, agent_input) that the runner's own code opens to read, other than code (which the rules above judge), makes
    # this program's end a failure, said. The workdir's own config is the flagged residual (a repository's).
    stdlib = os.path.dirname(os.__file__) + "/"
    runner_readers = ("_pytest", "pytest", "pluggy", "iniconfig")
    configured = []

    def read_by_runner():
        """The open being audited is the test runner's own: the first frame that is not this file's, the import
        system's or the standard library's (tomllib, configparser, io) runs a module of the runner's, from a file
        of the image's."""
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if not (name == mine or name.startswith("<frozen") or
                    name.startswith(stdlib) and "-packages/" not in name[len(stdlib):]):
                module = f.f_globals.get("__name__")
                return isinstance(module, str) and module.split(".")[0] in runner_readers and \
                    not code_verdict(name)
            f = f.f_back
        return False

    def agent_input(path):
        """PATH, as the runner names it, is a root agent's: its change time, or its link target's, is between the
        record and the preparation. Not agent_file's: that one asks the file a link leads to, and a link of the
        agent's at /pytest.ini leading into the workdir is the workdir's there (a workdir's config, read where the
        runner runs from it, is the flagged residual; not one reached from outside it)."""
        if not agent_window():
            return False
        key = os.path.abspath(os.fsdecode(path))
        got = inputs.get(key)
        if got is None:
            got = not key.startswith(here + "/") and not in_workdir(key) and bool(window[0](os.fsencode(key)))
            if len(inputs) < 4096:
                inputs[key] = got
        return got

    inputs = {}

    def configured_end():
        print("sandfleet: the test runner read %s, a file a root agent changed outside the workdir, as its own "
              "input (its configuration): what it decided is not the tests'; it exits 1" % configured[0],
              file=sys.stderr, flush=True)
        os._exit(1)

    def audit(event, args):
        if event == "open" and window[:1] != [None] and isinstance(args[0], (str, bytes)) and \
                os.fsdecode(args[0]).endswith(code_ends) and not opens_to_write(args) and agent_file(args[0]):
            name = os.path.abspath(os.fsdecode(args[0]))  # (a cache the agent wrote over a source of the image's
            # is never read: from_source_only, below; one read here has no source or the agent's source)
            verdicts[source_of(name)] = True
            if not sealed:
                seal_rewards()
        elif event == "open" and window[:1] != [None] and isinstance(args[0], (str, bytes)) and \
                "_pytest.config" in sys.modules and not os.fsdecode(args[0]).endswith(code_ends) and \
                not opens_to_write(args) and agent_input(args[0]) and read_by_runner():
            if not configured:
                import atexit

                atexit.register(configured_end)  # (registered as pytest configures itself: before any handler of
                # the code under test's, so it runs after them)
            configured.append(os.path.abspath(os.fsdecode(args[0])))
        if event == "compile" or event == "code.__new__":
            if len(args) < 2 or not isinstance(args[1], (str, bytes)):  # (source or code, file name, ...)
                return
            name = os.fsdecode(args[1])
            if event == "compile" and not sealed and name and not name.startswith("<") and untrusted_path(name):
                seal_rewards()  # a workdir file (runpy.run_path)
            elif (inside or running_code[0]) and asked_by_python() and by_code():
                verdicts[name] = True  # code the code under test compiled: whatever file name it gave
                # (not the interpreter's own compile of the main script, which no Python frame asks for:
                # a program inside from its start, round XXIII's venv, would take it for the code's)
            elif event == "compile" and workdir_text(args[0], name):
                verdicts[name] = True  # the workdir's code, whatever name the tests compiled it under
                seal_rewards()
            elif event == "compile" and not inside and name.startswith("<") and not name.startswith("<frozen") \
                    and main_compiles():
                watch_strings()
            return
        if event == "object.__setattr__" and (inside or running_code[0]) and len(args) > 1 and \
                args[1] in ("__code__", "__defaults__", "__kwdefaults__", "__class__") and \
                not_the_codes(args[0], args[1]) and by_code():
            raise PermissionError(13, "sandfleet: the code under test can't change the %s of code that is not its "
                                      "own inside the tests' process" % args[1])
        if event == "marshal.loads" and (inside or running_code[0]) and not unmarshalling and args and \
                isinstance(args[0], (bytes, bytearray, memoryview)) and asked_by_python() and by_code():
            source, genuine = cache_read(args[0])
            if not genuine:
                code_loaded(args[0])
                if source is not None:
                    verdicts[source] = True
            return
        if event == "open" and len(read) < 64 and isinstance(args[0], (str, bytes)):
            if not opens_to_write(args):
                key = os.fsdecode(args[0])
                folder = os.path.dirname(key)
                if not folder.startswith("/"):  # relative to a cwd that may change: not cached
                    inside_workdir = untrusted_path(key)
                else:  # one realpath per folder (an import opens hundreds of files in a few)
                    inside_workdir = paths_seen.get(folder)
                    if inside_workdir is None:
                        inside_workdir = untrusted_path(folder)
                        if len(paths_seen) < 8192:
                            paths_seen[folder] = inside_workdir
                if inside_workdir:
                    read.setdefault(os.path.realpath(key), None)
        if event == "ctypes.dlopen" and not sealed and args and isinstance(args[0], (str, bytes)) and \
                agents_library(os.fsdecode(args[0])):
            seal_rewards()  # native code of the agent's in this program (round XXI's ctypes-lib-*)
            # and what this program starts from now on, however it is started (libc's own system(), a
            # handle the library took to libc): the code under test's (seal.c, native_marked). A mark only
            # ever keeps: nothing is freed by writing it
            os.environ["SANDFLEET_SEAL_NATIVE"] = "1"
        if event == "ctypes.dlsym" and (inside or running_code[0]) and len(args) > 1 and \
                isinstance(args[1], str) and args[1].lstrip("_") in native and by_code():
            raise PermissionError(13, "sandfleet: the code under test can't call libc's %s through ctypes from "
                                      "inside the tests' process" % args[1])
        from_read = event in starts and start_from_read(args)
        if not (inside or running_code[0]):
            if from_read:
                seal = seal_lib()
                if seal is not None:
                    seal.sandfleet_seal_next_start(1)
            elif armed and event == "os.exec" and lib and lib[0] is not None and not by_code():
                lib[0].sandfleet_seal_exec_ok()  # the tests' own code replaces its process
            return
        if event == "open":
            if opens_to_write(args) and kept(args[0]) and by_code():
                raise PermissionError(13, "sandfleet: the code under test can't write here from inside the "
                                          "tests' process", os.fsdecode(args[0]))
        elif event in changes:
            for path in args[:changes[event]]:
                if kept(path) and by_code():
                    raise PermissionError(13, "sandfleet: the code under test can't change this from inside "
                                              "the tests' process", os.fsdecode(path))
        elif event in starts:
            seal = seal_lib()
            if seal is not None:
                code = from_read or by_code()
                seal.sandfleet_seal_next_start(1 if code else 0)
                if event == "os.exec" and not code:
                    seal.sandfleet_seal_exec_ok()  # the tests' own code replaces its process

    class WorkdirModule:
        """A top-level module of the workdir's, imported by a tests' program: a SystemExit it raises
        as it runs is an ImportError (it can't end the tests' runner with a status of its own)."""

        def __init__(self, loader, name):
            self.loader, self.name = loader, name

        def create_module(self, spec):
            return self.loader.create_module(spec)

        def exec_module(self, module):
            try:
                self.loader.exec_module(module)
            except real_system_exit as e:
                raise ImportError("sandfleet: module %s of the workdir raised SystemExit(%r) as it was imported"
                                  % (self.name, e.code)) from None

        def __getattr__(self, attr):
            return getattr(self.loader, attr)

    class SandfleetTrustedFirst:
        """Top-level modules that a trusted sys.path entry has (one of the interpreter's start, or of the
        tests' own folders): from there, first."""

        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if path is not None or "." in name or name in builtin or is_frozen(name):
                return None
            spec = PathFinder.find_spec(name, paths)
            if spec is None:  # a module of the tests' own folders, first too
                own = [p for p in sys.path if p not in paths and tests_entry(p)]
                spec = PathFinder.find_spec(name, own) if own else None
                if spec is not None and name not in shadowed:  # say so where the workdir has one too
                    other = PathFinder.find_spec(name, [p for p in sys.path if not trusted(p)])
                    if other is not None and other.origin != spec.origin:
                        shadowed.add(name)
                        print("sandfleet guard: module %s is the tests' own %s, not the workdir's %s"
                              % (name, spec.origin, other.origin), file=sys.stderr)
            if spec is None:
                found = PathFinder.find_spec(name, [p for p in sys.path if not trusted(p)])
                if found is None:
                    return None
                seal_rewards()  # found in the workdir (or the cwd): the import goes on from there
                if found.loader is not None and hasattr(found.loader, "exec_module"):
                    found.loader = WorkdirModule(found.loader, name)
                return found
            if spec.loader is None:  # a namespace package: of the trusted portions only
                portions = list(spec.submodule_search_locations or ())
                if not portions:
                    return None
                spec.submodule_search_locations = portions  # fixed: not recomputed from sys.path
            elif name == "pickle":
                spec.loader = Patched(spec.loader, name, patch_pickle)
            elif name == "yaml":
                spec.loader = Patched(spec.loader, name, patch_yaml)
            elif name == "pytest":
                spec.loader = Patched(spec.loader, name, patch_pytest)
            elif name == "tempfile" and share_uid is not None:
                spec.loader = Patched(spec.loader, name, patch_tempfile)
            return spec

        @classmethod
        def invalidate_caches(cls):
            return None

    def unpickled(load):
        """An unpickling runs what the data names (__reduce__): the code under test's, while it runs.
        So does a YAML loader's making of a Python object the document names (patch_yaml)."""

        def run(*args, **kwargs):
            running_code[0] += 1
            arm()
            try:
                return load(*args, **kwargs)
            except real_system_exit as e:
                import pickle

                raise pickle.UnpicklingError("sandfleet: the data raised SystemExit(%r) as it was unpickled"
                                             % (e.code,)) from None
            finally:
                running_code[0] -= 1

        return run

    class Patched(WorkdirModule):
        """A module of the standard library's, patched by PATCH once it has run."""

        def __init__(self, loader, name, patch):
            WorkdirModule.__init__(self, loader, name)
            self.patch = patch

        def exec_module(self, module):
            self.loader.exec_module(module)
            self.patch(module)

    def patch_pickle(module):
        module.load, module.loads = unpickled(module.load), unpickled(module.loads)
        module._Unpickler.load = unpickled(module._Unpickler.load)
        base = module.Unpickler
        if base is not module._Unpickler:
            module.Unpickler = type("Unpickler", (base,), {"load": unpickled(base.load), "__module__": "pickle"})

    def patch_yaml(module):
        """PyYAML's full and unsafe loaders call what a document names (!!python/object/apply:os.system,
        /new, /object's __setstate__): each such call is the code under test's, as an unpickling's
        is (round XX's yaml-apply-system and its decoded form, whose command no file holds)."""
        constructor = getattr(module, "constructor", None)
        seen = []
        for cls_name in ("FullConstructor", "UnsafeConstructor", "Constructor"):
            cls = getattr(constructor, cls_name, None)
            if cls is None or cls in seen:  # (Constructor is UnsafeConstructor)
                continue
            seen.append(cls)
            for meth in ("make_python_instance", "set_python_instance_state"):
                fn = vars(cls).get(meth)
                if fn is not None:
                    setattr(cls, meth, unpickled(fn))

    # gVisor's uid split (no Landlock): the tests root, the code under test a user of its own. A
    # folder or file the root tests make with tempfile (0700, 0600) and hand to the code under test
    # is that user's too, as on bwrap, where the tests and the code are one user
    share_uid = os.environ.get("SANDFLEET_SHARED_TMP_UID", "")
    share_uid = int(share_uid) if share_uid.isdigit() and os.geteuid() == 0 else None

    def shared(make, at):
        def run(*args, **kwargs):
            made = make(*args, **kwargs)
            try:
                os.chown(made[at] if at is not None else made, share_uid, -1)
            except (OSError, TypeError, IndexError):
                pass
            return made

        return run

    def patch_tempfile(module):
        module.mkdtemp = shared(module.mkdtemp, None)  # and TemporaryDirectory
        if hasattr(module, "_mkstemp_inner"):  # mkstemp, NamedTemporaryFile
            module._mkstemp_inner = shared(module._mkstemp_inner, 1)

    sys.meta_path.insert(0, SandfleetTrustedFirst)
    sys.addaudithook(audit)

    # A cache a root agent wrote over a source of the image's (a .pyc it forged, or one its own run of Python
    # wrote where the image had none: the official python images ship none) is not read: the module is compiled
    # from the image's source, as where there is no cache. A source the agent changed is read, and is its code.
    from importlib.machinery import ExtensionFileLoader, SourceFileLoader

    get_data = SourceFileLoader.get_data

    def from_source_only(self, path):
        if isinstance(path, str) and path.endswith(".pyc") and agent_file(path):
            source = source_of(os.path.abspath(path))
            if source != path and os.path.isfile(source) and not agent_file(source):
                raise OSError("sandfleet: %s was written by a root agent over the image's source" % path)
        return get_data(self, path)

    SourceFileLoader.get_data = from_source_only
    create_extension = ExtensionFileLoader.create_module

    def agents_extension(self, spec):
        if agent_file(getattr(self, "path", None)):  # native code of the agent's in this program
            seal_rewards()
        return create_extension(self, spec)

    ExtensionFileLoader.create_module = agents_extension

    def cache_is_source(cached, source):
        """The cache CACHED, which a root agent wrote, holds what the image's SOURCE compiles to (its own run of
        Python wrote it where the image had none): the module loaded from it before this guard is the image's."""
        try:
            import marshal

            with open(cached, "rb") as f:
                data = f.read()
            with open(source, "rb") as f:
                code = compile(f.read(), source, "exec", dont_inherit=True)
            return data[16:] == marshal.dumps(code)
        except (OSError, ValueError, SyntaxError, TypeError):
            return False

    def loaded_before():
        """A module this Python loaded as it started (before this guard: the standard library's encodings, a
        .pth file's import) from a file a root agent changed: the code under test ran in this program."""
        if not agent_window():
            return None
        for name, module in list(sys.modules.items()):
            source = getattr(module, "__file__", None)
            cached = getattr(module, "__cached__", None)
            if isinstance(source, str) and agent_file(source):
                return name
            if isinstance(cached, str) and agent_file(cached) and os.path.isfile(cached) and not (
                    isinstance(source, str) and cache_is_source(cached, source)):
                return name
        return None

    agents_module = loaded_before()
    main_script = sys.argv[0] if getattr(sys, "argv", None) else ""
    if agents_module is not None and not (main_script not in ("", "-c", "-m") and os.path.isfile(main_script)
                                          and code_path(main_script)) and not main_module_untrusted():
        verdicts[os.path.abspath(getattr(sys.modules[agents_module], "__file__", "") or agents_module)] = True
        print("sandfleet guard: module %s, loaded as this Python started, is a root agent's (changed since its "
              "first command): the code under test's" % agents_module, file=sys.stderr)
        seal_rewards()

    find_distributions = PathFinder.find_distributions

    def trusted_distributions(*args, **kwargs):
        """Distributions for a scan of them all (entry points: pytest's plugins) come from
        trusted entries only; one asked for by name (its version) is found anywhere."""
        context = args[0] if args else kwargs.get("context")
        named = getattr(context, "name", None) is not None
        for dist in find_distributions(*args, **kwargs):
            where = getattr(dist, "_path", None)
            # (its files too: a folder of a venv the tests trust is theirs, and the agent's new dist-info in it
            # is a folder of theirs whose files are the agent's: round XXVI's image-venv-entry-point)
            if named or where is None or not any(code_path(p) for p in (
                    where, os.path.join(str(where), "entry_points.txt"), os.path.join(str(where), "METADATA"))):
                yield dist

    PathFinder.find_distributions = staticmethod(trusted_distributions)
    # A virtual environment of the agent's (round XXIII: one the tests made in the workdir keeps what the
    # agent planted there): its site folder was processed as this Python started, before this guard, and
    # the import lines of its .pth files ran here. The seal armed such a Python from its first instruction
    # (seal.c, prearm): an exit before this line was the agent's. Where a .pth file of the agent's ran,
    # this program ran the workdir's code, as a grader that imported it does.
    def take_startup():
        """The import lines of the agent's .pth files that the seal kept from running as this Python started
        (agent/seal.c, defer_pth): [(file, line)], taken once."""
        seal = seal_lib()
        get = getattr(seal, "sandfleet_seal_startup", None) if seal is not None else None
        if get is None:
            return []
        import ctypes

        n = ctypes.c_long(0)
        get.restype = ctypes.c_void_p
        at = get(ctypes.byref(n))
        if not at or n.value <= 0:
            return []
        out = []
        for rec in ctypes.string_at(at, n.value).split(b"\n"):
            name, _, line = rec.partition(b"\0")
            if line:
                out.append((os.fsdecode(name), os.fsdecode(line)))
        return out

    def run_startup(lines):
        """Run them as site would have (each file's lines until one fails), now that this guard judges them:
        their frames are compiled from a string, the code under test's (by_code)."""
        failed = set()
        for name, line in lines:
            if name in failed:
                continue
            try:
                _addpackage(os.path.dirname(name), line)
            except Exception:
                failed.add(name)
                import traceback

                print("Error processing line of %s (run after the sandfleet guard):" % name, file=sys.stderr)
                traceback.print_exc()

    def _addpackage(sitedir, line):  # (site's name and local: a namespace .pth reads its caller's sitedir)
        exec(line)

    startup = take_startup()
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix) or startup:
        seal = seal_lib()
        if seal is not None:
            import site

            try:  # (a folder the agent could have written: agents_library's test of a path)
                ran = any(agents_library(d) and any(n.endswith(".pth") for n in os.listdir(d))
                          for d in site.getsitepackages() if os.path.isdir(d))
            except OSError:
                ran = True
            main = sys.argv[0] if getattr(sys, "argv", None) else ""  # (the script as given: no __main__ yet)
            ran = ran or bool(startup)
            if ran and not (main not in ("", "-c", "-m") and os.path.isfile(main) and untrusted_path(main)) \
                    and not main_module_untrusted():
                seal_rewards()  # (armed first: the start-up code runs as the code under test's)
                run_startup(startup)
                # (not where the main program is the workdir's: its exit is its own.) The interpreter's builtins
                # are its own C functions: one that is Python code now was replaced by the agent's start-up code
                # (a stand-in for open that reads the tests the answer they expect): no run of the tests here
                import builtins

                swapped = sorted(n for n, v in vars(builtins).items()
                                 if isinstance(getattr(v, "__code__", None), type(agents_library.__code__)))
                if swapped:
                    os.write(2, ("sandfleet: the code under test replaced builtins.%s as the tests' Python started "
                                 "(a .pth file of the agent's); it exits 1\n" % ", builtins.".join(swapped)).encode())
                    os._exit(1)
            else:
                run_startup(startup)
            seal.sandfleet_seal_guard_loaded()
    spec = PathFinder.find_spec("sitecustomize", paths)  # the image's own, if any
    if spec is not None and spec.loader is not None and isinstance(spec.origin, str):
        # changed since this guard was written (the preparation's time), by nobody the tests trust: the tests never
        # write the image's sitecustomize, and a program of the agent's that they ran as root did (Debian's is in
        # /etc/python3.X, outside what the seal keeps from such a program: tests-plant-sitecustomize). Its code is
        # the code under test's, as a root agent's change to it is (agent_file, on its import)
        try:
            prep = os.stat(__file__).st_ctime_ns
            late = any(st.st_ctime_ns > prep for st in (os.stat(spec.origin), os.lstat(spec.origin)))
        except OSError:
            late = False
        if late:
            verdicts[os.path.abspath(spec.origin)] = True
            verdicts[os.path.realpath(spec.origin)] = True
            print("sandfleet guard: the image's %s changed while the tests ran: the code under test's" % spec.origin,
                  file=sys.stderr)
            seal_rewards()
    if spec is not None and spec.loader is not None:
        import importlib.util

        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


try:
    _sandfleet_guard()
except Exception as e:  # never break the tests' Python
    import sys

    print("sandfleet sitecustomize: %s: %s" % (type(e).__name__, e), file=sys.stderr)
del _sandfleet_guard
'''


def python_env(env: Mapping[str, str], guard_dir: str, workdir: str, tests_dirs: Sequence[str] = ()) -> dict[str, str]:
    """``PYTHONPATH`` with the guard folder first (then what ``env`` had), the workdir named
    untrusted, and the tests' own folders named (their modules before the workdir's)."""
    old = env.get("PYTHONPATH", "")
    out = {"PYTHONPATH": guard_dir + (":" + old if old else ""), "SANDFLEET_UNTRUSTED": posixpath.normpath(workdir)}
    if tests_dirs:
        out["SANDFLEET_TESTS_DIRS"] = ":".join(posixpath.normpath(d) for d in tests_dirs)
    return out
