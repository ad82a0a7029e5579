"""Harbor: sandfleet sandboxes as a Harbor environment (``harbor>=0.25,<0.26``, Python 3.12+).

    harbor run -p examples/tasks -a oracle -e sandfleet.integrations.harbor:SandfleetEnvironment \\
        --ek backend=bwrap --ek memory_mib=2048 -y

No Docker is needed: each trial's sandbox is built from the task's ``environment/Dockerfile``
(sandfleet's Dockerfile subset, cached by content), and in Harbor's separate-verifier mode the
verifier's environment is built the same way from its own folder (``tests/Dockerfile``).

What Harbor asks of an environment, and what this one does:

- ``exec`` runs ``bash -c command`` as ``user`` (Harbor's root housekeeping really runs as
  the sandbox's root; ``None`` is the task's agent user: ``[agent].user``, the Dockerfile's
  ``USER``, else sandfleet's non-root ``agent``), in ``cwd`` (default: the task's workdir),
  with Harbor's merged env; at ``timeout_sec`` the whole process tree is killed and
  ``RuntimeError("Command timed out after N seconds")`` raised, as Harbor's Docker backend
  does; when Harbor cancels it (a phase timeout), the process tree is killed too.
- ``download_dir`` copies the folder's contents into the target (not the folder itself).
- When the tests upload to ``/tests`` starts, every process of the users the agent ran as is
  killed first (all processes, if the agent ran as root), and ``/tests`` is emptied and given
  to root: nothing the agent left running sees or changes the tests.
- Network policy ``public`` gives the sandbox sandfleet's user-mode networking,
  ``no-network`` none; allowlists are refused (Harbor checks the capability before start).
- Compose tasks and tasks that only name a registry image are refused with the reason.
- ``--ek`` options: ``backend`` (auto, bwrap, process, microvm), ``cpus``, ``memory_mib``,
  ``disk_mib``, ``pids``, ``ttl_s``, ``network`` (true/false, over the policy),
  ``agent_user``. Unset limits come from the task (Harbor's ``--override-*`` included).

**The mask.** A call that fails for a reason the agent can't cause (an ``infra_fault`` by
sandfleet's verdict rule, docs/rollouts.md: the sandbox killed from outside, the sandbox
service unreachable, a sandbox that could not be made) raises :class:`SandfleetInfraError`,
which Harbor records as the trial's exception info (``exception_info.exception_type ==
"SandfleetInfraError"``; its message starts ``infra_fault (<cause>)``), the trial gets no
reward, and a Harbor job retries it where its config says so (``retry.include_exceptions:
[SandfleetInfraError]``). A failed image build stays Harbor's own ``SandboxBuildFailedError``.
Everything else (a command that fails, a sandbox OOM-killed by the agent's memory) is as
before: the agent's.

:class:`HarborSandbox` is all of that without Harbor (tested on its own);
``SandfleetEnvironment``, the ``BaseEnvironment`` subclass, is made on first access, so this
module imports without Harbor installed.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import posixpath
import shlex
import shutil
import stat
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from sandfleet.errors import ConfigError, GuestFileNotFoundError, ImageError
from sandfleet.integrations._common import infra_fault_of
from sandfleet.rollout.verifier import stop_everything_of
from sandfleet.sandbox import create_sandbox, make_spec
from sandfleet.sandbox.base import Sandbox
from sandfleet.tasks.model import DEFAULT_WORKDIR, Task, VerifierPlan

TESTS_DIR = "/tests"
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


@dataclass
class Options:
    """The ``--ek`` keys this environment takes (Harbor parses their values as JSON)."""

    backend: str = "auto"
    cpus: float | None = None
    memory_mib: int | None = None
    disk_mib: int | None = None
    pids: int | None = None
    ttl_s: float = 6 * 3600.0
    """The sandbox's lifetime: it is reaped after it even if Harbor is killed."""
    network: bool | None = None
    """Overrides the network policy when set (``false`` keeps a ``public`` task offline)."""
    agent_user: str | None = None
    """Who ``exec(user=None)`` runs as, over the task's declared user (``root`` for Docker's)."""

    def __post_init__(self) -> None:
        """A misspelt backend or a badly typed value (``memory_mib: "lots"``) is a ConfigError
        when Harbor makes the environment, before any image or sandbox."""
        limits = {k: getattr(self, k) for k in ("cpus", "memory_mib", "disk_mib", "pids", "ttl_s", "network")
                  if getattr(self, k) is not None}
        try:
            make_spec(backend=self.backend, **limits)
        except ConfigError as e:
            raise ConfigError(f"sandfleet's Harbor environment (--ek / environment.kwargs): {e}") from None
        if self.agent_user is not None and not isinstance(self.agent_user, str):
            raise ConfigError(f"sandfleet's Harbor environment: agent_user is a user name, not {self.agent_user!r}")

    @classmethod
    def pop_from(cls, kwargs: dict[str, Any]) -> Options:
        """Take this environment's options out of Harbor's constructor kwargs."""
        return cls(**{f.name: kwargs.pop(f.name) for f in fields(cls) if f.name in kwargs})

    @classmethod
    def refuse_unknown(cls, kwargs: dict[str, Any], harbors: set[str]) -> None:
        """After :meth:`pop_from`: a key that is neither Harbor's own (``harbors``, the
        parameters of its BaseEnvironment) nor sandfleet's is a misspelt option: refused,
        where Harbor would take it silently."""
        unknown = sorted(set(kwargs) - harbors)
        if unknown:
            raise ConfigError(f"sandfleet's Harbor environment has no option {', '.join(map(repr, unknown))} "
                              f"(--ek / environment.kwargs); its options: {', '.join(f.name for f in fields(cls))}")


