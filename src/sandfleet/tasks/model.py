"""The one validated task model both formats load into.

A :class:`Task` says everything the image builder, the agent loop and the verifier need:
what to build (``dockerfile`` + ``context_dir``, or a bare ``docker_image``), where the agent
works (``workdir``, ``env``, ``user``), the limits, how to run the reference solution
(:class:`SolutionPlan`) and how to verify (:class:`VerifierPlan`). Paths on the host are
absolute; paths inside the sandbox are strings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TaskFormat = Literal["harbor", "terminal-bench-1", "swebench"]

DEFAULT_WORKDIR = "/app"
"""Where the agent works when the Dockerfile sets no WORKDIR (Harbor and TB1 tasks assume it)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Upload(_Frozen):
    """A host file or folder copied into the sandbox before a step runs."""

    source: Path
    """Absolute host path of a file or a folder."""
    target: str
    """Absolute sandbox path. A file lands at exactly this path; a folder's *contents* land
    under it (``tests/`` uploaded to ``/tests`` gives ``/tests/test.sh``)."""


class TerminalCommand(_Frozen):
    """One keystroke batch of a Terminal-Bench-1 ``solution.yaml`` (its ``TerminalCommand``)."""

    command: str
    """The text typed into the shell."""
    min_timeout_sec: float = 0.0
    """Seconds to wait after sending, at least."""
    max_timeout_sec: float = 180.0
    """Seconds to wait at most for a blocking command."""
    block: bool = False
    """Wait for the command to finish before the next one."""
    append_enter: bool = False
    """Press Enter after the text."""


class SolutionPlan(_Frozen):
    """How to run the reference solution (the oracle)."""

    uploads: tuple[Upload, ...] = ()
    """Copied in first (Harbor: ``solution/`` -> ``/solution``; TB1: ``solution.sh`` ->
    ``/oracle/solution.sh``)."""
    command: tuple[str, ...] | None = None
    """argv run with cwd = the task workdir, e.g. ``("bash", "/solution/solve.sh")``.
    None when ``commands`` is used instead."""
    commands: tuple[TerminalCommand, ...] = ()
    """TB1 ``solution.yaml``: keystrokes sent, in order, to one persistent shell session."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for the solution (Harbor ``[solution.env]``)."""


class PreparePlan(_Frozen):
    """The task's prepare step (sandfleet's extension: ``environment/prepare.sh``), run in a
    sandbox after it starts and before the agent; its result is the task's prepared state,
    which ``--fork`` makes once per group (docs/tasks.md)."""

    script: Path
    """Absolute host path of the script (run with bash, as root, cwd = the task workdir)."""
    timeout_s: float
    """Wall-clock limit of the script (the task's build timeout)."""


RewardSource = Literal["reward-file", "pytest-output", "swebench"]


class VerifierEnvironment(_Frozen):
    """A separate verifier's sandbox (Harbor ``environment_mode = "separate"``)."""

    dockerfile: Path | None = None
    """``tests/Dockerfile``: the verifier's own image, built with ``tests/`` as its context;
    None: a fresh sandbox of the task's own image."""
    context_dir: Path | None = None
    bundled_tests: bool = False
    """The image holds the tests already (``tests/Dockerfile``): nothing is uploaded."""
    cpus: float = 1.0
    memory_mib: int = 2048
    storage_mib: int = 10240
    build_timeout_s: float = 600.0


