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
    assert not df.notes  # SHELL is carried out (test_shell_applies_to_later_runs)


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
        ("FROM debian:12\nCOPY --from=node:20 /usr/local/bin/node /x\n", 2, "the image 'node:20' is not supported"),
        ("FROM debian:12 AS a\nFROM debian:12 AS A\n", 2, "used twice"),
        ("FROM debian:12\nADD --from=0 /x /y\n", 2, "ADD --from"),
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
        ("docker.io/library/debian:trixie@sha256:abc", "trixie", None, True),  # a digest pin: warned
        ("python:3.11-slim-bookworm", "bookworm", "python3-venv", False),
        ("python:3.12-slim", "trixie", "python3-pip", True),
        ("python:3.13-slim", "trixie", "python-is-python3", False),
        ("python:3.11-slim-trixie", "bookworm", "python3", True),
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
        ("debian:buster", "Debian 12"),
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


def test_stages_and_copy_from(tmp_path: Path) -> None:
    df = parse_dockerfile(write(tmp_path, """\
ARG PY=3.12
FROM python:${PY}-slim AS Builder
ENV A=1
WORKDIR /src
RUN echo hi > x
FROM builder AS unused
RUN echo never built
FROM builder AS mid
USER nobody
FROM python:3.12-slim
COPY --from=ghcr.io/astral-sh/uv:0.9.5 /uv /uvx /bin/
COPY --from=mid /src/x /app/x
COPY --from=0 /src /app/src
"""))
    assert [s.name for s in df.stages] == ["builder", "unused", "mid", None]
    assert df.stages[2].parent == 0 and df.stages[2].env == {"A": "1"} and df.stages[2].workdir == "/src"
    assert df.stages[2].user == "nobody" and df.user is None and df.env == {}
    assert df.needed_stages() == [0, 2, 3]  # as BuildKit: only what the final stage needs
    uv, from_mid, from_zero = df.steps[1:]
    assert isinstance(uv, Copy) and uv.image == "ghcr.io/astral-sh/uv:0.9.5" and uv.stage is None
    assert uv.sources == ("/uv", "/uvx") and uv.dest == "/bin/"
    assert isinstance(from_mid, Copy) and from_mid.stage == 2 and isinstance(from_zero, Copy) and from_zero.stage == 0
    assert df.base_image == "python:3.12-slim"
    final_from_stage = parse_dockerfile(write(tmp_path, "FROM debian:12 AS b\nRUN true\nFROM b\nRUN true\n"))
    assert final_from_stage.base_image == "debian:12" and final_from_stage.needed_stages() == [0, 1]


def test_substitutions_warn_and_strict_refuses() -> None:
    base = resolve_base("python:3.12-slim")
    assert (base.suite, base.python, base.substituted) == ("trixie", "3.13", True)
    assert base.note is not None and "Python 3.12" in base.note and "3.13" in base.note
    assert base.describe() == "python:3.12-slim -> debian trixie (python 3.13)"
    for ref in ("python:3.12-slim", "ubuntu:24.04", "python:3.13-slim-bookworm"):
        with pytest.raises(ImageBuildError, match="refused by --strict-bases"):
            resolve_base(ref, strict=True)
    for ref in ("python:3.11-slim", "python:3.13-slim", "debian:bookworm", "buildpack-deps:trixie"):
        assert not resolve_base(ref, strict=True).substituted
    assert resolve_base("python:3.11-slim-bookworm").flavour == "python"
    assert resolve_base("debian:trixie").flavour is None
    with pytest.raises(ImageBuildError, match="no Debian release ships Python 3.14"):
        resolve_base("python:3.14-slim")


def test_shell_applies_to_later_runs(tmp_path: Path) -> None:
    df = parse_dockerfile(write(tmp_path, 'FROM debian:12 AS a\nRUN echo sh\n'
                                          'SHELL ["/bin/bash", "-o", "pipefail", "-c"]\n'
                                          'RUN echo bash\nRUN ["true"]\nFROM a\nRUN echo inherited\n'))
    first, second, exec_form = df.stages[0].steps[1:]
    assert isinstance(first, Run) and first.via is None
    assert isinstance(second, Run) and second.via == ("/bin/bash", "-o", "pipefail", "-c")
    assert isinstance(exec_form, Run) and exec_form.argv == ("true",) and exec_form.via is None
    assert isinstance(df.steps[1], Run) and df.steps[1].via == ("/bin/bash", "-o", "pipefail", "-c")
    with pytest.raises(ImageBuildError, match="SHELL needs a JSON array"):
        parse_dockerfile(write(tmp_path, "FROM debian:12\nSHELL bash -c\n"))
