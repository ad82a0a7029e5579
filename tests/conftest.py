"""Shared fixtures: backends to parametrize over, skipped with the reason where the host lacks them."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import re
import shutil
import sys
import textwrap
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

# hypothesis's pytest plugin imports hypothesis at the end of a run if no test did; under
# CPython 3.11.7 that late import (assertion-rewritten, deep in pluggy's stack) can die with
# "AST constructor recursion depth mismatch". Importing it here, early, avoids that.
try:
    import hypothesis  # noqa: F401
except ImportError:  # pragma: no cover
    pass

from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox
from sandfleet.sandbox.registry import is_isolated
from sandfleet.sandbox.spec import BACKENDS as SPEC_BACKENDS


def backend_skip(name: str) -> str | None:
    if name == "bwrap":
        if not shutil.which("bwrap"):
            return "bubblewrap not installed (apt-get install bubblewrap)"
        if os.geteuid() != 0:
            return "the bwrap backend needs root"
    if name == "gvisor":
        if not shutil.which("runsc"):
            return "gVisor not installed (apt-get install runsc)"
        if os.geteuid() != 0:
            return "the gvisor backend needs root"
        if os.environ.get("SANDFLEET_TEST_GVISOR") == "0":
            return "gvisor tests turned off (SANDFLEET_TEST_GVISOR=0)"
    if name == "microvm":
        if os.environ.get("SANDFLEET_TEST_MICROVM") == "0":
            return "microvm tests turned off (SANDFLEET_TEST_MICROVM=0)"
        try:
            from sandfleet.doctor import report

            b = report()["backends"]["microvm"]
            if not b["available"]:
                return str(b["reason"])
        except Exception as e:  # pragma: no cover
            return f"microvm unavailable: {e}"
    return None


def sandbox_cgroups(parent: str) -> list[str]:
    """The sandbox cgroups (``sf-*``) under the cgroup parent ``parent`` of every controller
    this host mounts. Looks only there: a walk of all of /sys/fs/cgroup meets other tests'
    cgroups as they go away (a FileNotFoundError mid-walk)."""
    from sandfleet.sandbox import cgroups

    return sorted(str(p) for root in set(cgroups.detect().mounts.values()) for p in (root / parent).glob("sf-*"))


BACKENDS = list(SPEC_BACKENDS)  # every backend (sandfleet/sandbox/registry.py), process first
ISOLATED_BACKENDS = [b for b in BACKENDS if is_isolated(b)]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    why = backend_skip(request.param)
    if why:
        pytest.skip(why)
    return str(request.param)


@pytest.fixture(params=ISOLATED_BACKENDS)
def isolated_backend(request: pytest.FixtureRequest) -> str:
    why = backend_skip(request.param)
    if why:
        pytest.skip(why)
    return str(request.param)


@pytest.fixture
async def sb(backend: str) -> AsyncIterator[Sandbox]:
    box = await create_sandbox(backend=backend, ttl_s=300)
    try:
        yield box
    finally:
        await box.close()


@pytest.fixture
async def isb(isolated_backend: str) -> AsyncIterator[Sandbox]:
    box = await create_sandbox(backend=isolated_backend, ttl_s=300, memory_mib=256, pids=128)
    try:
        yield box
    finally:
        await box.close()


@pytest.fixture(scope="session")
def python_base_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory (``SANDFLEET_CACHE``) for the tests that build task images FROM
    python:3.11-slim-bookworm in a cache away from the user's: its debootstrap base (85-99 s
    each on 2 busy cores, 5 tests, 38 % of a loaded fast pass) is made once per run, not once
    per test. Their images and build directories go in it too; each test's Dockerfile differs.
    It starts with a link to each complete base image of this host's cache (``own_cache``: never
    changed after, no task image), so where this host already has that base, no test pays its
    debootstrap (66 s of the fast pass's slowest test on 2026-12-03); on a fresh host the first one does."""
    from sandfleet.server.testing import own_cache

    d = tmp_path_factory.mktemp("python-base-cache")
    own_cache(d)
    return d


