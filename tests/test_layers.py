"""The layer contract (docs/architecture.md, pyproject's [tool.importlinter]) holds, and it bites.

`lint-imports` runs on a copy of the package with one upward import added: the contract must
break and name that import. A contract that lists the wrong container, or that ignores too
much, would let it through.
"""

from __future__ import annotations

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
