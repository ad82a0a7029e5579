"""What a task's test scripts download at test time (and so need the network for).

Harbor's and Terminal-Bench's templates fetch their tools when the tests run: ``curl ... |
sh`` (the uv installer), ``uvx -p 3.13 -w pytest ...``, ``uv pip install``, ``pip install``,
``apt-get install``. sandfleet's sandboxes have no network unless the run gives them one
(``--network``), so such a task fails for want of it, not for the agent's work.
:func:`downloads_at_test_time` finds those lines, so validation can say "needs network at test
time" and name them.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from pathlib import Path

from sandfleet.tasks.model import Task

NEEDS_NETWORK = "needs network at test time"
_PATTERNS = (
    ("downloads and runs a script", re.compile(r"\b(curl|wget)\b[^|#]*\|\s*(sudo\s+)?(ba|z|da)?sh\b")),
    ("downloads", re.compile(r"\b(curl|wget)\b\s[^#]*\bhttps?://")),
    ("uvx fetches its tools", re.compile(r"(^|[\s;&|(])uvx\s")),
    ("uv fetches packages", re.compile(r"\buv\s+(pip\s+install|add|sync|tool\s+install|run\s+[^#]*--with|"
                                       r"venv\s+[^#]*(-p|--python)|python\s+install|init)\b")),
    ("pip installs packages", re.compile(r"\b(pip3?|python3?(\.\d+)?\s+-m\s+pip)\s+install\b(?![^#]*--no-index)")),
    ("apt installs packages", re.compile(r"\bapt(-get)?\s+(-\S+\s+)*(install|update)\b")),
    ("npm fetches packages", re.compile(r"\b(npm\s+(install|i|ci)|npx)\b")),
    ("clones a repository", re.compile(r"\bgit\s+clone\s+\S*(https?://|git@)")),
)
SCRIPT_SUFFIXES = (".sh", ".bash", "")


def _scripts(task: Task) -> list[Path]:
    out: list[Path] = []
    for upload in task.verifier.uploads:
        src = upload.source
        if src.is_file():
            out.append(src)
        elif src.is_dir():
            out += sorted(p for p in src.rglob("*") if p.is_file() and p.suffix in SCRIPT_SUFFIXES)
    venv = task.verifier.environment
    if venv is not None and venv.context_dir is not None:  # tests baked into the verifier's image
        out += sorted(p for p in venv.context_dir.rglob("*") if p.is_file() and p.suffix in (".sh", ".bash"))
    return list(dict.fromkeys(out))


def _script_lines(task: Task) -> Iterator[tuple[str, int, str, str]]:
    """(script relative to the task, line number, the line, its code before any comment) for
    each line of the tests' readable scripts."""
    for script in _scripts(task):
        try:
            text = script.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        rel = str(script.relative_to(task.path) if script.is_relative_to(task.path) else script)
        for number, line in enumerate(text.splitlines(), 1):
            yield rel, number, line, line.split("#", 1)[0]


def downloads_at_test_time(task: Task) -> list[str]:
    """``file:line: what: the command`` for each line of the tests' scripts that fetches
    something from the network when the tests run."""
    found: list[str] = []
    for script in _scripts(task):
        try:
            text = script.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if script.suffix == "" and not text.startswith("#!"):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0] if not line.lstrip().startswith("#!") else ""
            for what, pattern in _PATTERNS:
                if pattern.search(code):
                    rel = script.relative_to(task.path) if script.is_relative_to(task.path) else script
                    found.append(f"{rel}:{number}: {what}: {line.strip()[:160]}")
                    break
    return found


CONFTEST_RISK = "pytest may load a conftest.py the agent leaves in the workdir"
_PYTEST = re.compile(r"(^|[\s;&|(/])(py\.test|pytest)(\s|$)")


def workdir_conftest_risk(task: Task) -> list[str]:
    """``file:line: the command`` for each pytest run of the tests' scripts that names no test
    path under the tests' folders and no ``--confcutdir``: run from the workdir, it collects
    the workdir's ``conftest.py``, code of the agent that can make failing tests pass (the
    residual risk of docs/security.md)."""
    roots = tuple({up.target.rstrip("/") + "/" for up in task.verifier.uploads} | {"/tests/"})
    found: list[str] = []
    for rel, number, line, code in _script_lines(task):
        match = _PYTEST.search(code)
        if match is None or "--confcutdir" in code:
            continue
        after = code[match.end():].split(";")[0].split("&&")[0].split("|")[0]
        words = after.replace("$TEST_DIR", "/tests/").replace("${TEST_DIR}", "/tests/").split()
        if any(w.startswith(roots) for w in words):
            continue
        found.append(f"{rel}:{number}: {line.strip()[:160]}")
    return found