@pytest.fixture
def with_python_base_cache(python_base_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """:func:`python_base_cache` as this test's ``SANDFLEET_CACHE``."""
    monkeypatch.setenv("SANDFLEET_CACHE", str(python_base_cache))
    return python_base_cache


class RunningServices:
    """The ``sandfleet serve`` processes a test session shares (issue 43): one per set of
    arguments, started when a module first asks for it and stopped (drained) at the end of the
    session. Each module gets a view of it with two tokens no other module holds, so what one
    module creates is not in another's listings, quota or sandbox ids (the service keeps them per
    token); /metrics and serve.log are the whole service's (read them before and after, or start
    a service of the module's own). A module that needs flags of its own, a service it stops or
    kills, or an empty service (leftovers after it ends) starts its own with ``running_service``."""

    TOKENS = 128

    def __init__(self, root: Path):
        self.root = root
        self.started: dict[tuple[str, ...], Any] = {}
        self.handed: dict[tuple[str, ...], int] = {}

    def view(self, *args: str) -> Any:
        """The shared service of ``args`` (started if it is not running), with two tokens of this
        module's own."""
        import dataclasses

        from sandfleet.server.testing import start_service, write_tokens

        svc = self.started.get(args)
        if svc is None or svc.proc.poll() is not None:
            d = self.root / f"service-{len(self.started)}-{svc is not None}"
            d.mkdir(parents=True)
            tokens = write_tokens(d / "tokens", self.TOKENS)
            svc = self.started[args] = start_service(d, args=args, tokens=tokens)
            self.handed[args] = 0
        i = self.handed[args]
        if i + 2 > len(svc.tokens):
            raise RuntimeError(f"the shared service {args} has handed out all its {self.TOKENS} tokens")
        self.handed[args] = i + 2
        return dataclasses.replace(svc, tokens=svc.tokens[i:i + 2])

    def stop(self) -> None:
        for svc in self.started.values():
            svc.stop()


@pytest.fixture(scope="session")
def running_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServices]:
    """:class:`RunningServices`: ``running_services.view("--max-ttl", "900")`` in a module's fixture."""
    services = RunningServices(tmp_path_factory.mktemp("services"))
    try:
        yield services
    finally:
        services.stop()


# --- the quick tier (scripts/test.sh --quick) --------------------------------------------------
# A test that starts a sandbox or a server gets the `sandbox` marker, found here from the source
# of the test, of the fixtures it uses and of the helpers they call (in its module, and in the
# test-side modules it imports from: support.py, test_rollout_support.py, ...). The quick tier runs
# `-m "not sandbox and ..."` with SANDFLEET_QUICK_GUARD=1: then tests/quickguard/sitecustomize.py
# fails any test that starts one after all (bwrap, runsc, QEMU, the guest agent, unshare, crun,
# podman, sandfleet serve, chromedriver, a listening TCP socket), in this process or in a Python it
# starts, which is how a misclassified test shows. Mark one by hand with @pytest.mark.sandbox where
# the classifier misses it.

TESTS = Path(__file__).resolve().parent
SANDBOX_FIXTURES = frozenset({"sb", "isb", "backend", "isolated_backend", "python_base_cache",
                              "with_python_base_cache", "running_services"})
"""Fixtures (above) that start a sandbox or build an image."""
STARTS = re.compile(
    r"create_sandbox|SyncSandbox|AsyncSandbox|Sandbox\(|sandbox_from|start_service|run_suite|run_group"
    r"|validate_tasks|validate_backends|WarmPool|\bserve\b|agent_binary|uvicorn|HTTPServer|socketserver"
    r"|\.listen\(|create_server|start_server|\bbwrap\b|\brunsc\b|\bgvisor\b|\bmicrovm\b|qemu|debootstrap"
    r"|build_image|ensure_image|sandfleet-agent|template_fd|\bcrun\b|\bpodman\b|FakeModelServer|model-server"
    r"|SandboxFleet"
    r"|run_bench|resolve_backend|running_service|RunningService|\bunshare\b|webdriver|chromedriver"
    # the CLI commands that start sandboxes: sandfleet run --tasks, tasks validate, sandbox run/create/exec
    r"""|--backend["'], ["']process|backend=["']process|["']validate["']|["']sandbox["'], ["'](run|create|exec)"""
    r"""|["']run["'], ["']--tasks""")
