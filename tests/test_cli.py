"""The ``sandfleet`` command line as one package: every command lives in ``sandfleet.cli``, the
flags that "where to run" excludes are refused by name, and ``sandfleet model-server`` (moved
there from testing/fake_server.py) serves and stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sandfleet.cli import COMMANDS, cli
from sandfleet.cli.where import Where, refuse

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tasks"


def commands(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()) -> dict[str, click.Command]:
    out = {}
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        out[" ".join((*path, name))] = cmd
        if isinstance(cmd, click.Group):
            out.update(commands(cmd, ctx, (*path, name)))
    return out


def test_every_command_is_defined_in_the_cli_package() -> None:
    found = commands(cli, click.Context(cli))
    assert set(COMMANDS) <= set(found)
    assert {"tasks validate", "bench service", "run", "model-server"} <= set(found)
    outside = {name: cmd.callback.__module__ for name, cmd in found.items()
               if cmd.callback is not None and not cmd.callback.__module__.startswith("sandfleet.cli.")}
    assert not outside, outside


def test_python_dash_m_sandfleet_cli_still_runs_the_command_line() -> None:
    res = subprocess.run([sys.executable, "-m", "sandfleet.cli", "tasks", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "validate" in res.stdout and "generate" in res.stdout


def test_where_tells_here_one_service_several_and_ray_apart() -> None:
    assert not Where().spread and not Where("http://127.0.0.1:1").spread
    assert Where("http://127.0.0.1:1,http://127.0.0.1:2").several and Where(None, "local:2").spread
    assert Where(None, "local:2").hosts == "Ray node(s)"
    assert Where("http://127.0.0.1:1,http://127.0.0.1:2").hosts == "service(s)"
    refuse("--ray", {"--remote": False, "--cpu-fraction": False})  # nothing given: no error
    with pytest.raises(click.UsageError, match="^--ray excludes --remote, --arch and --page-size$"):
        refuse("--ray", {"--remote": False, "--arch": True, "--page-size": False})


@pytest.mark.parametrize(("args", "message"), [
    (["run", "--tasks", str(EXAMPLES), "--out", "OUT", "--ray", "local:1", "--remote", "http://127.0.0.1:1"],
     "--ray runs the sandboxes on the cluster's nodes: it excludes --remote and --cpu-fraction"),
    (["tasks", "validate", str(EXAMPLES), "--remote", "http://127.0.0.1:1,http://127.0.0.1:2", "--strict-bases"],
     "--remote with several URLs excludes --arch, --page-size and --strict-bases"),
    (["tasks", "validate", str(EXAMPLES), "--ray", "local:1", "--page-size", "64k"],
     "--ray excludes --remote, --arch, --page-size and --strict-bases"),
])
def test_flags_that_where_to_run_excludes_are_refused_by_name(tmp_path: Path, args: list[str], message: str) -> None:
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_model_server_refuses_a_script_that_is_not_a_list(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text('{"bash": "true"}')
    res = CliRunner().invoke(cli, ["model-server", "--script", str(script)])
    assert res.exit_code == 2
    assert "the script must be a JSON list of replies" in res.output


def test_model_server_serves_its_script_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(["scripted hello"]))
    proc = subprocess.Popen([sys.executable, "-m", "sandfleet", "model-server", "--script", str(script), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # serving 1 scripted replies as 'fake-model' at http://127.0.0.1:PORT/v1
        assert line.startswith("serving 1 scripted replies"), (line, proc.stderr and proc.stderr.read())
        url = line.rsplit(" ", 1)[1].strip()
        body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(f"{url}/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            reply = json.loads(resp.read())
        assert reply["choices"][0]["message"]["content"] == "scripted hello"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
