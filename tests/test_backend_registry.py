"""One backend registry (sandfleet/sandbox/registry.py): the spec's names, the CLI's --backend
choices, doctor's table, "isolated" and the tests' matrix all derive from it (issue 43)."""

from __future__ import annotations

import ast
from pathlib import Path

import click
import pytest

from sandfleet.cli import cli
from sandfleet.doctor import report
from sandfleet.errors import ConfigError
from sandfleet.rollout import verifier
from sandfleet.sandbox.registry import ISOLATED, NAMES, REGISTRY, choices, is_isolated
from sandfleet.sandbox.spec import BACKENDS, backend_config

SRC = Path(__file__).resolve().parents[1] / "src" / "sandfleet"


def test_the_registry_and_the_configs_name_the_same_backends() -> None:
    assert set(NAMES) == set(BACKENDS) and len(NAMES) == len(BACKENDS)
    for b in REGISTRY:
        assert backend_config(b.name).kind == b.name and b.config.target.count(":") == 1
    with pytest.raises(ConfigError, match="unknown backend 'firecracker'"):
        backend_config("firecracker")


def test_isolated_is_every_backend_but_process() -> None:
    assert ISOLATED == set(NAMES) - {"process"}
    assert not is_isolated("process") and not is_isolated("firecracker") and not is_isolated("remote")
    assert verifier.ISOLATED_BACKENDS == ISOLATED and verifier.USER_BACKENDS == {"bwrap", "gvisor"}


def _option(path: list[str], name: str) -> click.Option:
    cmd: click.Command = cli
    for part in path:
        assert isinstance(cmd, click.Group)
        found = cmd.get_command(click.Context(cmd), part)
        assert found is not None, part
        cmd = found
    return next(p for p in cmd.params if isinstance(p, click.Option) and p.name == name)


@pytest.mark.parametrize("path", [["run"], ["serve"], ["sandbox", "create"]])
def test_the_cli_offers_the_registry(path: list[str]) -> None:
    opt = _option(path, "backend")
    assert isinstance(opt.type, click.Choice) and list(opt.type.choices) == choices() == ["auto", *NAMES]


def test_doctor_probes_every_backend() -> None:
    backends = report()["backends"]
    assert list(backends) == list(NAMES)
    assert all(isinstance(b["available"], bool) and b["reason"] for b in backends.values())
    assert backends["process"]["available"] is True


def test_no_other_module_lists_the_backends() -> None:
    """A literal tuple, list or set naming three or more backends is a second registry."""
    names = set(NAMES)
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "registry.py" and path.parent.name == "sandbox":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                listed = {e.value for e in node.elts if isinstance(e, ast.Constant)} & names
                if len(listed) >= 3:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found
