"""One settings object read at the edge (issue 43): no module below the commands layer reads
the environment; --no-limits travels in the settings (and, for a child, its environment dict)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sandfleet.errors import HostUnsupportedError
from sandfleet.sandbox import cgroups
from sandfleet.sandbox.spec import Limits
from sandfleet.settings import VARIABLES, Settings, child_env, current, installed

SRC = Path(__file__).resolve().parents[1] / "src" / "sandfleet"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "settings.md"

ALLOWED = {"settings.py"}
"""Modules that may read the environment, besides the commands layer (cli/)."""
GUEST = {"interpreter/repl.py": None, "rollout/testguard.py": "_sandfleet_guard"}
"""Code that runs inside a sandbox (shipped as text), with the guest's own environment: a
whole module (None) or one function."""
WRITES = ("pop", "setdefault", "update", "clear")


def _reads(tree: ast.AST, skip: str | None) -> list[int]:
    """Lines that read ``os.environ`` / ``os.getenv`` (a store, a delete or a pop/setdefault/
    update/clear on it is a write), outside the function named ``skip``."""
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os" and {a.name for a in node.names} & {"environ",
                                                                                                       "getenv"}:
            found.append(node.lineno)
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
                and node.attr in ("environ", "getenv", "environb", "getenvb")):
            continue
        up = parents.get(node)
        scope = up
        while scope is not None and not (isinstance(scope, ast.FunctionDef) and scope.name == skip):
            scope = parents.get(scope)
        if scope is not None:
            continue
        if isinstance(up, ast.Subscript) and isinstance(up.ctx, ast.Store | ast.Del):
            continue
        if isinstance(up, ast.Attribute) and up.attr in WRITES:
            continue
        found.append(node.lineno)
    return found


def test_no_module_below_the_commands_layer_reads_the_environment() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in ALLOWED or rel.startswith("cli/") or (rel in GUEST and GUEST[rel] is None):
            continue
        for line in _reads(ast.parse(path.read_text(), rel), GUEST.get(rel)):
            offenders.append(f"{rel}:{line}")
    assert not offenders, offenders


def test_the_scan_finds_a_read() -> None:
    code = ("import os\ndef f():\n    os.environ['A'] = '1'\n    os.environ.pop('B', None)\n"
            "    return os.environ.get('C')\n")
    assert _reads(ast.parse(code), None) == [5]
    assert _reads(ast.parse("import os\nx = {**os.environ}\n"), None) == [2]
    assert _reads(ast.parse("def g():\n    import os\n    return os.getenv('X')\n"), "g") == []


def test_the_commands_layer_writes_no_setting_into_the_environment() -> None:
    """--no-limits and the rest go into the installed settings, not os.environ."""
    for path in (SRC / "cli").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                assert ast.unparse(node.value) != "os.environ", f"{path.name}:{node.lineno}"


def test_every_variable_is_documented() -> None:
    """A docstring under each field; docs/settings.md's table names every variable and no other."""
    tree = ast.parse((SRC / "settings.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    body = cls.body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            nxt = body[i + 1]
            assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), ast.unparse(node.target)
    rows = set(re.findall(r"^\| `([A-Z_]+)` \|", DOCS.read_text(), re.M))
    assert rows == set(VARIABLES)


def test_settings_come_from_the_environment_given() -> None:
    s = Settings.from_env({"SANDFLEET_NO_LIMITS": "yes", "SANDFLEET_CGROUPS": "off", "SANDFLEET_STATE": "/x"})
    assert s.no_limits and s.cgroups_off and s.state == "/x" and s.cache is None
    assert Settings.from_env({}).to_env() == {}
    assert s.to_env() == {"SANDFLEET_NO_LIMITS": "1", "SANDFLEET_CGROUPS": "0", "SANDFLEET_STATE": "/x"}


def test_the_environments_settings_follow_each_change_of_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """current() without installed settings works them out again only when a variable of theirs
    changed (it was asked seven times for each sandbox made: issue 46), and sees every change made
    through os.environ, a setting, an unset and a variable set back alike."""
    monkeypatch.delenv("SANDFLEET_CPU_FRACTION", raising=False)
    monkeypatch.delenv("SANDFLEET_CGROUPS", raising=False)
    first = current()
    assert current() is first and first.cpu_fraction is None
    monkeypatch.setenv("SANDFLEET_CPU_FRACTION", "0.5")
    assert current().cpu_fraction == "0.5"
    monkeypatch.setenv("SANDFLEET_CPU_FRACTION", "0.25")
    assert current().cpu_fraction == "0.25" and current() is current()
    monkeypatch.setenv("SANDFLEET_CGROUPS", "0")
    assert current().cgroups_off and current().cpu_fraction == "0.25"
    monkeypatch.delenv("SANDFLEET_CPU_FRACTION")
    monkeypatch.delenv("SANDFLEET_CGROUPS")
    assert current() == first
    monkeypatch.setenv("HOME_OF_SOMETHING_ELSE", "x")  # not a setting's variable: the same settings
    assert current() == first


def test_no_limits_travels_in_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cgroups off: a sandbox asking for limits is refused, unless the installed settings say
    --no-limits; a child process started with child_env() sees it; os.environ never has it."""
    monkeypatch.setenv("SANDFLEET_CGROUPS", "0")
    monkeypatch.delenv("SANDFLEET_NO_LIMITS", raising=False)
    with pytest.raises(HostUnsupportedError, match="--no-limits"):
        cgroups.sandbox_cgroup("sb-x", Limits(memory_mib=256))
    with installed(current().replace(no_limits=True)):
        assert cgroups.sandbox_cgroup("sb-x", Limits(memory_mib=256)) is None
        probe = "from sandfleet.settings import current; print(current().no_limits)"
        out = subprocess.run([sys.executable, "-c", probe], env=child_env(), capture_output=True, text=True,
                             check=True).stdout
        assert out.strip() == "True"
        assert "SANDFLEET_NO_LIMITS" not in os.environ
    with pytest.raises(HostUnsupportedError):  # gone with the block
        cgroups.sandbox_cgroup("sb-x", Limits(memory_mib=256))


def test_a_local_clusters_nodes_get_the_commands_settings(tmp_path: Path) -> None:
    """--no-limits with --ray local:N: each node's processes are started with it in their environment."""
    from sandfleet.cluster.local import LocalCluster

    cluster = LocalCluster(2, root=tmp_path)
    with installed(Settings.from_env({}).replace(no_limits=True)):
        env = cluster.node_env(1)
    assert env["SANDFLEET_NO_LIMITS"] == "1" and env["SANDFLEET_STATE"] == str(tmp_path / "n1" / "state")
    assert "SANDFLEET_NO_LIMITS" not in cluster.node_env(1) or os.environ.get("SANDFLEET_NO_LIMITS")
