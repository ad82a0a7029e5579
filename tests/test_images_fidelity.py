"""Task fidelity (slow): built python:X images behave like the official ones, Harbor's template
pattern validates, and the verifier fields are carried out end to end (bwrap, root, a Debian
base built from the host's apt mirror, packages from the host's pip configuration)."""

from __future__ import annotations

import io
import os
import shutil
import textwrap
import zipfile
from pathlib import Path

import pytest

from sandfleet.rollout import RunConfig, ScriptedPolicy, run_suite
from sandfleet.rollout.validate import validate_tasks
from sandfleet.sandbox import create_sandbox
from sandfleet.tasks import load_task
from sandfleet.tasks.images import build_task_image

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"), reason="needs root and bwrap")]


@pytest.fixture(scope="module", autouse=True)
def can_build() -> None:
    from sandfleet.images.debootstrap import why_no_build

    why = why_no_build()
    if why:
        pytest.skip(f"no Debian base can be built here: {why}")


def harbor_task(root: Path, name: str, dockerfile: str, *, toml: str = "", test_sh: str = "", solve: str = "",
                files: dict[str, str] | None = None, top: str = "") -> Path:
    """A Harbor task; ``top`` goes before the tables, ``toml`` after ``[verifier]``'s keys."""
    folder = root / name
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text(f'schema_version = "1.4"\n{top}[agent]\ntimeout_sec = 120\n'
                                      "[verifier]\ntimeout_sec = 120\n" + toml)
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    (folder / "tests" / "test.sh").write_text(test_sh or "echo 1 > /logs/verifier/reward.txt\n")
    (folder / "solution" / "solve.sh").write_text(solve or "true\n")
    for rel, text in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def tiny_wheel() -> bytes:
    """A pure-Python wheel (no build, no index): ``sftiny`` 1.0."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("sftiny.py", "VALUE = 42\n")
        z.writestr("sftiny-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: sftiny\nVersion: 1.0\n")
        z.writestr("sftiny-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                   "Tag: py3-none-any\n")
        z.writestr("sftiny-1.0.dist-info/RECORD", "sftiny.py,,\nsftiny-1.0.dist-info/METADATA,,\n"
                   "sftiny-1.0.dist-info/WHEEL,,\nsftiny-1.0.dist-info/RECORD,,\n")
    return buf.getvalue()


@pytest.mark.parametrize(("version", "suite"), [("3.11", "bookworm"), ("3.13", "trixie")])
async def test_python_slim_is_like_the_official_image(tmp_path: Path, version: str, suite: str) -> None:
    folder = harbor_task(tmp_path, f"py{version}", f"FROM python:{version}-slim\nRUN pip install pytest==8.4.1\n"
                         "WORKDIR /app\n")
    image = build_task_image(load_task(folder))  # RUN pip install: no --break-system-packages
    assert image.meta["base_used"] == f"python:{version}-slim -> debian {suite} (python {version})"
    assert image.meta["warnings"] == [] and str(image.meta["python"]).startswith(version + ".")
    sb = await create_sandbox(image=image.hash, workdir="/app", backend="bwrap")
    try:
        r = await sb.exec("python -V; command -v python python3 pip; "
                          "python -c 'import pytest; print(pytest.__version__)'", user="root")
        assert r.exit_code == 0, r.output
        lines = r.stdout.splitlines()
        assert lines[0].startswith(f"Python {version}.")
        assert [line.rsplit("/", 1)[-1] for line in lines[1:4]] == ["python", "python3", "pip"]
        assert lines[4] == "8.4.1"
        r = await sb.exec("ls /usr/lib/python3*/EXTERNALLY-MANAGED /usr/local/lib/python3*/EXTERNALLY-MANAGED",
                          user="root")
        assert r.exit_code != 0 and "No such file" in r.stderr  # no PEP 668 marker anywhere
        await sb.write_file("/tmp/sftiny-1.0-py3-none-any.whl", tiny_wheel(), user="root")
        r = await sb.exec("pip install --no-index /tmp/sftiny-1.0-py3-none-any.whl && python -c "
                          "'import sftiny; print(sftiny.VALUE)'", user="root")
        assert r.exit_code == 0 and r.stdout.strip().endswith("42"), r.output
        assert "externally-managed" not in r.output
    finally:
        await sb.close()


async def test_harbor_template_pattern_validates() -> None:
    task = load_task(FIXTURES / "harbor-template-uv")
    verdicts = await validate_tasks([task], repeats=1, backend="bwrap")
    v = verdicts["harbor-template-uv"]
    assert v.status == "valid", v.reason
    assert v.base == "python:3.12-slim -> debian trixie (python 3.13)"
    assert v.warnings and "Python 3.12 is shipped by no Debian release" in v.warnings[0]
    assert (v.user, v.verifier_user, v.needs_network) == ("agent", "verifier", [])
    strict = (await validate_tasks([task], repeats=1, backend="bwrap", strict_bases=True))["harbor-template-uv"]
    assert strict.status == "invalid" and "refused by --strict-bases" in strict.reason


async def test_multi_stage_uv_and_user(tmp_path: Path) -> None:
    folder = harbor_task(tmp_path, "stages", textwrap.dedent("""\
        FROM python:3.11-slim AS build
        RUN mkdir -p /out/sub && echo built > /out/a.txt && ln -s a.txt /out/link && echo deep > /out/sub/d
        FROM python:3.11-slim
        COPY --from=ghcr.io/astral-sh/uv:0.9.5 /uv /uvx /bin/
        COPY --from=build /out /opt/out
        RUN useradd -m app
        USER app
        RUN id -un > /home/app/who
        WORKDIR /app
        """))
    image = build_task_image(load_task(folder))
    assert image.meta["stages"] == 2 and image.meta["user"] == "app"
    sb = await create_sandbox(image=image.hash, workdir="/app", backend="bwrap")
    try:
        r = await sb.exec("uv --version; cat /opt/out/a.txt /opt/out/link /opt/out/sub/d /home/app/who; "
                          "stat -c %U /home/app/who /opt/out/a.txt /app", user="root")
        # RUN after USER runs as app; COPY --from gives root's files; WORKDIR after USER is app's (BuildKit)
        assert r.stdout.split() == ["uv", "0.9.5", "built", "built", "deep", "app", "app", "root", "app"], r.output
        r = await sb.exec("id -un && touch /app/mine")  # the sandbox's user: the image's USER
        assert r.exit_code == 0 and r.stdout.strip() == "app", r.output
    finally:
        await sb.close()


async def test_separate_verifier_image_gets_only_the_artifacts(tmp_path: Path) -> None:
    folder = harbor_task(
        tmp_path, "separate", "FROM python:3.11-slim\nWORKDIR /app\n",
        top='artifacts = ["/app/out.txt"]\n', toml="\n[verifier.environment]\ncpus = 1\nmemory_mb = 1024\n",
        solve="echo hello > /app/out.txt; echo stray > /app/stray.txt\n",
        files={"tests/Dockerfile": "FROM python:3.11-slim\nCOPY . /tests/\nRUN echo verifier-image > /opt/marker\n",
               "tests/test.sh": textwrap.dedent("""\
                   ok=1
                   [ "$(cat /app/out.txt 2>/dev/null)" = hello ] || ok=0
                   [ -e /app/stray.txt ] && ok=0
                   [ "$(cat /opt/marker)" = verifier-image ] || ok=0
                   echo $ok > /logs/verifier/reward.txt
                   """)})
    task = load_task(folder)
    assert task.verifier.mode == "separate" and task.verifier.uploads == ()
    verdicts = await validate_tasks([task], repeats=1, backend="bwrap")
    assert verdicts["separate"].status == "valid", verdicts["separate"].reason


async def test_tb1_same_shell_and_verifier_network_policy(tmp_path: Path) -> None:
    from sandfleet.sandbox.network import availability

    tb1 = Path(shutil.copytree(FIXTURES / "tb1-hello", tmp_path / "same-shell"))
    (tb1 / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\n")
    text = (tb1 / "task.yaml").read_text().replace("run_tests_in_same_shell: false", "run_tests_in_same_shell: true")
    (tb1 / "task.yaml").write_text(text)
    (tb1 / "run-tests.sh").write_text(
        '#!/bin/bash\nif [ "$MAGIC" = 42 ] && [ "$PWD" = /app/sub ] && [ "$(id -un)" != root ]; then\n'
        '  echo "===== 1 passed in 0.01s ====="; else echo "===== 1 failed in 0.01s ====="; fi\n')
    report = await run_suite([load_task(tb1)], ScriptedPolicy(["mkdir -p /app/sub && cd /app/sub && export MAGIC=42"]),
                             RunConfig(backend="bwrap"))
    assert report.results[0].reward == 1.0, report.results[0].verifier_output
    if not availability()["available"]:
        pytest.skip("no user-mode networking here (pasta, nft)")
    count = "cat /proc/net/dev | tail -n +3 | grep -vc '^ *lo:'"
    folder = harbor_task(tmp_path, "offline-tests", "FROM python:3.11-slim\nWORKDIR /app\n",
                         toml='network_mode = "no-network"\n[environment]\nallow_internet = true\n',
                         test_sh=f'n=$({count}); [ "$n" = 0 ] && echo 1 > /logs/verifier/reward.txt '
                                 "|| echo 0 > /logs/verifier/reward.txt\n")
    task = load_task(folder)
    assert task.allow_internet and task.verifier.network is False
    report = await run_suite([task], ScriptedPolicy([f"{count} > /app/agent-ifaces"]),
                             RunConfig(backend="bwrap", network=True))
    assert report.results[0].reward == 1.0, report.results[0].verifier_output


def test_offline_install_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sandfleet.images.build as build
    from sandfleet.errors import ImageBuildError

    monkeypatch.setattr(build, "availability", lambda: {"available": False, "reason": "test: offline"})
    folder = harbor_task(tmp_path, "offline", "FROM python:3.11-slim\nRUN pip install sandfleet-offline-probe==1.0\n")
    with pytest.raises(ImageBuildError) as info:
        build_task_image(load_task(folder))
    message = str(info.value)
    assert "Dockerfile:2: RUN exited with" in message
    assert "pip install sandfleet-offline-probe==1.0: this build has no network" in message


def test_debootstrap_names_missing_packages() -> None:
    from sandfleet.errors import ImageBuildError
    from sandfleet.images.debootstrap import build_base

    with pytest.raises(ImageBuildError, match=r"Debian bookworm has no package\(s\) no-such-package-sf"):
        build_base("bookworm", ("python3", "no-such-package-sf"))
