"""Loading a Terminal-Bench-1 task folder (``task.yaml``, ``Dockerfile``,
``docker-compose.yaml``, ``solution.sh`` or ``solution.yaml``, ``run-tests.sh``, ``tests/``).

As TB1's harness does: the instruction is ``instruction`` (or, in early tasks, the
``descriptions`` entry with key ``base``); after the agent stops, ``run-tests.sh`` and the
contents of ``tests/`` are copied to ``/tests`` and ``bash /tests/run-tests.sh`` runs from the
workdir with ``TEST_DIR=/tests``, as root in a fresh shell -- or, with
``run_tests_in_same_shell: true``, in the agent's own shell session (its user, cwd and
variables), as TB1 does; its output is parsed with ``parser_name`` (pytest).
The oracle copies ``solution.sh`` to ``/oracle/solution.sh`` and runs it with bash, or replays
``solution.yaml``'s keystrokes. A task without ``run-tests.sh`` gets sandfleet's offline
default (``python3 -m pytest $TEST_DIR/test_outputs.py -rA``). ``docker-compose.yaml`` may
hold one service, and only what TB1's own template puts there (the build of ``Dockerfile``,
``TEST_DIR``, the log volumes, ``sleep infinity``); anything else in it is refused by name.
``test_scripts`` (early TB1's shared scripts) must be in ``tests/``, which is uploaded.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from sandfleet.errors import TaskError
from sandfleet.tasks._validate import validate
from sandfleet.tasks.model import SolutionPlan, TerminalCommand, Upload, VerifierPlan


class TB1Description(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    key: str = "base"
    """Variant name; sandfleet uses ``base``."""
    description: str
    """The instruction text of this variant."""


class TB1Config(BaseModel):
    """``task.yaml`` as TB1's ``Task`` model defines it (metadata keys are kept as metadata)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    instruction: str | None = None
    """What the agent is told."""
    descriptions: list[TB1Description] | None = None
    """Early TB1 form of the instruction."""
    author_name: str | None = None
    author_email: str | None = None
    difficulty: str | None = None
    category: str | None = None
    tags: list[str] = Field(default_factory=list)
    parser_name: Literal["pytest"] = "pytest"
    """Test-output parser; sandfleet supports TB1's pytest parser."""
    max_agent_timeout_sec: float = Field(360.0, gt=0)
    """Agent wall-clock limit."""
    max_test_timeout_sec: float = Field(60.0, gt=0)
    """Test wall-clock limit."""
    run_tests_in_same_shell: bool = False
    """Run the tests in the agent's shell session (its user, cwd and variables)."""
    disable_asciinema: bool = False
    estimated_duration_sec: float | None = None
    expert_time_estimate_min: float | None = None
    junior_time_estimate_min: float | None = None
    test_scripts: list[str] | None = None
    """Early TB1 shared test scripts: each must be in ``tests/`` (uploaded to /tests)."""


_METADATA_KEYS = (
    "author_name",
    "author_email",
    "difficulty",
    "category",
    "tags",
    "estimated_duration_sec",
    "expert_time_estimate_min",
    "junior_time_estimate_min",
    "disable_asciinema",
)


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"can't read: {e}", file=str(path)) from None
    except yaml.YAMLError as e:
        raise TaskError(f"not valid YAML: {e}", file=str(path)) from None


_COMPOSE_TOP = {"services", "version", "name"}
_COMPOSE_SERVICE = {"build", "image", "container_name", "command", "environment", "volumes", "init", "tty",
                    "stdin_open"}
"""What TB1's template compose service holds; the harness itself sets the rest."""