"""Words in a test's source that say it may start a sandbox or a server (the classifier errs this way:
a test it wrongly keeps out of the quick tier still runs in the full one)."""


class _Module:
    """Top-level names of a test-side module that start a sandbox or a server (fixpoint over the
    module's functions, classes and assignments, and names imported from other test-side modules)."""

    _cache: dict[Path, _Module] = {}

    def __init__(self, path: Path):
        self.flagged: set[str] = set()
        self.modules: dict[str, _Module] = {}  # local name -> an imported test-side module
        self.functions: dict[int, ast.AST] = {}  # first line (decorators included) -> every def in the module
        self.lines: list[str] = []
        _Module._cache[path] = self
        try:
            source = path.read_text()
            tree = ast.parse(source)
        except (OSError, SyntaxError):
            return
        self.lines = source.splitlines()
        self.functions = {_first_line(n): n for n in ast.walk(tree)
                          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        defs: dict[str, ast.AST] = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        defs[t.id] = node
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                other = _Module.find(node.module, path)
                if other is not None:
                    for a in node.names:
                        if a.name in other.flagged:
                            self.flagged.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    other = _Module.find(a.name, path)
                    if other is not None:
                        self.modules[a.asname or a.name] = other
        texts = {name: self.text(node) for name, node in defs.items()}
        refs = {name: _names(node) for name, node in defs.items()}
        self.flagged |= {name for name, text in texts.items() if STARTS.search(text)}
        while True:
            more = {name for name in defs if name not in self.flagged and self.uses(refs[name])}
            if not more:
                break
            self.flagged |= more

    def text(self, node: ast.AST) -> str:
        return "\n".join(self.lines[_first_line(node) - 1:node.end_lineno])  # type: ignore[attr-defined]

    def uses(self, names: set[str]) -> bool:
        if names & self.flagged:
            return True
        return any(m in self.modules and attr in self.modules[m].flagged
                   for m, _, attr in (n.partition(".") for n in names if "." in n))

    @classmethod
    def of(cls, path: Path) -> _Module:
        path = path.resolve()
        return cls._cache.get(path) or cls(path)

    @classmethod
    def find(cls, module: str, importer: Path) -> _Module | None:
        """The test-side module ``module`` (imported from ``importer``), or None."""
        rel = module.removeprefix("tests.").replace(".", "/") + ".py"
        for base in (importer.parent, TESTS):
            p = (base / rel).resolve()
            if p.is_file() and TESTS in p.parents:
                if p in cls._cache:
                    return cls._cache[p]
                return cls.of(p)
        return None


def _first_line(node: ast.AST) -> int:
    """The first line of a definition, its decorators included."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])  # type: ignore[attr-defined]


def _names(node: ast.AST) -> set[str]:
    """Names and ``name.attr`` pairs a piece of code refers to."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            out.add(f"{n.value.id}.{n.attr}")
    return out


_starts_cache: dict[object, bool] = {}


def _starts(fn: object) -> bool:
    """Whether the function ``fn`` (a test or a fixture, defined under tests/) may start a sandbox or a server."""
    fn = inspect.unwrap(fn)  # type: ignore[arg-type]
    key = getattr(fn, "__code__", fn)
    if key not in _starts_cache:
        _starts_cache[key] = _starts_uncached(fn)
    return _starts_cache[key]


def _starts_uncached(fn: object) -> bool:
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    path = Path(code.co_filename).resolve()
    if TESTS not in path.parents:
        return False
    module = _Module.of(path)
    node = module.functions.get(code.co_firstlineno)
    if node is None:  # not found where Python says it starts: read it as inspect does
        try:
            node = ast.parse(textwrap.dedent(inspect.getsource(fn)))  # type: ignore[arg-type]
            source = ast.unparse(node)
        except (OSError, TypeError, SyntaxError):
            return True
    else:
        source = module.text(node)
    return bool(STARTS.search(source)) or module.uses(_names(node))


def _is_sandbox_test(item: pytest.Item) -> bool:
    if item.get_closest_marker("sandbox"):
        return True
    fixturenames = set(getattr(item, "fixturenames", ()))
    if fixturenames & SANDBOX_FIXTURES:
        return True
    fn = getattr(item, "function", None)
    if fn is None:
        return False
    if STARTS.search(getattr(item, "name", "")) or _starts(fn):
        return True
    cls = getattr(item, "cls", None)
    if cls is not None and any(_starts(getattr(cls, m)) for m in ("setup_method", "setup_class") if hasattr(cls, m)):
        return True
    info = getattr(item, "_fixtureinfo", None)
    for name in fixturenames:
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs and _starts(defs[-1].func):
            return True
    return False


# The whole suite's fast pass runs on pytest-xdist's workers (scripts/test.sh, issue 43), a module
# to a worker; these modules run after it, alone (the `serial` marker): their assertions are about
# time, load or the host's limits, or they kill a sandbox's owner and look at what it left, which
# another worker's `sandfleet serve` (its start reaps dead owners' sandboxes) or reaper may take
# first (seen: test_microvm.py::test_killed_owner_leaves_no_vm found no marker).
SERIAL_MODULES = frozenset({
    "test_bench_figures", "test_bench_idle", "test_bench_peers", "test_bench_rollout", "test_bench_soak",
    "test_cgroups_throttle", "test_contention", "test_figures_e2e", "test_sandbox_many_fds",
    "test_service_load", "test_uid_slots", "test_validate_under_load", "test_sandbox_faults",
    "test_microvm", "test_gvisor", "test_leaks", "test_soak",
    # (not test_bench_run: its figures are printed, its assertions are about their form and cleanup, and its
    # throttle of 0.1 CPU is far under what a busy host leaves a command; 35-45 s of the serial parts, issue 43)
    # compares two sandboxes' mount tables: one made while another worker's sandbox holds the
    # canonical uid slot gets a shifted one (an rwmap upper layer, another uid) and they differ
    "test_launcher",
})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: runs alone, after the fast pass's parallel part (tests/conftest.py "
                                       "SERIAL_MODULES: assertions about time, load or the host's limits)")


