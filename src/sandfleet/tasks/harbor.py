"""Loading a Harbor task folder (``task.toml``, ``instruction.md``, ``environment/``,
``tests/test.sh``, ``solution/solve.sh``).

``task.toml`` is read as Harbor's ``TaskConfig`` reads it (schema 1.0-1.1: ``version`` or
``schema_version``; ``[task]``, ``[metadata]``, ``[verifier]``, ``[agent]``, ``[environment]``,
``[solution]``; the older ``memory = "4G"`` / ``storage`` spellings). ``[metadata]`` and
``[task]`` accept any key. The sections sandfleet acts on reject unknown keys, and features it
can't honour (GPUs, MCP servers, separate verifier environments, multi-step tasks, compose
environments) are refused by name rather than silently dropped. ``[agent].user`` and
``[verifier].user`` say who the agent and the tests run as; ``artifacts`` name the agent's
outputs outside its workdir, which ``--verify separate`` carries into the verifier's sandbox.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandfleet.errors import TaskError
from sandfleet.sandbox.spec import check_user
from sandfleet.tasks._validate import validate
from sandfleet.tasks.model import SolutionPlan, Upload, VerifierPlan


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class HarborVerifier(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    """Verifier wall-clock limit."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of test.sh."""
    user: str | int | None = None
    """User to run test.sh as (default: the non-root ``verifier``)."""
    environment_mode: Literal["shared"] = "shared"
    """Only ``shared`` (the verifier runs in the agent's sandbox) is supported."""