class VerifierPlan(_Frozen):
    """How to verify, after the agent has stopped: upload, run, read the reward."""

    uploads: tuple[Upload, ...]
    """Copied in only after the agent stops (Harbor: ``tests/`` -> ``/tests``; TB1:
    ``tests/`` and ``run-tests.sh`` -> ``/tests``)."""
    command: tuple[str, ...]
    """argv run with cwd = the task workdir: ``bash /tests/test.sh`` (Harbor) or
    ``bash /tests/run-tests.sh`` (TB1)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment (Harbor ``[verifier.env]``; TB1 ``TEST_DIR=/tests``)."""
    timeout_s: float
    """Wall-clock limit of the command."""
    user: str | None = None
    """User the format asks the verifier to run as (Harbor ``[verifier].user``; TB1 runs its
    tests as ``root``); None = the sandbox's non-root ``verifier`` user (docs/security.md)."""
    reward: RewardSource
    """``reward-file``: read ``reward_text_path`` (a float) or else ``reward_json_path`` (a
    dict of floats). ``pytest-output``: parse the command's output with ``parser_name``."""
    reward_text_path: str = "/logs/verifier/reward.txt"
    """Harbor's reward file (one number)."""
    reward_json_path: str = "/logs/verifier/reward.json"
    """Harbor's alternative reward file (a JSON object of numbers)."""
    parser_name: str | None = None
    """TB1 test-output parser; only ``pytest`` is supported."""
    grading: dict[str, Any] | None = None
    """``swebench``: what the swebench package grades the command's output with (instance_id,
    FAIL_TO_PASS, PASS_TO_PASS, log_parser, ...; :func:`sandfleet.tasks.swebench.grade_log`)."""
    mode: Literal["shared", "separate"] = "shared"
    """``shared``: the tests run in the agent's sandbox; ``separate`` (Harbor
    ``environment_mode``): in a fresh sandbox (``environment``) that receives only ``carried``."""
    environment: VerifierEnvironment | None = None
    """The separate verifier's sandbox (``mode = "separate"``)."""
    carried: tuple[str, ...] = ()
    """Sandbox paths a task-declared separate verifier receives from the agent's sandbox:
    Harbor's artifacts and ``/logs/artifacts`` (not the workdir, as in Harbor)."""
    network: bool | None = None
    """The tests' network policy: True public (they get network when the run gives the
    sandbox network), False none (cut for the tests even when the sandbox has network), None
    the sandbox's (TB1)."""
    allowed_hosts: tuple[str, ...] | None = None
    """The tests' allowlist (Harbor ``network_mode = "allowlist"``, with ``network`` True):
    host names and IPv4 CIDRs they reach when the run gives the sandbox network
    (sandbox/allowlist.py); None: no allowlist of their own."""
    same_shell: bool = False
    """TB1 ``run_tests_in_same_shell``: the tests run in the agent's shell session (its user,
    cwd and variables), not in a fresh shell as root."""
    reward_key: str | None = None
    """Which named reward of ``reward.json`` trains (``--reward-key``); None: the default
    (``reward``, else the only one, else refused; see :func:`sandfleet.tasks.reward.reward_from`)."""
    reward_weights: dict[str, float] | None = None
    """Weights of named rewards whose sum trains (``--reward-weights``); exclusive with
    ``reward_key``."""
    reward_range: tuple[float, float] = (0.0, 1.0)
    """The rewards a test script may give (sandfleet's ``[verifier] reward_range = [lo, hi]``):
    a reward outside, or not finite, scores 0 (``bad_reward_value``)."""
    load_sensitive: bool = False
    """The tests' verdict depends on the host's speed (sandfleet's ``[verifier] load_sensitive =
    true``): only such a task's failures under outside contention are masked (``host_contention``,
    docs/rollouts.md, "Contention")."""
    allow_detached: bool = False
    """The tests start processes that outlive the program that started them (a service a
    test script starts with ``service X start``, ``(cmd &)``; sandfleet's ``[verifier]
    allow_detached = true``): their reward stands, flagged in ``verifier_risks``. Otherwise a
    process that detaches from the tests' tree while they run scores 0 (``tests_detached``,
    docs/security.md, "The warden")."""


