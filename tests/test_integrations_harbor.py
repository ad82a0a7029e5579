"""The Harbor environment's semantics (HarborSandbox: what SandfleetEnvironment delegates to),
without Harbor. scripts/test-integrations.sh runs the real ``harbor run`` against it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sandfleet.integrations import harbor
from sandfleet.integrations.harbor import HarborSandbox, Options, check_definition
from test_rollout_support import needs_bwrap

DOCKERFILE = "FROM python:3.11-slim-bookworm\nWORKDIR /app\nENV GREETING=hi\n"


def env_dir(root: Path, dockerfile: str = DOCKERFILE, name: str = "environment") -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "Dockerfile").write_text(dockerfile)
    return d


def test_definitions_sandfleet_cannot_build_are_refused(tmp_path: Path) -> None:
    compose = env_dir(tmp_path / "a")
    (compose / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(ValueError, match="docker compose"):
        check_definition(compose, None)
    bare = tmp_path / "b"
    bare.mkdir()
    with pytest.raises(ValueError, match="registry image .ghcr.io/x/y:1."):
        check_definition(bare, "ghcr.io/x/y:1")
    with pytest.raises(FileNotFoundError):
        check_definition(bare, None)
    check_definition(env_dir(tmp_path / "c"), None)


def test_options_take_only_their_keys() -> None:
    kwargs = {"backend": "microvm", "memory_mib": 2048, "network": False, "stream": False}
    opts = Options.pop_from(kwargs)
    assert (opts.backend, opts.memory_mib, opts.network) == ("microvm", 2048, False)
    assert kwargs == {"stream": False}


def test_the_environment_class_needs_harbor() -> None:
    try:
        import harbor as _  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="sandfleet\\[harbor\\]"):
            harbor.SandfleetEnvironment  # noqa: B018
    else:  # pragma: no cover - harbor's own venv
        assert harbor.SandfleetEnvironment.type() == "sandfleet"
    with pytest.raises(AttributeError):
        harbor.Missing  # noqa: B018


@needs_bwrap()
async def test_exec_users_cwd_env_timeouts_and_cancellation(tmp_path: Path) -> None:
    box = HarborSandbox(env_dir(tmp_path), "t", Options(backend="bwrap"), memory_mib=512, disk_mib=256)
    await box.start()
    try:
        assert await box.exec("pwd; echo $GREETING $X; id -u", env={"X": "y"}) == (0, "/app\nhi y\n1000\n", "")
        assert await box.exec("id -u", user="root", phase_user=False) == (0, "0\n", "")
        assert (await box.exec("pwd", cwd="/tmp"))[1] == "/tmp\n"
        with pytest.raises(RuntimeError, match="Command timed out after 1 seconds"):
            await box.exec("sleep 30", timeout_sec=1)
        running = asyncio.create_task(box.exec("sleep 31 & sleep 32; true"))
        await asyncio.sleep(0.5)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        await asyncio.sleep(0.3)
        left = await box.exec("ps -eo args | grep -c '^sleep 3[12]' || true", user="root", phase_user=False)
        assert left[1].strip() == "0"
        assert box.agent_users == {"agent"}
    finally:
        await box.stop()


@needs_bwrap()
async def test_transfers_and_the_tests_upload(tmp_path: Path) -> None:
    box = HarborSandbox(env_dir(tmp_path), "t", Options(backend="bwrap"), memory_mib=512, disk_mib=256)
    await box.start()
    try:
        # upload_file lands at exactly its target (parents made, mode kept), as root
        script = tmp_path / "solve.sh"
        script.write_text("#!/bin/bash\necho solved\n")
        script.chmod(0o750)
        await box.upload_file(script, "/solution/deep/run.sh")
        assert await box.exec("stat -c '%a %u' /solution/deep/run.sh") == (0, "750 0\n", "")
        # download_dir copies the contents, overwriting
        await box.exec("mkdir -p /logs/verifier/sub && echo 1 > /logs/verifier/reward.txt && echo x > "
                       "/logs/verifier/sub/f")
        target = tmp_path / "trial" / "verifier"
        target.mkdir(parents=True)
        (target / "reward.txt").write_text("stale")
        await box.download_dir("/logs/verifier", target)
        assert (target / "reward.txt").read_text() == "1\n" and (target / "sub" / "f").read_text() == "x\n"
        assert not (target / "verifier").exists() and [p.name for p in target.parent.iterdir()] == ["verifier"]
        await box.download_file("/logs/verifier/sub/f", tmp_path / "one" / "f")
        assert (tmp_path / "one" / "f").read_text() == "x\n"
        # the tests upload ends the agent's processes, and only root can write the tests
        await box.exec("setsid nohup sleep 60 >/dev/null 2>&1 & echo started")
        await box.exec("mkdir -p /tests && touch /tests/planted", user="root", phase_user=False)
        tests = tmp_path / "tests"
        tests.mkdir()
        (tests / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
        await box.upload_dir(tests, "/tests")
        ps = await box.exec("ps -eo user:12,args | grep '[s]leep 60' || true", user="root", phase_user=False)
        assert ps[1] == ""
        assert await box.exec("ls /tests; stat -c '%u %a' /tests") == (0, "test.sh\n0 755\n", "")
        assert (await box.exec("touch /tests/x"))[0] != 0
    finally:
        await box.stop()


@needs_bwrap()
async def test_separate_verifier_image_keeps_its_baked_tests(tmp_path: Path) -> None:
    tests = env_dir(tmp_path, "FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY . /tests/\n", name="tests")
    (tests / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    box = HarborSandbox(tests, "t", Options(backend="bwrap", network=False), network=True, disk_mib=256)
    await box.start()
    try:
        assert box.sandbox.spec.limits.network is False  # --ek network=false wins over the policy
        run = "ls /tests && mkdir /logs/verifier && bash /tests/test.sh && cat /logs/verifier/reward.txt"
        assert await box.exec(run) == (0, "Dockerfile\ntest.sh\n1\n", "")
    finally:
        await box.stop()


@needs_bwrap()
async def test_a_sandbox_killed_from_outside_is_an_infra_error_harbor_records(tmp_path: Path) -> None:
    """Harbor's trial exception info gets SandfleetInfraError (cause, how the sandbox ended);
    a command that merely fails is still the agent's."""
    from sandfleet.integrations.harbor import SandfleetInfraError
    from sandfleet.testing.faultpolicies import kill_from_host

    box = HarborSandbox(env_dir(tmp_path), "t", Options(backend="bwrap"), memory_mib=512, disk_mib=256)
    await box.start()
    try:
        assert (await box.exec("exit 3"))[0] == 3
        kill_from_host(box.sandbox)
        with pytest.raises(SandfleetInfraError, match=r"^infra_fault \(sandbox_died\)") as info:
            await box.exec("echo again")
        assert info.value.fault["sandbox_end"]["signal"] == "SIGKILL" and info.value.fault["phase"] == "agent"
        with pytest.raises(SandfleetInfraError):
            await box.download_file("/etc/hostname", tmp_path / "h")
    finally:
        await box.stop()


def test_a_misspelt_or_badly_typed_option_is_refused_up_front() -> None:
    from sandfleet.errors import ConfigError

    for kw, what in (({"backend": "bwarp"}, "unknown backend 'bwarp'"), ({"memory_mib": "lots"}, "memory_mib"),
                     ({"network": "maybe"}, "network"), ({"ttl_s": -1}, "ttl_s")):
        with pytest.raises(ConfigError, match=what):
            Options.pop_from(dict(kw))
    harbors = {"self", "environment_dir", "stream", "override_cpus", "kwargs"}
    kwargs = {"backnd": "bwrap", "stream": False, "override_cpus": 2}
    Options.pop_from(kwargs)
    with pytest.raises(ConfigError, match="no option 'backnd'.*its options: backend, cpus"):
        Options.refuse_unknown(kwargs, harbors)
    Options.refuse_unknown({"stream": False}, harbors)