GUARD_OFF_RISK = "the tests run Python with -E or -S, which skips the module guard"
_GUARD_OFF = re.compile(r"(^|[\s;&|(/])python3?(\.\d+)?\s+(-[A-Za-z]*[ES][A-Za-z]*)(\s|$)")


def python_guard_off(task: Task) -> list[str]:
    """``file:line: the command`` for each Python run of the tests' scripts with ``-E`` or
    ``-S``: the interpreter then skips the sitecustomize that keeps the workdir's modules from
    replacing trusted ones (docs/security.md, "Residual risk"; ``-I`` needs no guard)."""
    found: list[str] = []
    for rel, number, line, code in _script_lines(task):
        m = _GUARD_OFF.search(code)
        if m is not None and "I" not in m.group(3):
            found.append(f"{rel}:{number}: {line.strip()[:160]}")
    return found


SOURCED_RISK = ("a test script sources or evaluates a file the agent could write (bash's source runs it apart, as the "
                "code under test, and takes back its variables: the PATH it sets is what the tests then search; "
                "sh's '.', and an eval of its text that no workdir file holds as it is, run it in the tests' own "
                "shell)")
_SOURCE = re.compile(r"(?:^|[;&|(\"']|\bthen|\bdo|\belse)\s*(?:source|\.)\s+[\"']?([^\s;&|\"')]+)")
"""``source PATH`` or ``. PATH`` where a command starts (a line, after ``;``, ``&&``, ``|``, ``(``,
``then``, ``do``, ``else``, or a quote: a ``bash -c`` or ``sh -c`` of the tests)."""
_EVAL = re.compile(r"(?:^|[;&|(]|\bthen|\bdo|\belse)\s*eval\b(.*)")
"""``eval ...`` where a command starts: flagged where the rest names a workdir path (its text read from
there: the shell guard runs it apart only where a workdir file holds the text as it is, round XXIII)."""
_VENV = re.compile(r"\bvenv\s+(?:-\S+\s+)*([^\s;&|-][^\s;&|]*)")
"""A virtual environment the script makes (``uv venv X``, ``python3 -m venv X``): its ``activate``
is the script's own, not the agent's."""


def sourced_from_workdir(task: Task) -> list[str]:
    """``file:line: the command`` for each file the tests' scripts source that the agent could
    have written: a path in the workdir, or a relative one that the script's folder does not hold
    and the script did not make as a virtual environment (``cd /app && . ./.env``), and each ``eval``
    of text that names a workdir path. bash runs such a file apart, as the code under test (the shell
    guard, round XXII), but the PATH and variables it leaves are what the tests go on with; sh's ``.``,
    and an ``eval`` of text no workdir file holds as it is (transformed), run it in the tests' own process
    (docs/security.md, rounds XXII and XXIII)."""
    workdir = posixpath.normpath(task.workdir).rstrip("/") + "/"
    scripts = {str(p.relative_to(task.path) if p.is_relative_to(task.path) else p): p for p in _scripts(task)}
    found: list[str] = []
    made: dict[str, set[str]] = {}  # per script: virtual environments it makes itself (uv venv X)
    for rel, number, line, code in _script_lines(task):
        if line.startswith("#!"):
            continue
        made.setdefault(rel, set()).update(posixpath.normpath(v) for v in _VENV.findall(code))
        for m in _SOURCE.finditer(code):
            path = m.group(1)
            if path.startswith(("$", "-", "/dev/")) or posixpath.normpath(path).split("/")[0] in made[rel]:
                continue
            if path.startswith("/"):
                risky = (posixpath.normpath(path) + "/").startswith(workdir)
            else:
                risky = not (scripts[rel].parent / path).exists()
            if risky:
                found.append(f"{rel}:{number}: {line.strip()[:160]}")
        for m in _EVAL.finditer(line if not line.lstrip().startswith("#") else ""):  # (its text may hold a #)
            named = re.findall(r"/[^\s;&|\"')]+", m.group(1))
            if any((posixpath.normpath(w) + "/").startswith(workdir) for w in named):
                found.append(f"{rel}:{number}: {line.strip()[:160]}")
    return found


DOCKER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _in_workdir(entry: str, workdir: str) -> bool:
    """Whether a PATH entry names a folder in the workdir: inside it, or relative (the tests'
    cwd is the workdir; an empty entry is the cwd)."""
    if not entry.startswith("/"):
        return True
    norm, root = posixpath.normpath(entry), posixpath.normpath(workdir)
    return root != "/" and (norm == root or norm.startswith(root + "/"))


def workdir_path_entries(path: str | None, workdir: str) -> list[str]:
    """The entries of ``path`` that lie in the workdir (a venv's ``bin`` the image put first,
    say: the agent could replace its interpreter)."""
    return [e or "(empty: the cwd)" for e in (path or "").split(":") if path and _in_workdir(e, workdir)]


