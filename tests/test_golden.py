"""Golden files (issue 43): the ``--help`` of every command of the ``sandfleet`` command line and
the HTTP API's ``/openapi.json`` are kept under tests/golden/, and a change to either fails here.

A change you mean: regenerate them and commit them with it (the diff is the review of the change)::

    SANDFLEET_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_golden.py -p no:cacheprovider

Both are made without a sandbox or a listening socket (quick tier): the help, in a Python of its
own through click's runner at 80 columns, the schema by asking the app the command line builds (over
ASGI, the path a client's GET takes). tests/test_service.py checks that the running service's
``/openapi.json`` is this same file.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import click
import pytest

from sandfleet.cli import cli

GOLDEN = Path(__file__).resolve().parent / "golden"
HELP = GOLDEN / "cli"
OPENAPI = GOLDEN / "openapi.json"
UPDATE = os.environ.get("SANDFLEET_UPDATE_GOLDEN") == "1"
REGENERATE = ("regenerate with SANDFLEET_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_golden.py "
              "(tests/golden/README.md) and commit the files with the change")


def command_paths(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command under ``group``, groups included, as its words after ``sandfleet``."""
    out: list[tuple[str, ...]] = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        out.append((*path, name))
        if isinstance(cmd, click.Group):
            out += command_paths(cmd, ctx, (*path, name))
    return out


COMMANDS: list[tuple[str, ...]] = [(), *command_paths(cli, click.Context(cli))]


def golden_name(words: tuple[str, ...]) -> str:
    return "-".join(("sandfleet", *words)) + ".txt"


def check(path: Path, text: str) -> None:
    """``text`` is what ``path`` holds; with SANDFLEET_UPDATE_GOLDEN=1 it is written there instead."""
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.is_file(), f"{path.relative_to(GOLDEN.parent)} is missing: {REGENERATE}"
    want = path.read_text()
    if text != want:
        import difflib

        diff = "".join(difflib.unified_diff(want.splitlines(keepends=True), text.splitlines(keepends=True),
                                            f"golden/{path.relative_to(GOLDEN)}", "now", n=2))
        pytest.fail(f"{path.relative_to(GOLDEN.parent)} differs from what it keeps ({REGENERATE}):\n{diff}",
                    pytrace=False)


# Every help asked in a Python of its own, as ``sandfleet WORDS --help`` is: click keeps a command's
# help option from its first use, so a test that invoked a command directly (without the group's
# -h) would change what this process prints (seen: "--help" for "-h, --help" after test_analysis_cli).
HELP_SCRIPT = """
import json, sys
from click.testing import CliRunner
from sandfleet.cli import cli
out = {}
for words in json.loads(sys.argv[1]):
    res = CliRunner().invoke(cli, [*words, "--help"], prog_name="sandfleet", env={"COLUMNS": "80"})
    out[" ".join(words)] = [res.exit_code, res.output]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, list[Any]]:
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", HELP_SCRIPT, json.dumps(COMMANDS)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out: dict[str, list[Any]] = json.loads(res.stdout)
    return out


@pytest.mark.parametrize("words", COMMANDS, ids=lambda w: " ".join(w) or "sandfleet")
def test_help_is_the_golden_one(words: tuple[str, ...], helps: dict[str, list[Any]]) -> None:
    code, text = helps[" ".join(words)]
    assert code == 0, text
    check(HELP / golden_name(words), text)


def test_every_golden_help_belongs_to_a_command() -> None:
    """A command removed or renamed takes its golden file with it."""
    if UPDATE:
        for stale in set(HELP.glob("*.txt")) - {HELP / golden_name(w) for w in COMMANDS}:
            stale.unlink()
    kept = {p.name for p in HELP.glob("*.txt")}
    assert kept == {golden_name(w) for w in COMMANDS}, REGENERATE


def openapi_document() -> dict[str, Any]:
    """What GET /openapi.json answers, asked of the app the command line builds (no socket)."""
    import tempfile

    import httpx

    from sandfleet.server.admission import host_limits
    from sandfleet.server.app import create_app
    from sandfleet.server.auth import Tokens
    from sandfleet.server.metrics import Metrics
    from sandfleet.server.service import SandboxService, ServiceConfig

    with tempfile.TemporaryDirectory() as d:
        token_file = Path(d) / "tokens"
        token_file.write_text("golden-token-not-used-0123456789\n")
        token_file.chmod(0o600)
        metrics = Metrics()
        app = create_app(SandboxService(ServiceConfig(), host_limits(4, 2), metrics), Tokens(token_file), metrics)

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://golden") as h:
            return await h.get("/openapi.json")

    r = asyncio.run(get())
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def openapi_text(doc: dict[str, Any]) -> str:
    """The schema as kept: sorted keys, 2-space indent, the package's version left out (a release
    is not an API change)."""
    doc = {**doc, "info": {**doc["info"], "version": "(the package's version)"}}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def test_openapi_is_the_golden_one() -> None:
    doc = openapi_document()
    assert doc["paths"] and all(p.startswith("/v1/") or p in ("/healthz", "/metrics") for p in doc["paths"]), \
        sorted(doc["paths"])
    check(OPENAPI, openapi_text(doc))
