"""The layer contract (docs/architecture.md, pyproject's [tool.importlinter]) holds, and it bites.

`lint-imports` runs on a copy of the package with one upward import added: the contract must
break and name that import. A contract that lists the wrong container, or that ignores too
much, would let it through.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(src: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _copy(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "sandfleet", src / "sandfleet",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return src


def test_the_contract_holds(tmp_path: Path) -> None:
    res = _lint(ROOT / "src", tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


def test_an_upward_import_inside_a_function_breaks_it_and_is_named(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    errors = src / "sandfleet" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _late() -> object:\n    import sandfleet.rollout.runner\n"
                      "    return sandfleet.rollout.runner\n")
    n = errors.read_text().splitlines().index("    import sandfleet.rollout.runner") + 1
    res = _lint(src, tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "BROKEN" in res.stdout
    assert f"sandfleet.errors -> sandfleet.rollout.runner (l.{n})" in res.stdout, res.stdout


def test_an_import_under_type_checking_is_exempt(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    errors = src / "sandfleet" / "errors.py"
    errors.write_text(errors.read_text() + "\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                      "    import sandfleet.rollout.runner  # noqa: F401\n")
    res = _lint(src, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_top_level_module_has_a_layer() -> None:
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    named = {m.strip() for layer in contract["layers"] for m in layer.replace(":", "|").split("|")}
    pkg = ROOT / "src" / "sandfleet"
    present = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
    present |= {p.parent.name for p in pkg.glob("*/__init__.py")}
    assert present - named == set(), "add these to a layer in pyproject.toml and docs/architecture.md"
    assert named - present == set(), "layers name modules that no longer exist"


def _import_edges(pkg: Path) -> dict[str, set[str]]:
    """Module -> the sandfleet modules it imports, anywhere in the file but under ``if TYPE_CHECKING:``.
    ``from a.b import c`` imports ``a.b`` (its ``__init__`` runs first) and ``a.b.c`` when that is a module."""
    base = pkg.parent
    mods = {".".join(p.relative_to(base).with_suffix("").parts).removesuffix(".__init__"): p for p in pkg.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = {id(c) for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
                for c in ast.walk(n)}
        here = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for n in ast.walk(tree):
            if id(n) in skip:
                continue
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                b = n.module or ""
                if n.level:
                    parts = here.split(".")
                    b = ".".join(parts[: len(parts) - n.level + 1] + ([b] if b else []))
                names = [b] + [f"{b}.{a.name}" for a in n.names]
            else:
                continue
            for t in names:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    edges[m].add(t)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle_between_files_or_packages() -> None:
    """What import-linter does not see: a module that imports its own package's ``__init__``
    while that ``__init__`` imports it; and any cycle between files or top-level packages."""
    edges = _import_edges(ROOT / "src" / "sandfleet")
    assert _cycles(edges) == [], "file cycles (docs/architecture.md, 'The rules')"
    top: dict[str, set[str]] = {}
    for a, bs in edges.items():
        top.setdefault(".".join(a.split(".")[:2]), set()).update(
            ".".join(b.split(".")[:2]) for b in bs if b.count(".") >= 1)
    for a in top:
        top[a].discard(a)
    assert _cycles(top) == [], "package cycles (docs/architecture.md, 'The rules')"


def test_the_cycle_check_sees_a_module_importing_its_own_package(tmp_path: Path) -> None:
    pkg = tmp_path / "sandfleet"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from sandfleet.a.report import analyze\n")
    (pkg / "a" / "report.py").write_text("from sandfleet.a import breakdown\n\ndef analyze(): ...\n")
    (pkg / "a" / "breakdown.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                            "    import sandfleet.a.report\n")
    assert _cycles(_import_edges(pkg)) == [["sandfleet.a", "sandfleet.a.report"]]
    (pkg / "a" / "report.py").write_text("import sandfleet.a.breakdown as bd\n\ndef analyze(): ...\n")
    assert _cycles(_import_edges(pkg)) == []