class HarborAgent(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    """Agent wall-clock limit."""
    setup_timeout_sec: float | None = Field(None, gt=0)
    """Agent installation limit (sandfleet's agents need no setup; kept for fidelity)."""
    user: str | int | None = None
    """User to run the agent as (default: the Dockerfile's USER, else the non-root ``agent``)."""


class HarborEnvironment(_Section):
    build_timeout_sec: float = Field(600.0, gt=0)
    """Image build limit."""
    docker_image: str | None = None
    """Prebuilt image, used when there is no Dockerfile."""
    os: Literal["linux"] = "linux"
    """Only Linux tasks are supported."""
    cpus: float = Field(1, gt=0)
    """CPUs."""
    memory_mb: int = Field(2048, gt=0)
    """Memory in MiB."""
    storage_mb: int = Field(10240, gt=0)
    """Disk in MiB."""
    memory: str | None = None
    """Deprecated spelling of memory_mb: ``"4G"``, ``"512M"``."""
    storage: str | None = None
    """Deprecated spelling of storage_mb."""
    gpus: int = Field(0, ge=0)
    """GPUs; sandfleet supports none."""
    gpu_types: list[str] | None = None
    """Acceptable GPU types (meaningless without GPUs)."""
    allow_internet: bool = True
    """Whether the task asks for network."""
    mcp_servers: list[Any] = Field(default_factory=list)
    """MCP servers; sandfleet supports none."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of the sandbox (literal values only)."""
    skills_dir: str | None = None
    """Agent skills folder; not supported."""


class HarborSolution(_Section):
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of solve.sh."""


class HarborConfig(_Section):
    schema_version: str = "1.0"
    version: str | None = None
    task: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: dict[str, Any] = Field(default_factory=dict)
    agent: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] = Field(default_factory=dict)
    solution: dict[str, Any] = Field(default_factory=dict)
    source: str | None = None
    artifacts: list[Any] = Field(default_factory=list)
    multi_step_reward_mode: str | None = None


def _size_mib(text: str, *, file: str, field: str) -> int:
    value = text.strip().upper().removesuffix("B")
    scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}.get(value[-1:] if value else "")
    try:
        if scale is None:
            raise ValueError
        mib = int(float(value[:-1]) * scale)
    except ValueError:
        raise TaskError(
            f"must be a size like '4G' or '512M', got {text!r}", file=file, field=field
        ) from None
    if mib <= 0:
        raise TaskError("must be a positive size", file=file, field=field)
    return mib


class HarborArtifact(_Section):
    source: str
    """Absolute path in the agent's sandbox."""
    destination: str | None = None
    """Where Harbor copies it on the host (sandfleet keeps it in the sandbox)."""


def _user(value: str | int | None, *, file: str, field: str) -> str | None:
    if value is None:
        return None
    try:
        return check_user(value)
    except ValueError as e:
        raise TaskError(str(e), file=file, field=field) from None


def _artifacts(entries: list[Any], *, file: str) -> tuple[str, ...]:
    paths = []
    for i, entry in enumerate(entries):
        field = f"artifacts.{i}"
        if isinstance(entry, dict):
            entry = validate(HarborArtifact, entry, file=file, prefix=f"{field}.").source
        if not isinstance(entry, str):
            raise TaskError("must be a path or a table with source", file=file, field=field)
        parts = entry.split("/")
        if not entry.startswith("/") or ".." in parts or "\x00" in entry or entry.rstrip("/") == "":
            raise TaskError(f"must be an absolute path below / without '..', got {entry!r}",
                            file=file, field=field)
        paths.append("/" + "/".join(p for p in parts if p not in ("", ".")))
    return tuple(paths)


def load_harbor(folder: Path) -> tuple[dict[str, Any], SolutionPlan | None, VerifierPlan]:
    """Read ``folder/task.toml``; returns Task fields, the solution plan and verifier plan."""
    file = str(folder / "task.toml")
    try:
        raw = tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"can't read: {e}", file=file) from None
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"not valid TOML: {e}", file=file) from None
    if "steps" in raw:
        raise TaskError("multi-step tasks are not supported", file=file, field="steps")
    config = validate(HarborConfig, raw, file=file)
    artifacts = _artifacts(config.artifacts, file=file)
    verifier = validate(HarborVerifier, config.verifier, file=file, prefix="verifier.")
    agent = validate(HarborAgent, config.agent, file=file, prefix="agent.")
    env = validate(HarborEnvironment, config.environment, file=file, prefix="environment.")
    solution_cfg = validate(HarborSolution, config.solution, file=file, prefix="solution.")
    if env.gpus:
        raise TaskError("GPUs are not supported", file=file, field="environment.gpus")
    if env.mcp_servers:
        raise TaskError("MCP servers are not supported", file=file, field="environment.mcp_servers")
    if env.skills_dir:
        raise TaskError("skills are not supported", file=file, field="environment.skills_dir")
    for key, value in env.env.items():
        if "$" in value:
            raise TaskError(
                "values taken from the host environment are not supported",
                file=file,
                field=f"environment.env.{key}",
            )
    memory = env.memory_mb
    if env.memory is not None:
        memory = _size_mib(env.memory, file=file, field="environment.memory")
    storage = env.storage_mb
    if env.storage is not None:
        storage = _size_mib(env.storage, file=file, field="environment.storage")

    env_dir = folder / "environment"
    if (env_dir / "docker-compose.yaml").exists() or (env_dir / "docker-compose.yml").exists():
        raise TaskError(
            "multi-container (docker compose) environments are not supported",
            file=str(env_dir / "docker-compose.yaml"),
        )
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file() and not env.docker_image:
        raise TaskError(
            "missing, and task.toml sets no environment.docker_image", file=str(dockerfile)
        )
    instruction_file = folder / "instruction.md"
    try:
        instruction = instruction_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"can't read: {e}", file=str(instruction_file)) from None
    if not instruction.strip():
        raise TaskError("is empty", file=str(instruction_file))
    tests = folder / "tests"
    if not (tests / "test.sh").is_file():
        raise TaskError("missing (the verifier's entry point)", file=str(tests / "test.sh"))

    solve = folder / "solution" / "solve.sh"
    solution = None
    if solve.is_file():
        solution = SolutionPlan(
            uploads=(Upload(source=solve.parent, target="/solution"),),
            command=("bash", "/solution/solve.sh"),
            env=solution_cfg.env,
        )
    plan = VerifierPlan(
        uploads=(Upload(source=tests, target="/tests"),),
        command=("bash", "/tests/test.sh"),
        env=verifier.env,
        timeout_s=verifier.timeout_sec,
        user=_user(verifier.user, file=file, field="verifier.user"),
        reward="reward-file",
    )
    metadata = dict(config.metadata)
    if config.task:
        metadata["task"] = config.task
    fields = {
        "instruction": instruction,
        "agent_timeout_s": agent.timeout_sec,
        "verifier_timeout_s": verifier.timeout_sec,
        "build_timeout_s": env.build_timeout_sec,
        "cpus": env.cpus,
        "memory_mib": memory,
        "storage_mib": storage,
        "allow_internet": env.allow_internet,
        "dockerfile": dockerfile if dockerfile.is_file() else None,
        "context_dir": env_dir if dockerfile.is_file() else None,
        "docker_image": env.docker_image,
        "extra_env": env.env,
        "agent_user": _user(agent.user, file=file, field="agent.user"),
        "artifacts": artifacts,
        "tests_dir": tests,
        "metadata": metadata,
    }
    return fields, solution, plan