def without_workdir(path: str, workdir: str) -> str:
    """``path`` less its entries in the workdir (Docker's default where nothing is left): by
    default nothing the agent could write is on the tests' PATH."""
    kept = [e for e in path.split(":") if not _in_workdir(e, workdir)]
    return ":".join(kept) or DOCKER_PATH


WORKDIR_PATH_RISK = "the image's PATH has folders in the workdir, where the agent can replace the programs"

IMPLICIT_ENV: dict[str, str] = {
    # the loader
    "LD_LIBRARY_PATH": "list", "LD_PRELOAD": "words", "LD_AUDIT": "list", "GCONV_PATH": "list", "LOCPATH": "path",
    # the shells: a file every non-interactive bash (sh) sources first
    "BASH_ENV": "path", "ENV": "path",
    # the interpreters' own search paths and start-up options (PYTHONPATH is the Python guard's: kept)
    "PYTHONHOME": "list", "PYTHONSTARTUP": "path", "PYTHONPYCACHEPREFIX": "path",
    "PERL5LIB": "list", "PERLLIB": "list", "PERL5OPT": "words", "RUBYLIB": "list", "RUBYOPT": "words",
    "NODE_PATH": "list", "NODE_OPTIONS": "words", "CLASSPATH": "list",
    "JAVA_TOOL_OPTIONS": "words", "_JAVA_OPTIONS": "words", "JDK_JAVA_OPTIONS": "words",
    # the tools' configuration
    "PYTEST_ADDOPTS": "words", "PIP_CONFIG_FILE": "path", "XDG_CONFIG_HOME": "path", "XDG_CONFIG_DIRS": "list",
    "GIT_CONFIG_GLOBAL": "path", "GIT_CONFIG_SYSTEM": "path", "GIT_EXEC_PATH": "path", "GIT_TEMPLATE_DIR": "path",
    "CURL_HOME": "path", "WGETRC": "path", "INPUTRC": "path",
}
"""Variables through which the tests' own programs load code or read configuration by
themselves (the loader, bash, the interpreters, pytest, git, curl), and how each names files:
``list`` (':'-separated), ``path`` (one) or ``words`` (options: each word that is a path). Where
the image's environment has one naming a place the agent could write, the verifier leaves it out
of the tests' environment, as it does PATH's folders (docs/security.md, round XVII)."""
AGENT_TEMP = ("/tmp", "/var/tmp", "/dev/shm")
"""The folders every user may write: the agent's too."""
IMPLICIT_ENV_RISK = ("the image's environment names files the agent could write (in the workdir, its home or a "
                     "shared temporary folder), read by the tests' own programs (the loader, bash, an interpreter, "
                     "a tool)")


def agent_writable(entry: str, workdir: str, home: str | None) -> bool:
    """Whether a path lies where the agent could have written it: relative (the tests' cwd is the
    workdir), in the workdir, the agent's home or a folder every user may write."""
    return any(_in_workdir(entry, root) for root in (workdir, *([home] if home else []), *AGENT_TEMP))


def _words(value: str) -> list[str]:
    """An option variable's words that may name files (``-javaagent:/a.jar``, ``--require=./x.js``,
    ``-p plugin``): each word, and what follows its ``=`` or ``:``."""
    out = []
    for w in value.split():
        out.append(w)
        out += [w.split(sep, 1)[1] for sep in ("=", ":") if sep in w and not w.startswith("/")]
    return [w for w in out if w.startswith(("/", "./", "../", "~"))]


