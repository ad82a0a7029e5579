"""Compiled Python in the tests' process. The guard's own caches (rollout/guardcache.py): every Python the tests
start imports the guard from a cache the host compiled, not from its source each time (18 ms natively, about 1.5 s
in a TCG guest), and the cache is only ever the guard's own code: a checked-hash one, which Python compiles the
source instead of where the two differ.

The first tests check the caches on the host, as Python reads them; the next one in the verifier of real rollouts
on bwrap and gVisor, where the tests' own Python says where its guard came from.

And the code under test's (stop 76): code it loads from bytes is its own whatever file it names
(tests/fixtures/attacks-stop76), but a module it imports from the image's own cache, and data it unmarshals, are
what they were: the honest side, last.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from test_reward_integrity_iii import BACKENDS, REWARD, harbor_task, rollouts

from sandfleet.rollout.guardcache import guard_caches
from sandfleet.rollout.testguard import PY_GUARD


def _guard_folder(tmp_path: Path, source: str) -> Path:
    """A guard folder as the verifier leaves it: the source, and this interpreter's cache beside it."""
    folder = tmp_path / "py"
    (folder / "__pycache__").mkdir(parents=True)
    (folder / "sitecustomize.py").write_text(source)
    tag = sys.implementation.cache_tag
    (folder / "__pycache__" / f"sitecustomize.{tag}.pyc").write_bytes(guard_caches()[tag])
    return folder


def _imported_from(folder: Path) -> str:
    """Where a Python given FOLDER first on its path (as the tests' PYTHONPATH has it) took sitecustomize."""
    r = subprocess.run([sys.executable, "-v", "-c", "pass"], capture_output=True, text=True, timeout=60,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(folder),
                            "PYTHONDONTWRITEBYTECODE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if str(folder) in line and "sitecustomize" in line]
    assert lines, r.stderr[-2000:]
    return "\n".join(lines)


def test_the_cache_is_a_checked_one_of_the_guards_own_text() -> None:
    data = guard_caches()[sys.implementation.cache_tag]
    assert data[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(data[4:8], "little") == 0b11  # hash-based, checked against the source
    assert data[8:16] == importlib.util.source_hash(PY_GUARD.encode())


def test_a_python_of_the_hosts_version_takes_the_guard_from_the_cache(tmp_path: Path) -> None:
    folder = _guard_folder(tmp_path, PY_GUARD)
    seen = _imported_from(folder)
    assert f"code object from '{folder}/__pycache__/sitecustomize." in seen, seen


def test_a_source_that_is_not_the_caches_own_is_compiled_and_the_cache_never_runs(tmp_path: Path) -> None:
    """What a cache holds runs only beside its own source: any other text there (another guard's) is what runs."""
    folder = _guard_folder(tmp_path, "import sys\nsys.stderr.write('the source ran\\n')\n")
    seen = _imported_from(folder)
    assert f"code object from {folder}/sitecustomize.py" in seen, seen  # (from the source: unquoted)
    probe = "import sitecustomize; print(hasattr(sitecustomize, '_sandfleet_guard'))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(folder)})
    assert (r.stdout.strip(), "the source ran" in r.stderr) == ("False", True), r.stderr[-2000:]


# the tests' own Python, in the verifier: 1 where its guard (the first entry of its PYTHONPATH) came from a cache
FROM_CACHE = f"""guard=${{PYTHONPATH%%:*}}
if python3 -v -c pass 2>&1 | grep -q "code object from '$guard/__pycache__/sitecustomize\\.cpython-"; then
  echo 1 > {REWARD}
else
  python3 -v -c pass 2>&1 | grep sitecustomize; ls -la "$guard" "$guard/__pycache__"; echo 0 > {REWARD}
fi
"""


@BACKENDS
async def test_the_tests_python_takes_the_guard_from_its_cache(tmp_path: Path, backend: str) -> None:
    task = harbor_task(tmp_path, "guard-cache", FROM_CACHE)
    for verify in ("shared", "separate"):
        results = await rollouts([task], ["true"], verify=verify, backend=backend)
        assert [r.reward for r in results] == [1.0, 1.0], [(r.reason, r.verifier_output[-1500:]) for r in results]


HONEST_SOLUTION = """cat > /app/solution.py <<'EOF'
import fileinput
import marshal

DATA = marshal.loads(marshal.dumps({"word": "hello"}))


def answer():
    assert fileinput.isfirstline is not None
    return DATA["word"]
EOF"""
PYTEST_DECIDES = f"""echo 0 > {REWARD}
cd /app
python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py
"""
# the tests write the reward themselves, through fileinput (a pure-Python module of the image's, with its cache,
# that pytest never imports): the code under test imported it first; were it marked as the code's, the guard would
# refuse the tests' write from its frames, and the reward stay 0
GRADES_THROUGH_FILEINPUT = f"""import sys

sys.path.insert(0, "/app")


def test_answer():
    import solution
    import fileinput  # (imported by the code under test, from the image's cache)
    assert solution.answer() == "hello"
    for _line in fileinput.input("{REWARD}", inplace=True):
        print("1")
"""


@BACKENDS
async def test_code_under_test_importing_cached_modules_and_unmarshalling_data_still_scores_one(
        tmp_path: Path, backend: str) -> None:
    """The image's cache of fileinput, which the code under test imports first (the import system reads it for the
    source beside it), is judged by where its source is, and the code's marshal.loads of data marks nothing: the
    tests' own write of 1 through fileinput stands."""
    task = harbor_task(tmp_path, "cached-imports", PYTEST_DECIDES, tests={"test_outputs.py": GRADES_THROUGH_FILEINPUT})
    results = await rollouts([task], [HONEST_SOLUTION], backend=backend)
    assert [r.reward for r in results] == [1.0, 1.0], [(r.reason, r.verifier_output[-1500:]) for r in results]