MODULE_SECONDS = TESTS / "module_seconds.json"
"""Seconds each test module took in the whole suite on a 2-core host (scripts/test-timeline.py
writes it from a run's timeline). Under SANDFLEET_TEST_ORDER=longest (scripts/test.sh's two passes)
the pytest-xdist workers take the modules longest first, so that no long module starts last
while the other workers have nothing left (xdist's own order is by number of tests: in the slow
pass a 40 s module started last and the other worker sat idle 26 and 43 s at the end; longest
first, 4 s, 2026-12-07)."""


def _module_weights() -> dict[str, float]:
    try:
        data = json.loads(MODULE_SECONDS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.get("modules", {}).items()}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the `sandbox` marker only where a marker expression asks about it (the quick tier's): reading
    # every test's source for it took 2.5 s of each collection, and the whole suite makes 11
    classify = "sandbox" in (config.getoption("markexpr", "") or "")
    for item in items:
        if classify:
            try:
                starts = _is_sandbox_test(item)
            except Exception:  # pragma: no cover - a test the classifier can't read is not quick
                starts = True
            if starts and not item.get_closest_marker("sandbox"):
                item.add_marker(pytest.mark.sandbox)
        if Path(str(item.fspath)).stem in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
    if hasattr(config, "workerinput") and os.environ.get("SANDFLEET_TEST_ORDER") == "longest":
        # an xdist worker (the controller schedules in this order, with --no-loadscope-reorder)
        weights = _module_weights()
        first: dict[str, int] = {}  # each module's first position and its number of tests
        count: Counter[str] = Counter()
        for i, item in enumerate(items):
            first.setdefault(mod := item.nodeid.split("::", 1)[0], i)
            count[mod] += 1
        # longest module first (a module not in the table: 1 s a test); a module's tests keep their order
        items.sort(key=lambda it: (-weights.get(m := it.nodeid.split("::", 1)[0], float(count[m])), first[m]))


TIMELINE = os.environ.get("SANDFLEET_TEST_TIMELINE")
"""A folder: each pytest process appends each test's start and end there (scripts/test-timeline.py
reads them: how busy each worker was, the tail, the modules' seconds)."""

if TIMELINE:
    Path(TIMELINE).mkdir(parents=True, exist_ok=True)  # (a folder not made yet: every worker's first line failed)

    def _host_jiffies() -> tuple[int, int]:
        """(busy, all) jiffies of every CPU of the host since boot (/proc/stat's first line)."""
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    def _tree_cpu() -> float:
        t = os.times()  # this process and the children it waited for (sandboxes, CLIs, microVMs)
        return t.user + t.system + t.children_user + t.children_system

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        start = time.time()  # where the test runs (a worker, not xdist's controller)
        busy0, all0 = _host_jiffies()
        cpu0 = _tree_cpu()
        yield
        busy1, all1 = _host_jiffies()
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        # host_busy: the share of all the host's CPUs busy while it ran (whoever used them); cpu_s: the CPU
        # seconds of this process and of the children it reaped meanwhile (what the test itself burned)
        line = json.dumps({"nodeid": item.nodeid, "worker": worker, "pid": os.getpid(), "start": start,
                           "end": time.time(), "cpu_s": round(_tree_cpu() - cpu0, 2),
                           "host_busy": round((busy1 - busy0) / (all1 - all0), 3) if all1 > all0 else None})
        with open(Path(TIMELINE) / f"{worker}-{os.getpid()}.jsonl", "a") as f:
            f.write(line + "\n")


def _load_quickguard() -> object:
    spec = importlib.util.spec_from_file_location("sandfleet_quickguard", TESTS / "quickguard" / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


QUICK_GUARD = os.environ.get("SANDFLEET_QUICK_GUARD") == "1"
_refused: list[str] = []


@pytest.fixture(scope="session")
def _quickguard_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Under SANDFLEET_QUICK_GUARD=1: the guard in this process and in the Pythons the tests start."""
    log = tmp_path_factory.mktemp("quickguard") / "refused.log"
    guard = _load_quickguard()
    guard.install(_refused.append)  # type: ignore[attr-defined]
    old = {k: os.environ.get(k) for k in ("PYTHONPATH", "SANDFLEET_QUICK_GUARD_LOG")}
    here = str(TESTS / "quickguard")
    os.environ["PYTHONPATH"] = here + (os.pathsep + old["PYTHONPATH"] if old["PYTHONPATH"] else "")
    os.environ["SANDFLEET_QUICK_GUARD_LOG"] = str(log)
    try:
        yield log
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if QUICK_GUARD:
    @pytest.fixture(autouse=True)
    def _quickguard(request: pytest.FixtureRequest) -> Iterator[None]:
        """Fail a quick-tier test that started a sandbox or a server (see tests/quickguard/)."""
        log: Path = request.getfixturevalue("_quickguard_session")
        _refused.clear()
        log.write_text("")
        yield
        refused = _refused + log.read_text().splitlines()
        _refused.clear()
        if refused:
            pytest.fail("\n".join(dict.fromkeys(refused)), pytrace=False)