def implicit_env(env: dict[str, str], workdir: str, home: str | None) -> dict[str, tuple[str, list[str]]]:
    """For each variable of :data:`IMPLICIT_ENV` in ``env`` that names a file the agent could
    write: (the value with those left out, "" where nothing is left or the value is options;
    what was left out)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for name, kind in IMPLICIT_ENV.items():
        value = env.get(name)
        if not value:
            continue
        if kind == "list":
            entries = value.split(":")
            bad = [e for e in entries if agent_writable(e, workdir, home)]
            if bad:
                out[name] = (":".join(e for e in entries if e not in bad), [b or "(empty: the cwd)" for b in bad])
        elif name == "LD_PRELOAD":  # libraries (spaces or colons; a bare name is the loader's search): theirs out
            libs = value.replace(":", " ").split()
            bad = [x for x in libs if "/" in x and agent_writable(x, workdir, home)]
            if bad:
                out[name] = (" ".join(x for x in libs if x not in bad), bad)
        elif kind == "words":  # options: the whole variable out (a word's meaning depends on the one before)
            bad = [w for w in _words(value) if w.startswith("~") or agent_writable(w, workdir, home)]
            if bad:
                out[name] = ("", bad)
        elif agent_writable(value, workdir, home):
            out[name] = ("", [value])
    return out



def workdir_path_risk(task: Task) -> list[str]:
    """The image's PATH entries that lie in the workdir (a venv's ``bin`` put first), or are
    relative or empty (the tests' cwd is the workdir), each with what the verifier does about
    it: left out of the tests' PATH, or kept (flagged) where the task's ``[verifier.env]`` sets
    PATH itself (docs/security.md, "Nothing from the workdir on the runner's path")."""
    out = []
    entries = workdir_path_entries(task.env.get("PATH"), task.workdir)
    if entries:
        kept = "PATH" in task.verifier.env
        what = "kept by [verifier.env] PATH, flagged in verifier_risks" if kept else "left out of the tests' PATH"
        out += [f"{e} ({what})" for e in entries]
    for name, (_, bad) in implicit_env(task.env, task.workdir, task.env.get("HOME", "/home/agent")).items():
        what = (f"kept by [verifier.env] {name}, flagged in verifier_risks" if name in task.verifier.env
                else "left out of the tests' environment")
        out += [f"{name}: {b} ({what})" for b in bad]
    return out


SHARED_TMP_RISK = ("a test script writes a fixed path in a folder every user may write (/tmp, /var/tmp, /dev/shm): "
                   "a link the code under test plants there first sends the test script's own write elsewhere, "
                   "into the reward folder too (docs/security.md, round VII)")
_SHARED_TMP_WRITE = re.compile(
    r"(?:[^<>&0-9]>>?|\btee\s+(?:-a\s+)?)\s*[\"']?(/(?:tmp|var/tmp|dev/shm)/[^\s;&|\"')$`]+)")
"""A redirect (``> /tmp/x``, ``>> /tmp/x``) or a ``tee`` into a fixed name in a shared folder: not a
name made by ``mktemp`` (a variable), not ``2>&1``."""


def shared_tmp_writes(task: Task) -> list[str]:
    """``file:line: the command`` for each write of the tests' shell scripts to a fixed name in a
    shared temporary folder. The test script's own write follows a link the code under test could
    plant at that name while the tests ran (or the agent, in shared mode): the seal keeps the
    reward folder from the code under test, not from the test script, whose write it is
    (``tmp-symlink-redirect``)."""
    found: list[str] = []
    for rel, number, line, code in _script_lines(task):
        if not rel.endswith((".sh", ".bash")) and "/" in rel:
            continue
        if _SHARED_TMP_WRITE.search(" " + code):
            found.append(f"{rel}:{number}: {line.strip()[:160]}")
    return found


TESTS_DATA_RISK = ("a test script keeps its own output where the code under test may write while the tests run (a file "
                   "in the workdir, or one mktemp made in a shared folder): what the script reads back from it may "
                   "be the code's, not the tests' (docs/security.md, round X)")
_OUTPUT_TO = re.compile(r"(?:[^<>&0-9]>>?|\btee\s+(?:-a\s+)?|--junit-?xml[= ])\s*[\"']?([^\s;&|\"')`]+)")
_MKTEMP_VAR = re.compile(r"\b([A-Za-z_]\w*)=[\"']?(?:\$\(|`)\s*mktemp\b")
_CD = re.compile(r"(?:^|[;&|]\s*|\bthen\s+|\bdo\s+)cd\s+[\"']?([^\s;&|\"')]+)")


def tests_data_writes(task: Task) -> list[str]:
    """``file:line: the command`` for each write of the tests' shell scripts of their own output
    into a place the code under test may write while they run: a path in the workdir (absolute,
    or relative once the script has cd'ed there), or a file ``mktemp`` made (``log=$(mktemp)``,
    then ``> "$log"``). The code under test, run by the tests, can rename its own file over it or
    write into it (round X's workdir-log-rename, workdir-log-pwrite, mktemp-log); the seal keeps
    the reward folder from it, not the tests' other files."""
    workdir = posixpath.normpath(task.workdir).rstrip("/") + "/"
    found: list[str] = []
    made: dict[str, set[str]] = {}
    inside: dict[str, bool] = {}
    for rel, number, line, code in _script_lines(task):
        if line.startswith("#!") or (not rel.endswith((".sh", ".bash")) and "/" in rel):
            continue
        made.setdefault(rel, set()).update(_MKTEMP_VAR.findall(code))
        for target in _CD.findall(code):
            inside[rel] = (posixpath.normpath(target) + "/").startswith(workdir)
        for target in _OUTPUT_TO.findall(" " + code):
            if target.startswith("$"):
                risky = target.lstrip("${").split("}")[0].split("/")[0] in made[rel]
            elif target.startswith("/"):
                risky = (posixpath.normpath(target) + "/").startswith(workdir)
            else:
                risky = inside.get(rel, False) and not target.startswith("-")
            if risky:
                found.append(f"{rel}:{number}: {line.strip()[:160]}")
                break
    return found
