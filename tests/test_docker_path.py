"""Docker's default PATH under a base that sets none (issue 42): ``ENV PATH=/x:$PATH``."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.images.dockerfile import DEFAULT_PATH, Env, parse_dockerfile
from sandfleet.rollout import NoopPolicy, OraclePolicy
from test_rollout_support import make_task, needs_bwrap, run


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return path


def test_default_path_under_a_base_without_path(tmp_path: Path) -> None:
    df = parse_dockerfile(write(tmp_path, "FROM python:3.11-bookworm\nENV PATH=/app/.venv/bin:$PATH\n"
                                          "ENV PATH /opt/x:${PATH} OTHER=${PATH:-none}\n"))
    assert df.steps[1] == Env(2, (("PATH", f"/app/.venv/bin:{DEFAULT_PATH}"),))
    assert df.env["PATH"] == f"/opt/x:/app/.venv/bin:{DEFAULT_PATH} OTHER=/app/.venv/bin:{DEFAULT_PATH}"
    assert DEFAULT_PATH == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    # a Dockerfile that does not name PATH leaves the image's environment as it was
    assert "PATH" not in parse_dockerfile(write(tmp_path, "FROM debian:12\nENV A=$PATH\n")).env
    assert parse_dockerfile(write(tmp_path, "FROM debian:12\nENV A=$PATH\n")).env["A"] == DEFAULT_PATH


def test_base_path_and_stage_path_win_over_the_default(tmp_path: Path) -> None:
    df = parse_dockerfile(write(tmp_path, "FROM golang:1.22-bookworm AS build\nENV PATH=/x:$PATH\n"
                                          "FROM build\nENV PATH=/y:$PATH\n"))
    assert df.env["PATH"] == "/y:/x:/go/bin:/usr/local/go/bin:" + DEFAULT_PATH
    # a new stage from an image starts again from the image's config, not the last stage's
    df = parse_dockerfile(write(tmp_path, "FROM debian:12 AS a\nENV PATH=/a:$PATH\n"
                                          "FROM debian:12\nENV PATH=/b:$PATH\n"))
    assert df.env["PATH"] == "/b:" + DEFAULT_PATH


@needs_bwrap()
@pytest.mark.slow
async def test_venv_on_path_task_scores_one(tmp_path: Path) -> None:
    """The Harbor template's ``ENV PATH=/app/.venv/bin:$PATH`` over a debootstrapped base: the
    rollout starts, the venv's python is first on the agent's PATH, the base's tools are still
    there. (The tests' PATH leaves the workdir's folders out: rollout/verifier.py.)"""
    dockerfile = ("FROM python:3.11-slim-bookworm\nWORKDIR /app\nRUN python3 -m venv /app/.venv\n"
                  "ENV PATH=/app/.venv/bin:$PATH\nRUN test \"$(command -v python)\" = /app/.venv/bin/python\n")
    task = make_task(tmp_path, dockerfile=dockerfile, test_sh=CHECK_PATH,
                     solve='command -v python > /app/out.txt && ls / > /dev/null && echo hello >> /app/out.txt')
    oracle = (await run([task], OraclePolicy())).results[0]
    assert oracle.status == "completed", oracle.error
    assert oracle.reward == 1.0, oracle.verifier_output
    noop = (await run([task], NoopPolicy())).results[0]
    assert noop.status == "completed" and noop.reward == 0.0, noop.error


CHECK_PATH = """#!/bin/bash
mkdir -p /logs/verifier
echo "PATH=$PATH"
if [ "$(cat /app/out.txt 2>/dev/null)" = "$(printf '/app/.venv/bin/python\\nhello')" ]; then
  echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
