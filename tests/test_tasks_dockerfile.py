"""The Dockerfile subset parser and the base-image mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.errors import ImageBuildError
from sandfleet.images.dockerfile import (
    Copy,
    Env,
    From,
    Run,
    User,
    Workdir,
    parse_dockerfile,
    resolve_base,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return path


def test_full_subset(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
# syntax=docker/dockerfile:1
ARG PY=3.11
FROM python:${PY}-slim-bookworm AS base
ARG PY
ARG DEST=/opt/tool
ENV LANG=C.UTF-8 \\
    GREETING="hello world" OTHER='$LANG'
ENV LEGACY some value with spaces
LABEL maintainer="x"
RUN apt-get update && \\
    # a comment inside a continuation is dropped
    apt-get install -y \\
        curl git
RUN ["python3", "-c", "print(1)"]
WORKDIR /app
WORKDIR sub
COPY --chown=1000:1000 src/ ${DEST}/
ADD data.tar.gz ./data/
COPY ["a b.txt", "c.txt", "/dst/"]
USER ${GREETING_USER:-agent}
EXPOSE 80
CMD ["bash"]
SHELL ["/bin/bash", "-c"]
""",
    )
    df = parse_dockerfile(path)
    assert df.base == From(3, "python:3.11-slim-bookworm", "base")
    steps = df.steps
    assert isinstance(steps[1], Env) and steps[1].line == 6
    assert steps[1].values == (("LANG", "C.UTF-8"), ("GREETING", "hello world"), ("OTHER", "$LANG"))
    assert steps[2] == Env(8, (("LEGACY", "some value with spaces"),))
    run = steps[3]
    assert isinstance(run, Run) and run.line == 10
    assert run.shell == "apt-get update && apt-get install -y curl git"
    assert dict(run.build_args) == {"PY": "3.11", "DEST": "/opt/tool"}
    assert steps[4] == Run(14, None, ("python3", "-c", "print(1)"), run.build_args)
    assert steps[5] == Workdir(15, "/app") and steps[6] == Workdir(16, "/app/sub")
    assert steps[7] == Copy(17, ("src/",), "/opt/tool/", "1000:1000", None, False)
    assert steps[8] == Copy(18, ("data.tar.gz",), "/app/sub/data/", None, None, True)
    assert steps[9] == Copy(19, ("a b.txt", "c.txt"), "/dst/", None, None, False)
    assert steps[10] == User(20, "agent")
    assert df.workdir == "/app/sub" and df.user == "agent"
    assert df.env["GREETING"] == "hello world"
    assert any("SHELL" in note for note in df.notes)


