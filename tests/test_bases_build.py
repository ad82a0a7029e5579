"""Synthetic tasks with each base form of issue 31, built and validated for real (slow: a
Debian base per release and language, debootstrapped from the host's apt mirror once and
cached): the oracle scores 1 and the no-op agent 0, with the substitution in the report; a
version no Debian ships is refused naming both. The other language images (rust, node, gcc,
eclipse-temurin, buildpack-deps:jammy) take minutes each: marker ``bases``, run by
``scripts/test-integrations.sh bases``."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import pytest

from sandfleet.rollout.validate import validate_tasks
from sandfleet.tasks import load_task

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"), reason="needs root and bwrap")]


@pytest.fixture(scope="module", autouse=True)
def can_build() -> None:
    from sandfleet.images.debootstrap import why_no_build

    why = why_no_build()
    if why:
        pytest.skip(f"no Debian base can be built here: {why}")


def task(root: Path, name: str, base: str, solve: str, check: str) -> Path:
    """A Harbor task on ``base``: the oracle runs ``solve``, the tests score 1 when ``check``
    (a shell condition) holds."""
    folder = root / name
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('schema_version = "1.4"\n[agent]\ntimeout_sec = 300\n'
                                      "[verifier]\ntimeout_sec = 300\n")
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "environment" / "Dockerfile").write_text(f"FROM {base}\nWORKDIR /app\n")
    (folder / "solution" / "solve.sh").write_text(textwrap.dedent(solve))
    (folder / "tests" / "test.sh").write_text(
        f"if {{ {check}; }} > /dev/null 2>&1; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n")
    return folder


GO_MAIN = """\
set -e
cd /app
cat > main.go <<'GO'
package main

import (
\t"fmt"
\t"runtime"
)

func main() { fmt.Println("hello", runtime.Version()) }
GO
go mod init hello
go build -o /app/hello .
"""


async def test_each_base_form_validates_or_is_refused(tmp_path: Path) -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    folders = [
        task(tmp_path, "go", "golang:1.22-bookworm", GO_MAIN,
             '[ "$(/app/hello)" = "hello go1.24.4" ] || [ "$(/app/hello | cut -c1-14)" = "hello go1.24" ] '
             '&& [ "$GOPATH" = /go ] && [ -x /usr/local/go/bin/go ]'),
        task(tmp_path, "pinned", f"public.ecr.aws/docker/library/debian:bookworm-slim@{digest}",
             "echo done > /app/out\n", '[ "$(cat /app/out)" = done ] && grep -q "^12" /etc/debian_version'),
        task(tmp_path, "point", "docker.io/library/python:3.11.9-slim",
             "python -c 'import sys; open(\"/app/out\", \"w\").write(sys.version[:4])'\n",
             '[ "$(cat /app/out)" = 3.11 ]'),
        task(tmp_path, "bullseye", "debian:bullseye-slim", "echo done > /app/out\n",
             '[ "$(cat /app/out)" = done ] && grep -q "^11" /etc/debian_version'),
        task(tmp_path, "go-new", "golang:1.26", GO_MAIN, "true"),
    ]
    tasks = [load_task(f) for f in folders]
    assert dict(tasks[0].env)["GOPATH"] == "/go"  # the image's env, at load: the agent's and the tests'
    verdicts = await validate_tasks(tasks, repeats=1, backend="bwrap")
    for name in ("go", "pinned", "point", "bullseye"):
        v = verdicts[name]
        assert v.status == "valid", f"{name}: {v.reason}"
        assert v.oracle_rewards == [1.0] and v.noop_rewards == [0.0]
    go = verdicts["go"]
    assert go.coverage == "approximated" and go.base_asked == ["Go 1.22"] and go.base_got == ["Go 1.24"]
    assert any("asked Go 1.22, got Go 1.24" in w for w in go.warnings), go.warnings
    assert go.base == "golang:1.22-bookworm -> debian trixie (Go 1.24)"
    pinned = verdicts["pinned"]
    assert pinned.coverage == "approximated" and any("digest pin" in w for w in pinned.warnings)
    assert verdicts["point"].coverage == "exact" and verdicts["point"].warnings == []
    assert verdicts["bullseye"].coverage == "exact"
    assert verdicts["bullseye"].base == "debian:bullseye-slim -> debian bullseye"
    new = verdicts["go-new"]
    assert new.status == "invalid" and new.coverage == "refused"
    assert "Go 1.26 is newer than any Debian release ships" in new.reason and "Go 1.24" in new.reason
    strict = await validate_tasks(tasks[:2], repeats=1, backend="bwrap", strict_bases=True)
    assert all(v.status == "invalid" and "refused by --strict-bases" in v.reason for v in strict.values())
