"""Loading Harbor and Terminal-Bench-1 task folders, and every malformed-input error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandfleet.errors import ImageBuildError, TaskError
from sandfleet.tasks import load_task, load_tasks
from support import FIXTURES, fixture_task


@pytest.fixture
def harbor(tmp_path: Path) -> Path:
    return fixture_task(tmp_path, "harbor-hello")


@pytest.fixture
def tb1(tmp_path: Path) -> Path:
    return fixture_task(tmp_path, "tb1-hello")


def set_toml(folder: Path, old: str, new: str) -> None:
    path = folder / "task.toml"
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_harbor_task_loads_as_published(harbor: Path) -> None:
    task = load_task(harbor)
    assert task.name == "harbor-hello" and task.format == "harbor"
    assert task.instruction.startswith("Create a file called /app/hello.txt")
    assert (task.agent_timeout_s, task.verifier_timeout_s, task.build_timeout_s) == (360, 120, 600)
    assert (task.cpus, task.memory_mib, task.storage_mib) == (1, 2048, 10240)
    assert task.dockerfile == harbor / "environment" / "Dockerfile"
    assert task.context_dir == harbor / "environment"
    assert task.base_image == "python:3.13-slim-bookworm"
    assert task.workdir == "/app"  # WORKDIR ${APP_DIR} with ARG APP_DIR=/app
    assert task.env == {"PYTHONUNBUFFERED": "1", "GREETING": "Hello, world!"}
    assert task.metadata["difficulty"] == "easy"
    assert task.metadata["task"]["name"] == "terminal-bench/hello-world"
    assert task.solution is not None and task.solution.command == ("bash", "/solution/solve.sh")
    assert task.solution.uploads[0].target == "/solution"
    assert task.verifier.command == ("bash", "/tests/test.sh")
    assert task.verifier.uploads[0].source == harbor / "tests"
    assert task.verifier.reward == "reward-file"


def test_tb1_task_loads_as_published(tb1: Path) -> None:
    task = load_task(tb1)
    assert task.format == "terminal-bench-1"
    assert task.instruction == 'Create a file called /app/hello.txt. Write "Hello, world!" to it.'
    assert (task.agent_timeout_s, task.verifier_timeout_s) == (360, 60)
    assert task.context_dir == tb1 and task.workdir == "/app"
    assert task.solution is not None and task.solution.command == ("bash", "/oracle/solution.sh")
    plan = task.verifier
    assert plan.command == ("bash", "/tests/run-tests.sh")
    assert plan.env == {"TEST_DIR": "/tests"} and plan.user == "root"
    assert [u.target for u in plan.uploads] == ["/tests/run-tests.sh", "/tests"]
    assert plan.reward == "pytest-output" and plan.parser_name == "pytest"
    assert task.metadata["author_email"] == "alexgshaw64@gmail.com"


def test_tb1_descriptions_solution_yaml_and_default_run_tests(tb1: Path) -> None:
    text = (
        (tb1 / "task.yaml")
        .read_text()
        .replace(
            "instruction: |-\n  Create",
            "descriptions:\n  - key: base\n    description: |-\n      Create",
        )
    )
    (tb1 / "task.yaml").write_text(text)
    (tb1 / "solution.sh").unlink()
    (tb1 / "run-tests.sh").unlink()
    (tb1 / "solution.yaml").write_text(
        "- command: echo hi > /app/hello.txt\n  min_timeout_sec: 0.1\n  block: true\n"
        "  append_enter: true\n"
    )
    task = load_task(tb1)
    assert task.instruction.startswith("Create a file")
    assert task.solution is not None and task.solution.command is None
    assert task.solution.commands[0].command == "echo hi > /app/hello.txt"
    assert task.solution.commands[0].block is True
    default = task.verifier.uploads[0].source
    assert default.name == "run-tests.sh" and "python3 -m pytest" in default.read_text()


def test_load_tasks_sorts_and_collects_errors(tmp_path: Path) -> None:
    for name in ("zeta", "alpha"):
        shutil.copytree(FIXTURES / "harbor-hello", tmp_path / name)
    shutil.copytree(FIXTURES / "tb1-hello", tmp_path / "mid")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "task.toml").write_text("[agent]\ntimeout_sec = -1\n")
    (tmp_path / "not-a-task").mkdir()
    tasks, failures = load_tasks(tmp_path)
    assert [t.name for t in tasks] == ["alpha", "mid", "zeta"]
    assert [f.path.name for f in failures] == ["broken"]
    assert "agent.timeout_sec" in str(failures[0].error)
    one, none = load_tasks(tmp_path / "alpha")
    assert [t.name for t in one] == ["alpha"] and not none


def test_examples_load() -> None:
    examples = Path(__file__).parent.parent / "examples" / "tasks"
    if not examples.is_dir():
        pytest.skip("no examples/tasks in this checkout")
    tasks, failures = load_tasks(examples)
    assert tasks and not failures


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        (
            "[agent]\ntimeout_sec = 360.0",
            "[agent]\ntimeout_sec = -5",
            "agent.timeout_sec",
            "must be a positive number",
        ),
        (
            "[agent]\ntimeout_sec = 360.0",
            '[agent]\ntimeout_sec = "soon"',
            "agent.timeout_sec",
            "must be a number",
        ),
        (
            "[verifier]\ntimeout_sec = 120.0",
            "[verifier]\ntimeout_sec = 0",
            "verifier.timeout_sec",
            "must be a positive number",
        ),
        ("cpus = 1", "cpus = 1\ncpu_count = 2", "environment.cpu_count", "unknown key"),
        ("[agent]\n", "[agent]\ntimeout = 5\n", "agent.timeout", "unknown key"),
        (
            "allow_internet = true",
            'allow_internet = "yes"',
            "environment.allow_internet",
            "must be true or false",
        ),
        ("gpus = 0", "gpus = 1", "environment.gpus", "GPUs are not supported"),
        (
            "mcp_servers = []",
            'mcp_servers = [{name = "x", url = "http://x"}]',
            "environment.mcp_servers",
            "MCP servers are not supported",
        ),
        ("memory_mb = 2048", 'memory = "lots"', "environment.memory", "must be a size"),
        ("artifacts = []", 'artifacts = ["app/out"]', "artifacts.0", "must be an absolute path"),
        ("artifacts = []", 'artifacts = ["/app/../etc"]', "artifacts.0", "without '..'"),
        ("artifacts = []", "artifacts = [3]", "artifacts.0", "must be a path"),
        ("artifacts = []", 'artifacts = [{dest = "x"}]', "artifacts.0.source", "is required"),
        ("[agent]\n", '[agent]\nuser = "a b"\n', "agent.user", "invalid user name"),
        ("[verifier]\n", "[verifier]\nuser = 70000\n", "verifier.user", "outside the sandbox's uids"),
        (
            "[verifier]\n",
            '[verifier]\nenvironment_mode = "elsewhere"\n',
            "verifier.environment_mode",
            "must be 'shared' or 'separate'",
        ),
        ("[verifier.env]", "[verifier.env]\nX = 1", "verifier.env.X", "must be a string"),
        (
            "[environment.env]",
            '[environment.env]\nKEY = "${HOST_KEY}"',
            "environment.env.KEY",
            "host environment",
        ),
        ("schema_version", "surprise = 1\nschema_version", "surprise", "unknown key"),
    ],
)
def test_harbor_errors_name_file_and_field(
    harbor: Path, old: str, new: str, field: str, message: str
) -> None:
    set_toml(harbor, old, new)
    with pytest.raises(TaskError) as info:
        load_task(harbor)
    assert info.value.file == str(harbor / "task.toml")
    assert info.value.field == field
    assert message in str(info.value)
    assert str(info.value).startswith(f"{harbor / 'task.toml'}: field '{field}': ")


def test_harbor_users_and_artifacts_are_read(harbor: Path) -> None:
    from sandfleet.tasks.model import declared_agent_user

    task = load_task(harbor)
    assert task.agent_user is None and task.verifier.user is None and task.artifacts == ()
    assert declared_agent_user(task) == "agent"  # nothing declared: the non-root agent
    assert declared_agent_user(task, "app:staff") == "app"  # the image's USER, its user part
    set_toml(harbor, "artifacts = []", 'artifacts = ["/var/out/", {source = "/srv/./model.bin", service = "main"}]')
    set_toml(harbor, "[agent]\n", '[agent]\nuser = "root"\n')
    set_toml(harbor, "[verifier]\n", "[verifier]\nuser = 0\n")
    task = load_task(harbor)
    assert task.artifacts == ("/var/out", "/srv/model.bin")
    assert task.agent_user == "root" and declared_agent_user(task, "app") == "root"
    assert task.verifier.user == "0"
    dockerfile = harbor / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "USER 1234:1234\n")
    set_toml(harbor, '[agent]\nuser = "root"\n', "[agent]\n")
    assert declared_agent_user(load_task(harbor)) == "1234"


def test_harbor_legacy_sizes_and_unknown_metadata_are_accepted(harbor: Path) -> None:
    set_toml(harbor, "memory_mb = 2048", 'memory = "4G"')
    set_toml(harbor, "storage_mb = 10240", 'storage = "512M"')
    set_toml(harbor, "[metadata]", "[metadata]\nanything_goes = {nested = [1, 2]}")
    task = load_task(harbor)
    assert (task.memory_mib, task.storage_mib) == (4096, 512)
    assert task.metadata["anything_goes"] == {"nested": [1, 2]}


@pytest.mark.parametrize(
    ("mutate", "file", "message"),
    [
        (lambda p: (p / "task.toml").write_text("[agent\n"), "task.toml", "not valid TOML"),
        (lambda p: (p / "instruction.md").unlink(), "instruction.md", "can't read"),
        (lambda p: (p / "instruction.md").write_text("  \n"), "instruction.md", "is empty"),
        (lambda p: (p / "tests" / "test.sh").unlink(), "tests/test.sh", "missing"),
        (
            lambda p: (p / "environment" / "Dockerfile").unlink(),
            "environment/Dockerfile",
            "docker_image",
        ),
        (
            lambda p: (p / "environment" / "docker-compose.yaml").write_text("services: {}\n"),
            "environment/docker-compose.yaml",
            "not supported",
        ),
        (
            lambda p: (p / "task.toml").write_text("[[steps]]\nname = 'a'\n"),
            "task.toml",
            "multi-step",
        ),
        (lambda p: (p / "task.yaml").write_text("instruction: x\n"), None, "both task.toml"),
    ],
)
def test_harbor_folder_errors(harbor: Path, mutate, file: str | None, message: str) -> None:
    mutate(harbor)
    with pytest.raises(TaskError) as info:
        load_task(harbor)
    assert info.value.file == str(harbor / file if file else harbor)
    assert message in str(info.value)


def test_harbor_docker_image_without_dockerfile(harbor: Path) -> None:
    (harbor / "environment" / "Dockerfile").unlink()
    set_toml(harbor, "build_timeout_sec = 600.0", 'docker_image = "debian:bookworm-slim"')
    task = load_task(harbor)
    assert task.dockerfile is None and task.base_image == "debian:bookworm-slim"
    assert task.workdir == "/app"


def test_dockerfile_errors_surface_with_line(harbor: Path) -> None:
    dockerfile = harbor / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "ONBUILD RUN true\n")
    with pytest.raises(ImageBuildError) as info:
        load_task(harbor)
    assert info.value.file == str(dockerfile) and info.value.line == 14


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        (
            "max_agent_timeout_sec: 360.0",
            "max_agent_timeout_sec: -1",
            "max_agent_timeout_sec",
            "must be a positive number",
        ),
        (
            "max_test_timeout_sec: 60.0",
            "max_test_timeout_sec: soon",
            "max_test_timeout_sec",
            "must be a number",
        ),
        ("parser_name: pytest", "parser_name: swebench", "parser_name", "must be 'pytest'"),
        (
            "run_tests_in_same_shell: false",
            "run_tests_in_same_shell: maybe",
            "run_tests_in_same_shell",
            "must be true or false",
        ),
        ("difficulty: easy", "difficulty: easy\nenv_name: shared", "env_name", "unknown key"),
        (
            'instruction: |-\n  Create a file called /app/hello.txt. Write "Hello, world!" to it.',
            "",
            "instruction",
            "is required",
        ),
        (
            'instruction: |-\n  Create a file called /app/hello.txt. Write "Hello, world!" to it.',
            "descriptions:\n  - key: hard\n    description: x",
            "descriptions",
            "key 'base'",
        ),
    ],
)
def test_tb1_errors_name_file_and_field(
    tb1: Path, old: str, new: str, field: str, message: str
) -> None:
    path = tb1 / "task.yaml"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    with pytest.raises(TaskError) as info:
        load_task(tb1)
    assert info.value.file == str(path) and info.value.field == field
    assert message in str(info.value)


def test_tb1_folder_errors(tb1: Path) -> None:
    (tb1 / "task.yaml").write_text("instruction: [unclosed\n")
    with pytest.raises(TaskError, match="not valid YAML"):
        load_task(tb1)
    shutil.copy(FIXTURES / "tb1-hello" / "task.yaml", tb1 / "task.yaml")
    compose = tb1 / "docker-compose.yaml"
    compose.write_text("services:\n  client: {}\n  db: {}\n")
    with pytest.raises(TaskError) as info:
        load_task(tb1)
    assert info.value.file == str(compose) and info.value.field == "services"
    compose.unlink()
    (tb1 / "solution.sh").unlink()
    (tb1 / "solution.yaml").write_text("- command: ls\n  blocking: true\n")
    with pytest.raises(TaskError) as info:
        load_task(tb1)
    assert info.value.field == "0.blocking"
    (tb1 / "solution.yaml").unlink()
    assert load_task(tb1).solution is None
    (tb1 / "Dockerfile").unlink()
    with pytest.raises(TaskError, match="Dockerfile: missing"):
        load_task(tb1)


def test_not_a_task(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="neither task.toml"):
        load_task(tmp_path)
