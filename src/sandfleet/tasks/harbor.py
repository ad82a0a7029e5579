"""Loading a Harbor task folder (``task.toml``, ``instruction.md``, ``environment/``,
``tests/test.sh``, ``solution/solve.sh``).

``task.toml`` is read as Harbor 0.25's ``TaskConfig`` reads it (schema 1.0-1.4: ``version`` or
``schema_version``; ``[task]``, ``[metadata]``, ``[verifier]`` with ``[verifier.environment]``,
``[agent]``, ``[environment]``, ``[solution]``, ``artifacts``; the older ``memory = "4G"`` /
``storage`` / ``allow_internet`` spellings). ``[metadata]`` and ``[task]`` accept any key. Every
other field is either carried out or refused by name, never dropped: the sections sandfleet
acts on reject unknown keys, and the features it can't honour (GPUs, TPUs, MCP servers,
skills, healthchecks, allowlist networks, host-templated env values, verifier collect hooks,
artifact destinations on the host, multi-step tasks, compose environments) raise
:class:`TaskError` naming the field. docs/tasks.md lists each field and what happens to it.

Carried out: ``[agent].user`` and ``[verifier].user`` (who the agent and the tests run as);
``[verifier].environment_mode`` and ``[verifier.environment]`` (a separate verifier sandbox:
the task's image, or one built from ``tests/Dockerfile`` with the tests inside it);
``artifacts`` (carried into a separate verifier's sandbox, as Harbor does); the network
policies (``[environment]``/``[agent]``/``[verifier]`` ``network_mode``, ``allow_internet``);
``[environment].workdir``; ``[verifier].env``. The instruction loses its leading canary lines,
as Harbor's ``strip_canary`` does.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandfleet.errors import TaskError
from sandfleet.sandbox.seccomp import check_allow
from sandfleet.sandbox.spec import check_user
from sandfleet.tasks._validate import validate
from sandfleet.tasks.model import SolutionPlan, Upload, VerifierEnvironment, VerifierPlan

NetworkMode = Literal["public", "no-network", "allowlist"]
ARTIFACTS_DIR = "/logs/artifacts"
"""Harbor's convention artifacts folder: always carried into a separate verifier."""
_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?\}")
"""A value Harbor resolves from the host's environment (``resolve_env_vars``)."""
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class HarborVerifier(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    """Verifier wall-clock limit."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of test.sh (literal values only)."""
    user: str | int | None = None
    """User to run test.sh as (default: the non-root ``verifier``)."""
    environment_mode: Literal["shared", "separate"] | None = None
    """``shared``: the tests run in the agent's sandbox; ``separate``: in a fresh one. Default:
    separate when ``[verifier.environment]`` is set, else shared."""
    environment: dict[str, Any] | None = None
    """The separate verifier's environment (same keys as ``[environment]``)."""
    network_mode: NetworkMode | None = None
    """The verifier phase's network policy (default: its environment's)."""
    allowed_hosts: list[str] | None = None
    """Host names (``*.domain``) and IPv4 CIDRs of an allowlist policy."""
    collect: list[Any] = Field(default_factory=list)
    """Commands run in compose services before artifacts are collected; not supported."""
    reward_range: list[float] | None = None
    """sandfleet's extension: ``[lo, hi]``, the rewards test.sh may give (default [0, 1]); a
    reward outside, or not finite, scores 0 (``bad_reward_value``)."""
    load_sensitive: bool = False
    """sandfleet's extension: the tests' verdict depends on the host's speed (a wall-clock
    budget): a failure under outside contention is masked (``host_contention``,
    docs/rollouts.md). ``tasks validate --under-load`` finds such tasks."""
    allow_detached: bool = False
    """sandfleet's extension: the tests start processes that outlive the program that started
    them (a daemon); otherwise such a process scores 0 (``tests_detached``)."""


class HarborAgent(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    """Agent wall-clock limit."""
    setup_timeout_sec: float | None = Field(None, gt=0)
    """Agent installation limit (sandfleet's agents need no setup; kept for fidelity)."""
    user: str | int | None = None
    """User to run the agent as (default: the Dockerfile's USER, else the non-root ``agent``)."""
    network_mode: NetworkMode | None = None
    """The agent phase's network policy (default: the environment's)."""
    allowed_hosts: list[str] | None = None
    """Host names (``*.domain``) and IPv4 CIDRs of an allowlist policy."""


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
    """Acceptable GPU types; not supported."""
    tpu: dict[str, Any] | None = None
    """A TPU slice; not supported."""
    allow_internet: bool | None = None
    """Deprecated spelling of ``network_mode``: true = public, false = no-network."""
    network_mode: NetworkMode | None = None
    """The environment's network policy (default: public)."""
    allowed_hosts: list[str] | None = None
    """Host names (``*.domain``) and IPv4 CIDRs of an allowlist policy."""
    mcp_servers: list[Any] = Field(default_factory=list)
    """MCP servers; sandfleet supports none."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of the sandbox (literal values only)."""
    skills_dir: str | None = None
    """Agent skills folder; not supported."""
    healthcheck: dict[str, Any] | None = None
    """A readiness command run after start; not supported."""
    workdir: str | None = None
    """The working directory of commands, overriding the Dockerfile's WORKDIR."""
    seccomp_allow: list[str] = Field(default_factory=list)
    """A sandfleet extension: rules of the default seccomp filter this task's sandboxes opt
    out of (docs/security.md, "Syscall filter"), or ``["unconfined"]``."""


class HarborSolution(_Section):
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of solve.sh (literal values only)."""


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
    multi_step_reward_strategy: str | None = None
    multi_step_reward_mode: str | None = None


class HarborArtifact(_Section):
    source: str
    """Absolute path in the agent's sandbox."""
    destination: str | None = None
    """Where Harbor copies it on the host; not supported (sandfleet collects nothing there)."""
    exclude: list[str] = Field(default_factory=list)
    """Patterns left out of a directory artifact; not supported."""
    service: str | None = None
    """Compose service to collect it from: only the main one."""


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
            artifact = validate(HarborArtifact, entry, file=file, prefix=f"{field}.")
            if artifact.destination:
                raise TaskError("collecting artifacts to a host folder is not supported (sandfleet carries "
                                "artifacts into a separate verifier's sandbox only)", file=file,
                                field=f"{field}.destination")
            if artifact.exclude:
                raise TaskError("exclude patterns are not supported", file=file, field=f"{field}.exclude")
            if artifact.service not in (None, "main"):
                raise TaskError("artifacts of other compose services are not supported", file=file,
                                field=f"{field}.service")
            entry = artifact.source
        if not isinstance(entry, str):
            raise TaskError("must be a path or a table with source", file=file, field=field)
        parts = entry.split("/")
        if not entry.startswith("/") or ".." in parts or "\x00" in entry or entry.rstrip("/") == "":
            raise TaskError(f"must be an absolute path below / without '..', got {entry!r}",
                            file=file, field=field)
        paths.append("/" + "/".join(p for p in parts if p not in ("", ".")))
    return tuple(paths)


def _literal_env(values: dict[str, str], *, file: str, field: str) -> None:
    for key, value in values.items():
        if _TEMPLATE.fullmatch(value):
            raise TaskError("values taken from the host environment (${VAR}) are not supported",
                            file=file, field=f"{field}.{key}")


def _environment(raw: dict[str, Any], *, file: str, prefix: str) -> tuple[HarborEnvironment, int, int]:
    """An ``[environment]`` (or ``[verifier.environment]``) table, its features checked;
    returns it with its memory and storage in MiB."""
    if isinstance(raw.get("os"), str):
        raw = {**raw, "os": raw["os"].lower()}  # Harbor accepts any case
    env = validate(HarborEnvironment, raw, file=file, prefix=prefix)
    refusals = [
        (env.gpus > 0, "gpus", "GPUs are not supported"),
        (bool(env.gpu_types), "gpu_types", "GPU types are not supported"),
        (env.tpu is not None, "tpu", "TPUs are not supported"),
        (bool(env.mcp_servers), "mcp_servers", "MCP servers are not supported"),
        (bool(env.skills_dir), "skills_dir", "skills are not supported"),
        (env.healthcheck is not None, "healthcheck", "healthchecks are not supported"),
        (env.network_mode is not None and env.allow_internet is not None, "allow_internet",
         "set either allow_internet (deprecated) or network_mode, not both"),
    ]
    for refused, field, message in refusals:
        if refused:
            raise TaskError(message, file=file, field=prefix + field)
    if env.seccomp_allow and prefix != "environment.":
        raise TaskError("set seccomp_allow in [environment]: the verifier's sandbox takes the task's",
                        file=file, field=prefix + "seccomp_allow")
    try:
        check_allow(env.seccomp_allow)
    except ValueError as e:
        raise TaskError(str(e), file=file, field=prefix + "seccomp_allow") from None
    _literal_env(env.env, file=file, field=prefix + "env")
    if env.workdir is not None and (not env.workdir.startswith("/") or ".." in env.workdir.split("/")):
        raise TaskError(f"must be an absolute path without '..', got {env.workdir!r}", file=file,
                        field=prefix + "workdir")
    memory = env.memory_mb
    if env.memory is not None:
        memory = _size_mib(env.memory, file=file, field=prefix + "memory")
    storage = env.storage_mb
    if env.storage is not None:
        storage = _size_mib(env.storage, file=file, field=prefix + "storage")
    return env, memory, storage


Policy = bool | tuple[str, ...]
"""A phase's network policy: True public, False no-network, a tuple an allowlist."""


def _baseline(env: HarborEnvironment, *, file: str = "", prefix: str = "environment.") -> Policy:
    """An environment's network policy: public (Harbor's default), no-network or an allowlist."""
    phase = _phase(env.network_mode, env.allowed_hosts, file=file, prefix=prefix)
    if phase is not None:
        return phase
    return env.allow_internet if env.allow_internet is not None else True


def _phase(mode: NetworkMode | None, hosts: list[str] | None, *, file: str, prefix: str) -> Policy | None:
    """A phase's explicit network policy; None when not set."""
    from sandfleet.sandbox.allowlist import parse_allow

    if hosts is not None and mode != "allowlist":
        raise TaskError('allowed_hosts needs network_mode = "allowlist"', file=file, field=prefix + "allowed_hosts")
    if mode == "allowlist":
        if hosts is None:
            raise TaskError('network_mode = "allowlist" needs allowed_hosts (host names, *.domains, IPv4 CIDRs)',
                            file=file, field=prefix + "allowed_hosts")
        try:
            parse_allow(hosts)
        except ValueError as e:
            raise TaskError(str(e), file=file, field=prefix + "allowed_hosts") from None
        return tuple(hosts)
    return None if mode is None else mode == "public"


def _allowlists(agent: Policy, verifier: Policy) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """The allowlists of the agent's and the verifier's phases: where one phase is
    allowlisted, the other keeps the same machinery (public: everything; no-network: nothing)
    so the sandbox can switch between them."""
    from sandfleet.sandbox.allowlist import EVERYWHERE

    if not isinstance(agent, tuple) and not isinstance(verifier, tuple):
        return None, None

    def as_list(p: Policy) -> tuple[str, ...]:
        return p if isinstance(p, tuple) else EVERYWHERE if p else ()
    return as_list(agent), as_list(verifier)


def strip_canary(text: str) -> str:
    """``text`` without its leading canary comment lines and the blank lines after them
    (Harbor's ``strip_canary``)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY.match(lines[i].strip()):
        i += 1
    while i < len(lines) and lines[i].strip() == "":
        i += 1
    return "\n".join(lines[i:])


def _reward_range(value: list[float] | None, *, file: str) -> tuple[float, float]:
    """``[verifier] reward_range``: two finite numbers, low <= high; default (0, 1)."""
    if value is None:
        return (0.0, 1.0)
    if len(value) != 2 or not all(math.isfinite(v) for v in value) or value[0] > value[1]:
        raise TaskError(f"must be [low, high], two finite numbers with low <= high; got {value!r}",
                        file=file, field="verifier.reward_range")
    return (float(value[0]), float(value[1]))


def _verifier_environment(folder: Path, verifier: HarborVerifier, env: HarborEnvironment, memory: int,
                          storage: int, *, file: str) -> tuple[VerifierEnvironment, Policy]:
    """The separate verifier's environment, as Harbor resolves it: the image of
    ``[verifier.environment]``/``tests/Dockerfile`` (tests inside it), else a fresh copy of the
    task's own environment (tests uploaded); and its network baseline."""
    tests = folder / "tests"
    own = env, memory, storage
    if verifier.environment is not None:
        own = _environment(verifier.environment, file=file, prefix="verifier.environment.")
        if own[0].docker_image:
            raise TaskError("a prebuilt verifier image can't be pulled; build it from tests/Dockerfile",
                            file=file, field="verifier.environment.docker_image")
        if own[0].env:
            raise TaskError("environment variables of a separate verifier's environment are not supported; "
                            "use [verifier.env]", file=file, field="verifier.environment.env")
        if own[0].workdir is not None:
            raise TaskError("a separate verifier's workdir is the task's; not supported",
                            file=file, field="verifier.environment.workdir")
    venv, vmemory, vstorage = own
    if (tests / "docker-compose.yaml").exists() or (tests / "docker-compose.yml").exists():
        raise TaskError("multi-container (docker compose) verifier environments are not supported",
                        file=str(tests / "docker-compose.yaml"))
    bundled = (tests / "Dockerfile").is_file()
    plan = VerifierEnvironment(
        dockerfile=tests / "Dockerfile" if bundled else None,
        context_dir=tests if bundled else None,
        bundled_tests=bundled,
        cpus=venv.cpus,
        memory_mib=vmemory,
        storage_mib=vstorage,
        build_timeout_s=venv.build_timeout_sec,
    )
    return plan, _baseline(venv, file=file, prefix="verifier.environment." if verifier.environment else "environment.")


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
    for field in ("multi_step_reward_strategy", "multi_step_reward_mode"):
        if getattr(config, field) is not None:
            raise TaskError("multi-step tasks are not supported", file=file, field=field)
    artifacts = _artifacts(config.artifacts, file=file)
    verifier = validate(HarborVerifier, config.verifier, file=file, prefix="verifier.")
    agent = validate(HarborAgent, config.agent, file=file, prefix="agent.")
    env, memory, storage = _environment(config.environment, file=file, prefix="environment.")
    solution_cfg = validate(HarborSolution, config.solution, file=file, prefix="solution.")
    _literal_env(verifier.env, file=file, field="verifier.env")
    _literal_env(solution_cfg.env, file=file, field="solution.env")
    if verifier.collect:
        raise TaskError("collect hooks are not supported", file=file, field="verifier.collect")
    reward_range = _reward_range(verifier.reward_range, file=file)
    if verifier.environment_mode == "shared" and verifier.environment is not None:
        raise TaskError("environment_mode = 'shared' conflicts with [verifier.environment] (as in Harbor)",
                        file=file, field="verifier.environment_mode")
    mode = verifier.environment_mode or ("separate" if verifier.environment is not None else "shared")

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
        instruction = strip_canary(instruction_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"can't read: {e}", file=str(instruction_file)) from None
    if not instruction.strip():
        raise TaskError("is empty", file=str(instruction_file))
    tests = folder / "tests"
    environment = None
    baseline: Policy = _baseline(env, file=file)
    if mode == "separate":
        environment, baseline = _verifier_environment(folder, verifier, env, memory, storage, file=file)
    if not (tests / "test.sh").is_file() and not (environment and environment.bundled_tests):
        raise TaskError("missing (the verifier's entry point)", file=str(tests / "test.sh"))
    agent_phase = _phase(agent.network_mode, agent.allowed_hosts, file=file, prefix="agent.")
    verifier_phase = _phase(verifier.network_mode, verifier.allowed_hosts, file=file, prefix="verifier.")
    agent_network = agent_phase if agent_phase is not None else _baseline(env, file=file)
    verifier_network = verifier_phase if verifier_phase is not None else baseline
    agent_hosts, verifier_hosts = _allowlists(agent_network, verifier_network)

    solve = folder / "solution" / "solve.sh"
    solution = None
    if solve.is_file():
        solution = SolutionPlan(
            uploads=(Upload(source=solve.parent, target="/solution"),),
            command=("bash", "/solution/solve.sh"),
            env=solution_cfg.env,
        )
    plan = VerifierPlan(
        uploads=() if environment and environment.bundled_tests else (Upload(source=tests, target="/tests"),),
        command=("bash", "/tests/test.sh"),
        env=verifier.env,
        timeout_s=verifier.timeout_sec,
        user=_user(verifier.user, file=file, field="verifier.user"),
        reward="reward-file",
        mode=mode,
        environment=environment,
        network=verifier_network is not False,
        allowed_hosts=verifier_hosts,
        carried=(*artifacts, ARTIFACTS_DIR) if mode == "separate" else (),
        reward_range=reward_range,
        load_sensitive=verifier.load_sensitive,
        allow_detached=verifier.allow_detached,
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
        "allow_internet": agent_network is not False,
        "allowed_hosts": agent_hosts,
        "dockerfile": dockerfile if dockerfile.is_file() else None,
        "context_dir": env_dir if dockerfile.is_file() else None,
        "docker_image": env.docker_image,
        "extra_env": env.env,
        "agent_user": _user(agent.user, file=file, field="agent.user"),
        "artifacts": artifacts,
        "tests_dir": tests,
        "metadata": metadata,
        "seccomp_allow": check_allow(env.seccomp_allow),
    }
    if env.workdir is not None:
        fields["workdir_override"] = env.workdir
    return fields, solution, plan
