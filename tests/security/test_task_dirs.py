"""The task folders (/tests, /solution, /oracle) are root's, mode 0755, before the agent starts
(issue 46): the backend's launcher makes ``SandboxSpec.root_dirs`` so when it makes the
writable dirs, also where the image already has them, and the verifier then runs no command
of its own to do it. A non-root agent can't write them, nor replace what is uploaded there."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import backend_skip
from sandfleet.errors import ConfigError
from sandfleet.rollout import ScriptedPolicy
from sandfleet.rollout.runner import task_spec
from sandfleet.rollout.verifier import TASK_DIRS, protect_task_dirs
from sandfleet.sandbox import create_sandbox, make_spec
from sandfleet.sandbox.base import Sandbox
from sandfleet.sandbox.registry import BY_NAME, honours_root_dirs
from sandfleet.sandbox.spec import SandboxSpec
from test_rollout_support import make_task, run

GVISOR = pytest.param("gvisor", marks=[pytest.mark.slow, pytest.mark.skipif(
    bool(backend_skip("gvisor")), reason=str(backend_skip("gvisor")))])
BACKENDS = pytest.mark.parametrize("backend", [
    pytest.param("bwrap", marks=pytest.mark.skipif(bool(backend_skip("bwrap")), reason=str(backend_skip("bwrap")))),
    GVISOR])
# each folder's owner:group:mode as the agent sees it, and whether the agent could write in it
PROBE = ('for d in /tests /solution /oracle /logs; do '
         'echo "$d $(stat -c %u:%g:%a "$d") '
         '$(mktemp -p "$d" planted.XXXXXX >/dev/null 2>&1 && echo WROTE || echo REFUSED)"; done')
IMAGE_HAS_THEM = ("FROM python:3.11-slim-bookworm\nWORKDIR /app\n"
                  "RUN mkdir -m 0777 /tests /oracle && chown 1000:1000 /tests && touch /tests/from-image\n")


async def _probe(sb: Sandbox) -> list[str]:
    res = await sb.exec(["sh", "-c", PROBE], cwd="/", user="agent", timeout=30)
    assert res.exit_code == 0, res.output
    return res.stdout.splitlines()


def test_root_dirs_must_be_normalized_writable_dirs() -> None:
    assert SandboxSpec().root_dirs == ()
    assert make_spec(root_dirs=("/tests", "/oracle")).root_dirs == ("/tests", "/oracle")
    with pytest.raises(ConfigError, match=r"root_dirs '/etc' is not in writable_dirs"):
        make_spec(root_dirs=("/etc",))
    with pytest.raises(ConfigError, match=r"root_dirs '/tests' is not in writable_dirs"):
        make_spec(writable_dirs=("/logs",), root_dirs=("/tests",))
    for bad in ("tests", "/", "/a/../tests"):
        with pytest.raises(ConfigError, match="root_dirs must be an absolute path"):
            make_spec(root_dirs=(bad,))
    for bad in ("/tests/", "//tests", "/./tests"):
        with pytest.raises(ConfigError, match="root_dirs must be normalized"):
            make_spec(writable_dirs=(bad,), root_dirs=(bad,))


async def test_a_bad_root_dir_is_refused_before_any_sandbox_starts() -> None:
    with pytest.raises(ConfigError, match=r"root_dirs '/nope' is not in writable_dirs"):
        await create_sandbox(backend="process", root_dirs=("/nope",))


def test_the_registry_and_the_task_spec(tmp_path: Path) -> None:
    assert {n for n, b in BY_NAME.items() if b.root_dirs} == {"bwrap", "gvisor"}
    assert honours_root_dirs("bwrap") and not honours_root_dirs("microvm") and not honours_root_dirs("remote")
    task = make_task(tmp_path)
    spec = task_spec(task, "host")
    assert spec.root_dirs == TASK_DIRS and set(spec.root_dirs) <= set(spec.writable_dirs)


@BACKENDS
async def test_root_dirs_start_roots_0755_and_the_agent_can_not_write_them(backend: str) -> None:
    sb = await create_sandbox(backend=backend, ttl_s=120, root_dirs=("/tests", "/oracle"))
    try:
        assert await _probe(sb) == ["/tests 0:0:755 REFUSED", "/solution 1000:1000:755 WROTE",
                                    "/oracle 0:0:755 REFUSED", "/logs 1000:1000:755 WROTE"]
        # root still writes there (the uploads of the tests and the solution)
        res = await sb.exec(["sh", "-c", "touch /tests/t && stat -c %u /tests/t"], cwd="/", user="root")
        assert (res.exit_code, res.stdout.strip()) == (0, "0"), res.output
        # a task folder left the user's (/solution): the verifier gives them to root itself
        await protect_task_dirs(sb)
        assert [line.split()[1] for line in await _probe(sb)][:3] == ["0:0:755"] * 3
    finally:
        await sb.close()


@BACKENDS
async def test_the_verifier_runs_nothing_where_the_start_made_the_task_folders_roots(backend: str) -> None:
    sb = await create_sandbox(backend=backend, ttl_s=120, root_dirs=TASK_DIRS)
    try:
        assert [line.split()[1:] for line in await _probe(sb)][:3] == [["0:0:755", "REFUSED"]] * 3
        await sb.exec(["chmod", "0777", "/tests"], cwd="/", user="root")
        await protect_task_dirs(sb)
        assert (await _probe(sb))[0] == "/tests 0:0:777 WROTE"  # no command ran: the test's own chmod stays
        # after root ran something there (the task's prepare step) it gives them to root again
        await protect_task_dirs(sb, root_ran=True)
        assert (await _probe(sb))[0] == "/tests 0:0:755 REFUSED"
    finally:
        await sb.close()


@BACKENDS
async def test_root_dirs_the_image_already_has_become_roots_0755(
        backend: str, tmp_path: Path, with_python_base_cache: Path) -> None:
    from sandfleet.tasks.images import build_task_image

    image = build_task_image(make_task(tmp_path, dockerfile=IMAGE_HAS_THEM))
    sb = await create_sandbox(backend=backend, image=image.hash, ttl_s=120, root_dirs=("/tests", "/oracle"))
    try:
        assert await _probe(sb) == ["/tests 0:0:755 REFUSED", "/solution 1000:1000:755 WROTE",
                                    "/oracle 0:0:755 REFUSED", "/logs 1000:1000:755 WROTE"]
        res = await sb.exec(["ls", "/tests"], cwd="/", user="agent")
        assert "from-image" in res.stdout  # the image's folder, its owner and mode changed, kept
    finally:
        await sb.close()


@pytest.mark.skipif(bool(backend_skip("bwrap")), reason=str(backend_skip("bwrap")))
@pytest.mark.parametrize("fork", [False, True])
async def test_a_rollouts_task_folders_are_roots_with_a_prepare_step_or_an_image_that_opened_them(
        tmp_path: Path, with_python_base_cache: Path, fork: bool) -> None:
    """The agent of a rollout can't write the task folders, also where the image made them
    0777 and the agent's, or the task's prepare step (root) opened them after the start (run
    in the rollout's own sandbox, or once for a group that forks from its prepared state)."""
    report = "#!/bin/bash\ncat /app/probe.txt\nmkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt\n"
    image = make_task(tmp_path, "image-opened", dockerfile=IMAGE_HAS_THEM, test_sh=report)
    prepare = make_task(tmp_path, "prepare-opened", test_sh=report,
                        prepare="#!/bin/bash\nchmod 0777 /tests /solution /oracle\n")
    results = (await run([image, prepare], ScriptedPolicy([PROBE + " > /app/probe.txt"]), fork=fork)).results
    for r in results:
        assert r.status == "completed", r.error
        lines = r.verifier_output.splitlines()
        for d in TASK_DIRS:
            assert f"{d} 0:0:755 REFUSED" in lines, (r.task, r.verifier_output)
        assert "/logs 1000:1000:755 WROTE" in lines, (r.task, r.verifier_output)
    assert ("prepared_from" in results[1].info) == fork  # the prepare task's member forked, or ran it