def test_arg_substitution_forms_and_build_args(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
FROM debian:bookworm
ARG NAME=world
ARG EMPTY
ENV A=$NAME B=${NAME} C=${EMPTY:-fallback} D=${NAME:+set} E=\\$NAME F=${UNSET}x
ENV G=$A
""",
    )
    df = parse_dockerfile(path)
    assert df.env == {
        "A": "world",
        "B": "world",
        "C": "fallback",
        "D": "set",
        "E": "$NAME",
        "F": "x",
        "G": "world",
    }
    assert parse_dockerfile(path, build_args={"NAME": "moon"}).env["A"] == "moon"


def test_env_wins_over_arg_and_targetarch(tmp_path: Path) -> None:
    path = write(
        tmp_path, "FROM debian:12\nENV X=env\nARG X=arg\nARG TARGETARCH\nENV Y=$X-$TARGETARCH\n"
    )
    assert parse_dockerfile(path, arch="arm64").env["Y"] == "env-arm64"


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("FROM debian:12\nRUN <<EOF\necho hi\nEOF\n", 2, "heredoc"),
        ("FROM debian:12\nCOPY <<EOF /x\nhi\nEOF\n", 2, "heredoc"),
        (
            "FROM debian:12\n\nRUN --mount=type=cache,target=/root/.cache pip install x\n",
            3,
            "--mount",
        ),
        ("FROM debian:12\nCOPY --from=builder /out /out\n", 2, "--from"),
        ("FROM debian:12\nADD https://example.com/x.tgz /x\n", 2, "URL"),
        ("FROM debian:12\nCOPY ../secret /x\n", 2, "outside the build context"),
        ("FROM debian:12\nCOPY /etc/passwd /x\n", 2, "outside the build context"),
        ("FROM debian:12 AS a\nFROM debian:12\n", 2, "multi-stage"),
        ("FROM --platform=linux/amd64 debian:12\n", 1, "--platform"),
        ("FROM debian:12\nONBUILD RUN x\n", 2, "ONBUILD"),
        ("FROM debian:12\nRUN true && \\\n  false\nFROBNICATE x\n", 4, "FROBNICATE"),
        ("RUN true\n", 1, "before FROM"),
        ("FROM debian:12\nCOPY onlyone\n", 2, "source and a destination"),
        ("FROM debian:12\nENV\n", 2, "ENV"),
        ("FROM debian:12\nUSER\n", 2, "USER"),
        ("# escape=`\nFROM debian:12\n", 0, "escape"),
    ],
)
def test_refused_with_line(tmp_path: Path, text: str, line: int, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ImageBuildError) as info:
        parse_dockerfile(path)
    assert info.value.file == str(path)
    assert info.value.line == (line or None)
    assert message in str(info.value)
    if line:
        assert str(info.value).startswith(f"{path}:{line}: ")


def test_no_from(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError, match="no FROM"):
        parse_dockerfile(write(tmp_path, "# nothing\n"))


def test_here_string_is_not_a_heredoc(tmp_path: Path) -> None:
    df = parse_dockerfile(write(tmp_path, "FROM debian:12\nRUN cat <<< hi\n"))
    assert isinstance(df.steps[1], Run)


@pytest.mark.parametrize(
    ("ref", "suite", "has", "noted"),
    [
        ("debian:bookworm", "bookworm", None, False),
        ("debian:bookworm-slim", "bookworm", None, False),
        ("debian:12.5-slim", "bookworm", None, False),
        ("docker.io/library/debian:trixie@sha256:abc", "trixie", None, False),
        ("python:3.11-slim-bookworm", "bookworm", "python3-venv", False),
        ("python:3.12-slim", "bookworm", "python3-pip", True),
        ("python:3.11", "bookworm", "build-essential", False),
        ("python:3.13-trixie", "trixie", "python3", False),
        ("buildpack-deps:bookworm", "bookworm", "build-essential", False),
        ("buildpack-deps:bookworm-curl", "bookworm", "curl", False),
        ("ubuntu:22.04", "bookworm", None, True),
        ("ubuntu:24.04", "trixie", None, True),
        ("ghcr.io/laude-institute/t-bench/python-3-13:20250620", "trixie", "tmux", True),
    ],
)
def test_resolve_base(ref: str, suite: str, has: str | None, noted: bool) -> None:
    base = resolve_base(ref)
    assert base.suite == suite and base.image == ref
    if has:
        assert has in base.packages
    assert (base.note is not None) == noted
    if "slim" in ref and ref.startswith("python"):
        assert "build-essential" not in base.packages


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("ghcr.io/foo/bar:1", "registry"),
        ("nvidia/cuda:12.4.1-devel-ubuntu22.04", "registry"),
        ("alpine:3.20", "registry"),
        ("python:3.12-alpine", "Alpine"),
        ("debian:bullseye", "Debian 12"),
        ("debian:latest", "Debian 12"),
        ("ubuntu:20.04", "ubuntu:22.04"),
        ("scratch", "scratch"),
        ("mystery:1", "unknown base"),
    ],
)
def test_resolve_base_refuses(ref: str, why: str) -> None:
    with pytest.raises(ImageBuildError) as info:
        resolve_base(ref, file="Dockerfile", line=3)
    assert why in str(info.value) and str(info.value).startswith("Dockerfile:3: ")