def check_definition(environment_dir: Path, docker_image: str | None) -> None:
    """Refuse what sandfleet can't build: compose environments, and a registry image with no
    Dockerfile (sandfleet pulls from no registry)."""
    for name in COMPOSE_FILES:
        if (environment_dir / name).exists():
            raise ValueError(f"{environment_dir / name}: multi-container (docker compose) environments are not "
                             "supported by sandfleet; use a single environment/Dockerfile")
    if not (environment_dir / "Dockerfile").is_file():
        if docker_image:
            raise ValueError(f"the task names only a registry image ({docker_image}) and has no "
                             f"{environment_dir.name}/Dockerfile; sandfleet can't pull images: add the "
                             "Dockerfile that builds it")
        raise FileNotFoundError(f"{environment_dir} has no Dockerfile")


def image_task(environment_dir: Path, name: str, build_timeout_s: float) -> Task:
    """A task that is only an image definition (what sandfleet's builder reads)."""
    return Task(name=name, path=environment_dir, format="harbor", instruction="", agent_timeout_s=1,
                verifier_timeout_s=1, build_timeout_s=build_timeout_s, dockerfile=environment_dir / "Dockerfile",
                context_dir=environment_dir, tests_dir=environment_dir, solution=None,
                verifier=VerifierPlan(uploads=(), command=("true",), timeout_s=1, reward="reward-file"))


