"""``sandfleet model-server``: the scripted OpenAI-compatible server of the tests and demos
(:class:`sandfleet.testing.fake_server.FakeModelServer`) on a port of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from sandfleet.testing.fake_server import FakeModelServer


def load_script(path: Path) -> list[Any]:
    """A script file: a JSON list of entries (see the module docstring)."""
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise click.BadParameter("the script must be a JSON list of replies")
    return data


@click.command("model-server")
@click.option(
    "--script",
    "script_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON list of replies (default: say the task is done).",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--model", default="fake-model", show_default=True)
@click.option("--delay", "delay_s", default=0.0, type=float, help="Seconds before each reply.")
@click.option("--strict-sessions", is_flag=True,
              help="Refuse (HTTP 400) a history that does not extend the conversation's previous one.")
def model_server(script_path: Path | None, host: str, port: int, model: str, delay_s: float,
                 strict_sessions: bool) -> None:
    """Serve scripted chat replies over an OpenAI-compatible API (for tests and demos)."""
    script = load_script(script_path) if script_path else []
    server = FakeModelServer(script, model=model, delay_s=delay_s, strict_sessions=strict_sessions,
                             host=host, port=port)
    click.echo(f"serving {len(script)} scripted replies as {model!r} at {server.url}")
    server.serve_until_interrupted()
