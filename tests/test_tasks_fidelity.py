"""Task fidelity (fast): every Harbor 1.4 / TB1 field carried out or refused by name, reward
selection, test-time downloads, COPY --from refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.errors import ImageBuildError, RolloutError, TaskError
from sandfleet.images.tools import tool_path, uv_requirement
from sandfleet.tasks import load_task, reward_from
from sandfleet.tasks.reward import Reward, parse_reward_weights, select_reward, with_reward_selection
from sandfleet.tasks.scan import downloads_at_test_time
from support import FIXTURES, fixture_task


@pytest.fixture
def harbor(tmp_path: Path) -> Path:
    return fixture_task(tmp_path, "harbor-hello")


@pytest.fixture
def tb1(tmp_path: Path) -> Path:
    return fixture_task(tmp_path, "tb1-hello")


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_harbor_template_pattern_loads() -> None:
    task = load_task(FIXTURES / "harbor-template-uv")
    assert task.base_image == "python:3.12-slim"
    assert task.allow_internet is False and task.verifier.network is False  # network_mode = "no-network"
    assert task.verifier.mode == "shared" and task.verifier.environment is None
    assert downloads_at_test_time(task) == []  # pytest and the CTRF plugin are in the image


def test_network_policies(harbor: Path) -> None:
    toml = harbor / "task.toml"
    task = load_task(harbor)
    assert task.allow_internet is True and task.verifier.network is True  # allow_internet = true
    edit(toml, "allow_internet = true", 'network_mode = "no-network"')
    edit(toml, "[verifier]\n", '[verifier]\nnetwork_mode = "public"\n')
    task = load_task(harbor)
    assert task.allow_internet is False and task.verifier.network is True  # the verifier phase's own
    edit(toml, "[agent]\n", '[agent]\nnetwork_mode = "public"\n')
    assert load_task(harbor).allow_internet is True


def test_separate_verifier_and_artifacts(harbor: Path) -> None:
    toml = harbor / "task.toml"
    edit(toml, "artifacts = []", 'artifacts = ["/app/out", {source = "/srv/model.bin"}]')
    edit(toml, "[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    task = load_task(harbor)
    plan = task.verifier
    assert plan.mode == "separate" and plan.environment is not None
    assert plan.environment.dockerfile is None and not plan.environment.bundled_tests  # the task's own image
    assert plan.carried == ("/app/out", "/srv/model.bin", "/logs/artifacts")  # not the workdir, as Harbor
    assert [u.target for u in plan.uploads] == ["/tests"]
    # [verifier.environment] implies separate; tests/Dockerfile is the verifier's image, tests inside
    edit(toml, 'environment_mode = "separate"\n', "")
    toml.write_text(toml.read_text() + '\n[verifier.environment]\ncpus = 2\nmemory_mb = 1024\n'
                    'network_mode = "no-network"\n')
    (harbor / "tests" / "Dockerfile").write_text("FROM python:3.13-slim\nCOPY . /tests/\n")
    plan = load_task(harbor).verifier
    assert plan.mode == "separate" and plan.environment is not None and plan.environment.bundled_tests
    assert plan.environment.dockerfile == harbor / "tests" / "Dockerfile"
    assert (plan.environment.cpus, plan.environment.memory_mib) == (2, 1024)
    assert plan.uploads == () and plan.network is False


def test_workdir_env_and_canary(harbor: Path) -> None:
    toml = harbor / "task.toml"
    edit(toml, "[environment]\n", '[environment]\nworkdir = "/srv/job"\n')
    edit(toml, "[verifier.env]", '[verifier.env]\nMODE = "strict"\nPRICE = "5$"')
    (harbor / "instruction.md").write_text("<!-- harbor-canary GUID 123 -->\n\nDo the thing.\n")
    task = load_task(harbor)
    assert task.workdir == "/srv/job" and task.verifier.env == {"MODE": "strict", "PRICE": "5$"}
    assert task.instruction == "Do the thing.\n"  # as Harbor's strip_canary


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        ("gpus = 0", 'gpus = 0\ngpu_types = ["H100"]', "environment.gpu_types", "GPU types"),
        ("gpus = 0", 'gpus = 0\ntpu = {type = "v6e", topology = "2x4"}', "environment.tpu", "TPUs"),
        ("gpus = 0", 'gpus = 0\nhealthcheck = {command = "true"}', "environment.healthcheck", "healthchecks"),
        ("allow_internet = true", 'network_mode = "allowlist"', "environment.allowed_hosts", "needs allowed_hosts"),
        ("allow_internet = true", 'allowed_hosts = ["example.com"]', "environment.allowed_hosts",
         'needs network_mode = "allowlist"'),
        ("allow_internet = true", 'network_mode = "allowlist"\nallowed_hosts = ["x.org:443"]',
         "environment.allowed_hosts", "ports are not part of an entry"),
        ("allow_internet = true", 'allow_internet = true\nnetwork_mode = "public"', "environment.allow_internet",
         "not both"),
        ("gpus = 0", 'gpus = 0\nos = "windows"', "environment.os", "must be 'linux'"),
        ("[agent]\n", '[agent]\nnetwork_mode = "allowlist"\n', "agent.allowed_hosts", "needs allowed_hosts"),
        ("[verifier]\n", '[verifier]\nallowed_hosts = ["x.org"]\n', "verifier.allowed_hosts", "needs network_mode"),
        ("[verifier]\n", '[verifier]\ncollect = [{command = "true"}]\n', "verifier.collect", "collect hooks"),
        ("[verifier]\n", '[verifier]\nenvironment_mode = "shared"\nenvironment = {cpus = 2}\n',
         "verifier.environment_mode", "conflicts"),
        ("[verifier]\n", '[verifier]\nenvironment = {docker_image = "me/verifier:1"}\n',
         "verifier.environment.docker_image", "can't be pulled"),
        ("[verifier]\n", '[verifier]\nenvironment = {gpus = 1}\n', "verifier.environment.gpus", "GPUs"),
        ("artifacts = []", 'artifacts = [{source = "/a", destination = "a"}]', "artifacts.0.destination",
         "host folder"),
        ("artifacts = []", 'artifacts = [{source = "/a", exclude = ["*.log"]}]', "artifacts.0.exclude", "exclude"),
        ("artifacts = []", 'artifacts = [{source = "/a", service = "db"}]', "artifacts.0.service", "compose"),
        ("artifacts = []", 'artifacts = []\nmulti_step_reward_strategy = "mean"', "multi_step_reward_strategy",
         "multi-step"),
        ("[verifier.env]", '[verifier.env]\nKEY = "${OPENAI_API_KEY}"', "verifier.env.KEY", "host environment"),
        ("[solution.env]", '[solution.env]\nKEY = "${X:-1}"', "solution.env.KEY", "host environment"),
    ],
)
def test_harbor_refusals_name_the_field(harbor: Path, old: str, new: str, field: str, message: str) -> None:
    edit(harbor / "task.toml", old, new)
    with pytest.raises(TaskError) as info:
        load_task(harbor)
    assert info.value.field == field, str(info.value)
    assert message in str(info.value)


def test_allowlist_policies_per_phase(harbor: Path) -> None:
    """network_mode = "allowlist" for the environment, the agent and the verifier (issue 31):
    each phase's list; a public or no-network phase beside an allowlisted one keeps the
    machinery with everything or nothing listed, so the sandbox can switch between them."""
    toml = harbor / "task.toml"
    edit(toml, "allow_internet = true", 'network_mode = "allowlist"\nallowed_hosts = ["pkg.example.org", "10.0.0.0/8"]')
    task = load_task(harbor)
    assert task.allowed_hosts == ("pkg.example.org", "10.0.0.0/8") and task.allow_internet
    assert task.verifier.allowed_hosts == ("pkg.example.org", "10.0.0.0/8") and task.verifier.network is True
    edit(toml, "[verifier]\n", '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["astral.sh"]\n')
    edit(toml, "[agent]\n", '[agent]\nnetwork_mode = "no-network"\n')
    task = load_task(harbor)
    assert task.allowed_hosts == () and not task.allow_internet  # nothing listed: no egress
    assert task.verifier.allowed_hosts == ("astral.sh",)
    edit(toml, 'network_mode = "no-network"', 'network_mode = "public"')
    assert load_task(harbor).allowed_hosts == ("*", "0.0.0.0/0")


def test_verifier_compose_is_refused(harbor: Path) -> None:
    edit(harbor / "task.toml", "[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    (harbor / "tests" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(TaskError, match="docker compose"):
        load_task(harbor)


def test_tb1_same_shell_and_root(tb1: Path) -> None:
    task = load_task(tb1)
    assert task.verifier.user == "root" and not task.verifier.same_shell and task.verifier.network is None
    edit(tb1 / "task.yaml", "run_tests_in_same_shell: false", "run_tests_in_same_shell: true")
    plan = load_task(tb1).verifier
    assert plan.same_shell and plan.user is None  # the agent's shell, so the agent's user


def test_tb1_test_scripts(tb1: Path) -> None:
    edit(tb1 / "task.yaml", "parser_name: pytest", "parser_name: pytest\ntest_scripts: [setup-uv-pytest.sh]")
    with pytest.raises(TaskError) as info:
        load_task(tb1)
    assert info.value.field == "test_scripts.0" and "setup-uv-pytest.sh" in str(info.value)
    (tb1 / "tests" / "setup-uv-pytest.sh").write_text("true\n")
    assert load_task(tb1).name == "tb1-hello"


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("    command:", "    ports: ['80:80']\n    command:", "services.client.ports"),
        ("      - TEST_DIR=${T_BENCH_TEST_DIR}", "      - TEST_DIR=${T_BENCH_TEST_DIR}\n      - SECRET=1",
         "services.client.environment"),
        ("      dockerfile: Dockerfile", "      dockerfile: Dockerfile.other", "services.client.build"),
        ("      - ${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}",
         "      - ${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}\n      - ./data:/data",
         "services.client.volumes"),
        ("services:", "networks: {}\nservices:", "networks"),
    ],
)
def test_tb1_compose_refusals_name_the_field(tb1: Path, old: str, new: str, field: str) -> None:
    edit(tb1 / "docker-compose.yaml", old, new)
    with pytest.raises(TaskError) as info:
        load_task(tb1)
    assert info.value.field == field, str(info.value)


def test_needs_network_at_test_time_names_the_lines(tb1: Path) -> None:
    found = downloads_at_test_time(load_task(tb1))
    assert any("run-tests.sh:5: downloads and runs a script: curl -LsSf" in f for f in found), found
    (tb1 / "run-tests.sh").write_text("#!/bin/bash\nuvx -p 3.13 -w pytest pytest $TEST_DIR -rA\n")
    assert downloads_at_test_time(load_task(tb1)) == [
        "run-tests.sh:2: uvx fetches its tools: uvx -p 3.13 -w pytest pytest $TEST_DIR -rA"]
    (tb1 / "run-tests.sh").write_text("#!/bin/bash\n# curl https://x | sh in a comment\npython3 -m pytest -rA\n")
    assert downloads_at_test_time(load_task(tb1)) == []


def test_reward_selection(harbor: Path) -> None:
    rewards = Reward(0.5, {"accuracy": 1.0, "style": 0.0})
    assert select_reward(rewards).value == 0.5
    assert select_reward(rewards, "style").value == 0.0
    assert select_reward(rewards, weights={"accuracy": 0.75, "style": 0.25}).value == 0.75
    with pytest.raises(RolloutError) as info:
        select_reward(rewards, "speed")
    assert info.value.reason == "reward_key_missing" and "'speed'" in str(info.value)
    assert "accuracy, style" in str(info.value)
    assert parse_reward_weights("a=0.7, b=0.3") == {"a": 0.7, "b": 0.3}
    for bad in ("a", "a=x", "=1", "a=inf"):
        with pytest.raises(ValueError):
            parse_reward_weights(bad)
    task = load_task(harbor)
    chosen = with_reward_selection(task, "style")
    assert chosen.verifier.reward_key == "style"
    assert reward_from(chosen.verifier, reward_json='{"accuracy": 1, "style": 0.25}').value == 0.25
    # the default: 'reward', else the only key, else the mean; with reward.txt too, the two must agree
    assert reward_from(task.verifier, reward_json='{"accuracy": 1, "style": 0}', reward_text="0.5").value == 0.5
    with pytest.raises(RolloutError) as info:
        reward_from(task.verifier, reward_json='{"accuracy": 1, "style": 0}', reward_text="1")
    assert info.value.reason == "reward_conflict"
    with pytest.raises(ValueError, match="not both"):
        with_reward_selection(task, "a", {"b": 1.0})
    tb1 = load_task(FIXTURES / "tb1-hello")
    assert with_reward_selection(tb1, "style") == tb1  # a TB1 reward is its pytest verdict


def test_copy_from_uv_paths_and_versions() -> None:
    assert uv_requirement("ghcr.io/astral-sh/uv:0.9.5") == "uv==0.9.5"
    assert uv_requirement("ghcr.io/astral-sh/uv:0.5") == "uv==0.5.*"
    assert uv_requirement("ghcr.io/astral-sh/uv:latest") == "uv"
    assert uv_requirement("ghcr.io/astral-sh/uv:0.5.11-python3.12-bookworm") == "uv==0.5.11"
    assert tool_path("ghcr.io/astral-sh/uv", "/uvx") == "uvx"
    assert tool_path("ghcr.io/astral-sh/uv", "/usr/local/bin/uv") == "uv"
    with pytest.raises(ImageBuildError, match="/usr/local/lib/python3.12"):
        tool_path("ghcr.io/astral-sh/uv", "/usr/local/lib/python3.12")


def test_failed_installs_name_their_packages() -> None:
    from sandfleet.images.mirrors import install_failure, installs

    assert installs("apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
                    "curl git && rm -rf /var/lib/apt/lists/*") == [("apt-get install", ["curl", "git"])]
    assert installs("pip install --no-cache-dir -r req.txt pytest==8.4.1; uv pip install --system pytest-json-ctrf") \
        == [("pip install", ["requirements from req.txt", "pytest==8.4.1"]), ("uv pip install", ["pytest-json-ctrf"])]
    assert installs("python3 -m pip install requests") == [("pip install", ["requests"])]
    assert installs("echo pip install x > notes.txt") == []
    offline = install_failure("pip install pytest", "ERROR: ...", network=False)
    assert offline is not None and "pip install pytest" in offline and "no network" in offline
    unreachable = install_failure("apt-get install -y tmux", "Temporary failure resolving 'mirror'", network=True)
    assert unreachable is not None and "apt-get install tmux" in unreachable and "could not be reached" in unreachable
    assert install_failure("make all", "error", network=True) is None