class SandfleetInfraError(RuntimeError):
    """The sandbox failed for a reason the agent can't cause (an infra fault); ``fault`` is
    the evidence (``cause``, ``phase``, ``reason``, ``sandbox_end``, ``log_tail``)."""

    def __init__(self, fault: dict[str, Any], error: BaseException):
        super().__init__(f"infra_fault ({fault['cause']}): {error}")
        self.fault = fault


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def infra_guard(phase: str) -> Callable[[F], F]:
    """Re-raise an infra fault of the wrapped call as :class:`SandfleetInfraError` (a failed
    image build stays an ImageError: Harbor has its own exception for it)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except ImageError:
                raise
            except Exception as e:
                fault = infra_fault_of(e, phase)
                if fault is None:
                    raise
                raise SandfleetInfraError(fault, e) from e

        return guarded  # type: ignore[return-value]

    return wrap


class HarborSandbox:
    """One sandfleet sandbox with Harbor's environment semantics (no Harbor import)."""

    def __init__(self, environment_dir: Path, name: str, options: Options, *, build_timeout_s: float = 600.0,
                 workdir: str | None = None, cpus: float | None = None, memory_mib: int | None = None,
                 disk_mib: int | None = None, network: bool = False, label: str = ""):
        self.environment_dir = Path(environment_dir)
        self.name = name
        self.options = options
        self.build_timeout_s = build_timeout_s
        self.workdir = workdir
        self.cpus = options.cpus if options.cpus is not None else cpus
        self.memory_mib = options.memory_mib if options.memory_mib is not None else memory_mib
        self.disk_mib = options.disk_mib if options.disk_mib is not None else (disk_mib or 10240)
        self.network = options.network if options.network is not None else network
        self.label = label
        self.agent_users: set[str] = set()
        """Users ``exec(user=None)`` ran as: whose processes die when the tests arrive."""
        self._sandbox: Sandbox | None = None

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise RuntimeError("the environment is not started")
        return self._sandbox

    @infra_guard("start")
    async def start(self) -> None:
        """Build (or find) the image, then make the sandbox. Only ``/logs`` is made for the
        agent's user; ``/tests`` and ``/solution`` are made by root when Harbor uploads them
        (a verifier image's own ``/tests`` is kept as built)."""
        from sandfleet.tasks.images import build_task_image

        task = image_task(self.environment_dir, self.name, self.build_timeout_s)
        image = await asyncio.to_thread(build_task_image, task)
        meta: dict[str, Any] = dict(image.meta) if not image.is_host else {}
        env = {str(k): str(v) for k, v in dict(meta.get("env") or {}).items()}
        self.workdir = self.workdir or str(meta.get("workdir") or DEFAULT_WORKDIR)
        user = self.options.agent_user or str(meta.get("user") or "agent").split(":", 1)[0]
        limits: dict[str, Any] = {"cpus": self.cpus, "memory_mib": self.memory_mib, "disk_mib": self.disk_mib,
                                  "network": self.network, "ttl_s": self.options.ttl_s}
        if self.options.pids is not None:
            limits["pids"] = self.options.pids
        spec = make_spec(image="host" if image.is_host else image.hash, backend=self.options.backend,
                         workdir=self.workdir, env=env, user=user, writable_dirs=("/logs",),
                         labels={"harbor": self.label or self.name}, **limits)
        self._sandbox = await create_sandbox(spec)

    @infra_guard("agent")
    async def exec(self, command: str, *, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: float | None = None, user: str | int | None = None,
                   phase_user: bool = True) -> tuple[int, str, str]:
        """``(exit code, stdout, stderr)`` as ``user`` (None: the sandbox's agent user); raises
        RuntimeError at ``timeout_sec`` (tree killed). Cancelled, the command's tree is killed
        (sandfleet's exec does that). ``phase_user``: the user is the phase's default (the
        agent's), not one Harbor named for housekeeping; it is remembered for the tests upload."""
        sandbox = self.sandbox
        if phase_user:
            self.agent_users.add(sandbox.spec.user if user is None else str(user))
        res = await sandbox.exec(command, cwd=cwd or self.workdir, env=env, timeout=timeout_sec,
                                 user=None if user is None else str(user))
        if res.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return res.exit_code, res.stdout, res.stderr

    @infra_guard("agent")
    async def upload_file(self, source: Path | str, target: str) -> None:
        source = Path(source)
        data = await asyncio.to_thread(source.read_bytes)
        mode = stat.S_IMODE(source.stat().st_mode) or 0o644
        try:
            await self.sandbox.write_file(target, data, mode=mode, user="root")
        except GuestFileNotFoundError:
            await self._root(f"mkdir -p -- {shlex.quote(posixpath.dirname(target) or '/')}")
            await self.sandbox.write_file(target, data, mode=mode, user="root")

    @infra_guard("agent")
    async def upload_dir(self, source: Path | str, target: str) -> None:
        """The folder's contents into ``target`` (made if missing), as root. Uploading the
        tests first ends everything the agent started and empties ``/tests``."""
        if posixpath.normpath(target) == TESTS_DIR:
            for user in sorted(self.agent_users or {self.sandbox.spec.user}):
                await stop_everything_of(self.sandbox, user)
            await self._root('set -e; d=/tests; if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -rf "$d"; '
                             'fi; mkdir -p "$d"; find "$d" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +; '
                             'chown 0:0 "$d"; chmod 0755 "$d"')
        await self.sandbox.upload(source, target, user="root")

    @infra_guard("agent")
    async def download_file(self, source: str, target: Path | str) -> None:
        data = await self.sandbox.read_file(source, user="root")
        target = Path(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(target.write_bytes, data)

    @infra_guard("agent")
    async def download_dir(self, source: str, target: Path | str) -> None:
        """The contents of ``source`` into ``target`` (made if missing; files there overwritten)."""
        target = Path(target)
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="sandfleet-harbor-") as scratch:
            got = await self.sandbox.download(source, scratch)
            await asyncio.to_thread(shutil.copytree, got, target, symlinks=True, dirs_exist_ok=True)

    async def stop(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await sandbox.close()

    async def _root(self, script: str) -> None:
        res = await self.sandbox.exec(["bash", "-c", script], cwd="/", user="root", timeout=120)
        if res.exit_code != 0:
            raise RuntimeError(f"sandfleet: {script[:80]}... failed: {res.output.strip()[-300:]}")


_environment_class: type | None = None


def __getattr__(name: str) -> Any:
    """``SandfleetEnvironment`` is made (Harbor imported) on first access."""
    global _environment_class
    if name != "SandfleetEnvironment":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _environment_class is None:
        _environment_class = _make_environment_class()
    return _environment_class


def _make_environment_class() -> type:
    try:
        from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
        from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
        from harbor.models.task.config import NetworkMode
    except ImportError as e:
        raise ImportError("sandfleet.integrations.harbor:SandfleetEnvironment needs Harbor 0.25 on Python 3.12 or "
                          f"later: pip install 'sandfleet[harbor]' ({e})") from e
    class SandfleetEnvironment(BaseEnvironment):
        """A Harbor environment whose sandbox is sandfleet's (see the module docstring)."""

        def __init__(self, *args: Any, **kwargs: Any):
            self._sf_options = Options.pop_from(kwargs)
            Options.refuse_unknown(kwargs, set(inspect.signature(BaseEnvironment.__init__).parameters))
            self._sf: HarborSandbox | None = None
            super().__init__(*args, **kwargs)

        @staticmethod
        def type() -> str:
            return "sandfleet"

        @property
        def capabilities(self) -> Any:
            return EnvironmentCapabilities(disable_internet=True)

        @classmethod
        def resource_capabilities(cls) -> Any:
            return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

        def _validate_definition(self) -> None:
            check_definition(Path(self.environment_dir), self.task_env_config.docker_image)

        @property
        def sf(self) -> HarborSandbox:
            if self._sf is None:
                raise RuntimeError("the environment is not started")
            return self._sf

        async def start(self, force_build: bool) -> None:
            cfg = self.task_env_config
            self._sf = HarborSandbox(
                Path(self.environment_dir), self.environment_name, self._sf_options,
                build_timeout_s=float(cfg.build_timeout_sec), workdir=cfg.workdir, cpus=self._effective_cpus,
                memory_mib=self._effective_memory_mb, disk_mib=self._effective_storage_mb,
                network=self.network_policy.network_mode == NetworkMode.PUBLIC, label=self.session_id,
            )  # fmt: skip
            try:
                await self._sf.start()
            except ImageError as e:
                raise SandboxBuildFailedError(str(e)) from e
            await self.ensure_dirs(self._mount_targets(writable_only=True))
            await self._upload_environment_dir_after_start()

        async def stop(self, delete: bool) -> None:
            if self._sf is not None:
                await self._sf.stop()

        async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                       timeout_sec: int | None = None, user: str | int | None = None) -> Any:
            code, out, err = await self.sf.exec(command, cwd=cwd, env=self._merge_env(env), timeout_sec=timeout_sec,
                                                user=self._resolve_user(user), phase_user=user is None)
            return ExecResult(stdout=out or None, stderr=err or None, return_code=code)

        async def upload_file(self, source_path: Path | str, target_path: str) -> None:
            await self.sf.upload_file(source_path, target_path)

        async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
            await self.sf.upload_dir(source_dir, target_dir)

        async def download_file(self, source_path: str, target_path: Path | str) -> None:
            await self.sf.download_file(source_path, target_path)

        async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
            await self.sf.download_dir(source_dir, target_dir)

    SandfleetEnvironment.__module__, SandfleetEnvironment.__qualname__ = __name__, "SandfleetEnvironment"
    return SandfleetEnvironment