class Task(_Frozen):
    """A task folder, validated, in one shape whatever its format."""

    name: str
    """The folder name (how both formats name a task)."""
    path: Path
    """Absolute path of the task folder."""
    format: TaskFormat
    """``harbor`` (task.toml) or ``terminal-bench-1`` (task.yaml)."""
    instruction: str
    """What the agent is told."""
    agent_timeout_s: float
    """Wall-clock limit of the agent (Harbor ``agent.timeout_sec``, default 600; TB1
    ``max_agent_timeout_sec``, default 360)."""
    verifier_timeout_s: float
    """Limit of the verifier (Harbor ``verifier.timeout_sec``, default 600; TB1
    ``max_test_timeout_sec``, default 60)."""
    build_timeout_s: float = 600.0
    """Limit of the image build (Harbor ``environment.build_timeout_sec``)."""
    cpus: float = 1.0
    """CPUs (Harbor ``environment.cpus``)."""
    memory_mib: int = 2048
    """Memory limit in MiB (Harbor ``memory_mb``, or the older ``memory = "4G"``)."""
    storage_mib: int = 10240
    """Disk limit in MiB (Harbor ``storage_mb``, or the older ``storage = "10G"``)."""
    allow_internet: bool = True
    """Whether the task *asks* for network (Harbor's default is true; TB1 tasks had it).
    The sandbox policy decides what it gets."""
    allowed_hosts: tuple[str, ...] | None = None
    """The agent phase's allowlist (Harbor ``network_mode = "allowlist"``): with network, the
    sandbox reaches only these host names and IPv4 CIDRs (``Limits.allow``); None: none."""
    dockerfile: Path | None
    """The Dockerfile to build (Harbor ``environment/Dockerfile``; TB1 ``Dockerfile``)."""
    context_dir: Path | None
    """Build context of ``dockerfile`` (Harbor ``environment/``; TB1 the task folder)."""
    docker_image: str | None = None
    """A prebuilt image named by the task (Harbor ``environment.docker_image``). Used only
    when there is no Dockerfile; sandfleet can build from a few known bases only."""
    base_image: str | None = None
    """The image the build starts from: the Dockerfile's FROM (ARGs substituted), or
    ``docker_image``. Map it with :func:`sandfleet.images.dockerfile.resolve_base`."""
    workdir: str = DEFAULT_WORKDIR
    """cwd of the agent, the solution and the verifier: the Dockerfile's last WORKDIR."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of the image: the Dockerfile's ENV, then Harbor ``[environment.env]``."""
    user: str | None = None
    """The Dockerfile's last USER, if any (its user part: ``USER app:staff`` gives ``app``)."""
    agent_user: str | None = None
    """User the format asks the agent to run as (Harbor ``[agent].user``). The agent runs as
    this, else as ``user``, else as the non-root ``agent`` (:func:`declared_agent_user`)."""
    artifacts: tuple[str, ...] = ()
    """Absolute sandbox paths the task declares as the agent's output besides its workdir
    (Harbor ``artifacts``). ``--verify separate`` carries them, and the workdir, into the
    verifier's fresh sandbox."""
    tests_dir: Path
    """Host folder of the tests (uploaded by the verifier plan, never before)."""
    solution: SolutionPlan | None
    """How to run the reference solution; None when the task ships none."""
    verifier: VerifierPlan
    """How to verify and read the reward."""
    prepare: PreparePlan | None = None
    """The prepare step (``environment/prepare.sh``), if the task has one."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form metadata (Harbor ``[metadata]`` and ``[task]``; TB1 author, difficulty,
    category, tags, time estimates)."""
    seccomp_allow: tuple[str, ...] = ()
    """Rules of the default seccomp filter the task's sandboxes opt out of (Harbor
    ``[environment] seccomp_allow``, a sandfleet extension; docs/security.md)."""


DEFAULT_AGENT_USER = "agent"
"""The agent's user when the task declares none: non-root (Docker would use root)."""


def declared_agent_user(task: Task, image_user: str | None = None) -> str:
    """The user a task's agent runs as: Harbor ``[agent].user``, else the Dockerfile's
    ``USER`` (``image_user``, as recorded in the built image, else ``task.user``), else the
    non-root ``agent``."""
    for user in (task.agent_user, image_user, task.user):
        if user:
            return str(user).split(":", 1)[0]
    return DEFAULT_AGENT_USER