def _check_compose(path: Path) -> None:
    """One service, and nothing in it but what TB1's template puts there (refused by name)."""
    if not path.exists():
        return
    data = _read_yaml(path)
    services = data.get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict) or not services:
        raise TaskError("must define services", file=str(path), field="services")
    if len(services) > 1:
        raise TaskError(
            f"multi-container tasks are not supported ({', '.join(services)})",
            file=str(path),
            field="services",
        )
    assert isinstance(data, dict)
    for key in data:
        if key not in _COMPOSE_TOP:
            raise TaskError("not supported (one service is)", file=str(path), field=str(key))
    name, service = next(iter(services.items()))
    prefix = f"services.{name}"
    if not isinstance(service, dict):
        raise TaskError("must be a mapping", file=str(path), field=prefix)
    for key, value in service.items():
        field = f"{prefix}.{key}"
        if key not in _COMPOSE_SERVICE:
            raise TaskError("not supported", file=str(path), field=field)
        if key == "build":
            build = {"context": value} if isinstance(value, str) else value
            if not isinstance(build, dict) or set(build) - {"context", "dockerfile"} or \
                    str(build.get("context", ".")).rstrip("/") not in (".", "") or \
                    build.get("dockerfile", "Dockerfile") != "Dockerfile":
                raise TaskError("only the task folder's Dockerfile is built (context '.', dockerfile "
                                "'Dockerfile')", file=str(path), field=field)
        if key == "environment":
            items = value if isinstance(value, list) else [f"{k}={v}" for k, v in (value or {}).items()]
            for item in items:
                if str(item).split("=", 1)[0] != "TEST_DIR":
                    raise TaskError(f"only TEST_DIR is supported (set to /tests), not {item!r}; put the "
                                    "variable in the Dockerfile's ENV", file=str(path), field=field)
        if key == "volumes":
            for item in value or []:
                if "T_BENCH_" not in str(item):
                    raise TaskError(f"volumes other than TB1's log folders are not supported: {item!r}",
                                    file=str(path), field=field)


def _solution(folder: Path) -> SolutionPlan | None:
    script, keystrokes = folder / "solution.sh", folder / "solution.yaml"
    if script.is_file():
        return SolutionPlan(
            uploads=(Upload(source=script, target="/oracle/solution.sh"),),
            command=("bash", "/oracle/solution.sh"),
        )
    if not keystrokes.is_file():
        return None
    data = _read_yaml(keystrokes)
    if not isinstance(data, list):
        raise TaskError("must be a list of commands", file=str(keystrokes))
    commands = tuple(
        validate(TerminalCommand, item, file=str(keystrokes), prefix=f"{i}.")
        for i, item in enumerate(data)
    )
    return SolutionPlan(commands=commands)


def load_tb1(folder: Path) -> tuple[dict[str, Any], SolutionPlan | None, VerifierPlan]:
    """Read ``folder/task.yaml``; returns Task fields, the solution plan and verifier plan."""
    file = str(folder / "task.yaml")
    data = _read_yaml(folder / "task.yaml")
    if not isinstance(data, dict):
        raise TaskError("must be a mapping of keys to values", file=file)
    config = validate(TB1Config, data, file=file)
    for i, script in enumerate(config.test_scripts or []):
        if not (folder / "tests" / script).is_file():
            raise TaskError(f"{script} is not in tests/ (TB1's shared test scripts are not bundled with "
                            "sandfleet; put it there)", file=file, field=f"test_scripts.{i}")
    instruction = config.instruction
    if instruction is None and config.descriptions:
        by_key = {d.key: d.description for d in config.descriptions}
        if "base" not in by_key:
            raise TaskError("needs an entry with key 'base'", file=file, field="descriptions")
        instruction = by_key["base"]
    if not instruction or not instruction.strip():
        raise TaskError(
            "is required (or descriptions with key 'base')", file=file, field="instruction"
        )
    dockerfile = folder / "Dockerfile"
    if not dockerfile.is_file():
        raise TaskError("missing", file=str(dockerfile))
    _check_compose(folder / "docker-compose.yaml")
    tests = folder / "tests"
    run_tests = folder / "run-tests.sh"
    if not run_tests.is_file():
        run_tests = Path(str(files("sandfleet.tasks") / "data" / "run-tests.sh"))
    uploads = [Upload(source=run_tests, target="/tests/run-tests.sh")]
    if tests.is_dir():
        uploads.append(Upload(source=tests, target="/tests"))
    plan = VerifierPlan(
        uploads=tuple(uploads),
        command=("bash", "/tests/run-tests.sh"),
        env={"TEST_DIR": "/tests"},
        timeout_s=config.max_test_timeout_sec,
        user=None if config.run_tests_in_same_shell else "root",
        reward="pytest-output",
        parser_name=config.parser_name,
        same_shell=config.run_tests_in_same_shell,
    )
    metadata = {k: getattr(config, k) for k in _METADATA_KEYS if getattr(config, k) is not None}
    fields = {
        "instruction": instruction,
        "agent_timeout_s": config.max_agent_timeout_sec,
        "verifier_timeout_s": config.max_test_timeout_sec,
        "allow_internet": True,
        "dockerfile": dockerfile,
        "context_dir": folder,
        "extra_env": {},
        "tests_dir": tests,
        "metadata": metadata,
    }
    return fields, _solution(folder), plan
