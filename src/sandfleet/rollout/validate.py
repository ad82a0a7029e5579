"""Task validation: the reference solution must score 1 and doing nothing must score 0,
every time, in fresh sandboxes.

``sandfleet tasks validate DIR [--repeats R] [--json]`` (:mod:`sandfleet.cli.validate`) runs
both R times per task, in parallel up to the host's limit (one busy sandbox per hardware
thread), prints a table, writes a JSON report and exits non-zero when any task is not valid. Each verdict is
``valid``, ``invalid`` (with why: the image build failed at a Dockerfile line, the oracle
scored 0 with the tail of the test output, the no-op agent passed) or ``flaky`` (2/3).

The oracle runs as the task's agent user (its declared user, else the non-root ``agent``;
``--agent-user`` overrides). When it fails so, it is run once more as root, and a task whose
oracle passes only as root says so: declare the user (``[agent].user``, ``USER``) or run it
with ``--agent-user root``.

The report records, per task, the base its image was built from (``base``: what the FROM
became), any substitution of it (``warnings``: a Python version no Debian ships, an Ubuntu
base, the host standing in for a base that could not be built; ``--strict-bases`` refuses
them instead), and the users the agent and the tests ran as. Test scripts that download at
test time (:mod:`sandfleet.tasks.scan`) need ``--network``: without it they are reported as
"needs network at test time", naming the lines.

``under_load`` (``--under-load``) runs each task's oracle once more per repeat beside busy
processes (:mod:`sandfleet.rollout.underload`); a task that passed on the quiet host and fails
so is ``load_sensitive``, naming the test that flipped.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sandfleet.rollout.admission import Slots, host_capacity
from sandfleet.rollout.policy import NoopPolicy, OraclePolicy
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.runner import RetryPolicy
from sandfleet.rollout.suite import ImageFor, RunConfig, RunReport, default_image_for, run_suite
from sandfleet.sandbox.spec import ROOT_UID, USERS
from sandfleet.tasks.coverage import task_coverage
from sandfleet.tasks.model import Task

Status = Literal["valid", "invalid", "flaky", "load_sensitive"]
TAIL_CHARS = 1500


@dataclass
class Verdict:
    """Whether one task is valid, and why not."""

    status: Status
    reason: str
    oracle_rewards: list[float | None] = field(default_factory=list)
    noop_rewards: list[float | None] = field(default_factory=list)
    seconds: float = 0.0
    """Summed wall time of the task's rollouts."""
    base: str | None = None
    """What the task's FROM became, e.g. ``python:3.12-slim -> debian trixie (python 3.13)``."""
    warnings: list[str] = field(default_factory=list)
    """Substitutions (of the base) and other differences from Docker, each a sentence."""
    user: str | None = None
    """The user the agent (the oracle, the no-op) ran as."""
    verifier_user: str | None = None
    """The user the tests ran as."""
    needs_network: list[str] = field(default_factory=list)
    """Lines of the test scripts that download at test time (they need ``--network``)."""
    coverage: str | None = None
    """How the task's bases map (tasks/coverage.py): ``exact``, ``approximated``, ``refused``."""
    base_asked: list[str] = field(default_factory=list)
    """The language versions the task's bases asked for (``Go 1.22``)..."""
    base_got: list[str] = field(default_factory=list)
    """... and the versions they got from Debian (``Go 1.24``)."""
    under_load_rewards: list[float | None] | None = None
    """The oracle's rewards beside CPU load (``--under-load``); None when not run so."""
    load_sensitive: bool = False
    """The oracle passed on the quiet host and failed beside the load."""
    load_flipped: list[str] = field(default_factory=list)
    """What failed under load: the tests pytest named (``test_outputs.py::test_perf``), else
    the rollouts' reasons."""


def _tail(result: RolloutResult) -> str:
    text = result.verifier_output or result.error or ""
    return text[-TAIL_CHARS:].strip()


def _why(r: RolloutResult) -> str:
    if r.status == "completed" and r.reward is None and r.verdict == "infra_fault":
        cause = (r.fault or {}).get("cause") or "no cause given"
        return f"masked as an infra fault ({cause}), the test output tail: {_tail(r)[-300:]}"
    if r.status != "completed":
        return f"{r.reason}: {r.error}"
    if r.reason:  # scored 0 whatever the tests said (verifier.py): say why
        return f"scored {r.reward}, {r.reason}: {str(r.info.get('reward_error') or '').splitlines()[0][:300]}"
    return f"scored {r.reward}"


def _zero(r: RolloutResult) -> bool:
    """The tests scored 0: a no-op's 0 masked as host_contention (docs/rollouts.md) still
    shows that they do not pass without any work."""
    if r.fault and r.fault.get("cause") == "host_contention":
        return r.fault.get("tests_reward") == 0.0
    return r.status == "completed" and r.reward == 0.0


def judge(task: Task, oracle: Sequence[RolloutResult], noop: Sequence[RolloutResult]) -> Verdict:
    """The verdict on a task from its oracle and no-op rollouts."""
    seconds = sum(r.duration for r in [*oracle, *noop])
    verdict = Verdict("valid", "", [r.reward for r in oracle], [r.reward for r in noop], seconds)
    built = [r for r in [*oracle, *noop] if r.reason == "image_build"]
    if built:
        verdict.status, verdict.reason = "invalid", f"image build failed: {built[0].error}"
        return verdict
    if task.solution is None:
        verdict.status, verdict.reason = "invalid", "the task has no reference solution"
        return verdict
    n = len(oracle)
    passed = [r for r in oracle if r.passed]
    zero = [r for r in noop if _zero(r)]
    bad_oracle = [r for r in oracle if not r.passed]
    bad_noop = [r for r in noop if not _zero(r)]
    reasons = []
    if bad_oracle:
        first = bad_oracle[0]
        reasons.append(f"oracle passed {len(passed)}/{n} ({_why(first)}); test output tail:\n"
                       f"{_tail(first)}")  # fmt: skip
    if bad_noop:
        first = bad_noop[0]
        what = "the tests pass without any work" if first.passed else _why(first)
        reasons.append(f"no-op agent scored 0 in {len(zero)}/{len(noop)} ({what})")
    if not reasons:
        return verdict
    always_wrong = (bad_oracle and not passed) or (bad_noop and not zero)
    verdict.status = "invalid" if always_wrong else "flaky"
    if verdict.status == "flaky":
        reasons.insert(0, f"flaky {min(len(passed), len(zero))}/{n}")
    verdict.reason = "\n".join(reasons)
    return verdict


async def validate_tasks(
    tasks: Sequence[Task],
    *,
    repeats: int = 3,
    concurrency: int | None = None,
    backend: str = "auto",
    image_for: ImageFor = default_image_for,
    agent_user: str | None = None,
    network: bool = False,
    strict_bases: bool = False,
    accept_older: bool = False,
    verify: str = "shared",
    under_load: int | None = None,
    on_result: Callable[[RolloutResult], None] | None = None,
) -> dict[str, Verdict]:
    """Run the oracle and the no-op agent ``repeats`` times per task, as ``agent_user`` (None:
    each task's declared user); a verdict per task. A task whose oracle fails is tried once
    more as root, and one that passes so is invalid: "passes only as root". ``network`` gives
    the sandboxes network; ``strict_bases`` refuses substituted bases (the default
    ``image_for`` only); ``accept_older`` (``--accept-older-versions``) builds a language base
    asking for a newer version than Debian ships with the newest there is; ``verify``: the tests
    in the agent's sandbox (``shared``) or in a fresh one given the workdir (``separate``), as
    ``sandfleet run --verify``. ``under_load``: that many busy processes beside a further
    ``repeats`` oracle runs per task (the tasks whose oracle passed), flagging a task whose
    reward flips as ``load_sensitive``. ``on_result`` is handed each oracle and no-op result
    as it ends (the CLI's progress)."""
    if (strict_bases or accept_older) and image_for is default_image_for:
        image_for = functools.partial(_image_for, strict=strict_bases, accept_older=accept_older)
    built: dict[str, str] = {}

    async def recording_image_for(task: Task) -> str:
        built[task.name] = image = await image_for(task)
        return image

    limit = concurrency or host_capacity([t.cpus for t in tasks])  # auto: what the CPUs hold at the tasks' cpus
    slots = Slots(limit)
    retry = RetryPolicy(max_attempts=1)

    def config(n: int = repeats, user: str | None = agent_user) -> RunConfig:
        # repeats are no GRPO group: each rollout takes a slot of its own
        return RunConfig(n=n, concurrency=limit, backend=backend, retry=retry, agent_user=user,
                         admission="rollout", network=network, verify=verify)

    oracle, noop = await asyncio.gather(
        run_suite(tasks, OraclePolicy(), config(), image_for=recording_image_for, slots=slots, on_result=on_result),
        run_suite(tasks, NoopPolicy(), config(), image_for=recording_image_for, slots=slots, on_result=on_result),
    )
    verdicts = {}
    for task in tasks:
        mine_o = [r for r in oracle.results if r.task == task.name]
        mine_n = [r for r in noop.results if r.task == task.name]
        verdicts[task.name] = judge(task, mine_o, mine_n)
        fidelity(verdicts[task.name], task, built.get(task.name), [*mine_o, *mine_n], network=network)
        cov = task_coverage(task, strict=strict_bases, accept_older=accept_older)
        verdicts[task.name].coverage, verdicts[task.name].base_asked = cov.coverage, cov.asked
        verdicts[task.name].base_got = cov.got
    as_root = str(USERS.get(agent_user or "", agent_user)) == str(ROOT_UID)
    retry_root = [t for t in tasks if not as_root and t.solution is not None
                  and verdicts[t.name].status != "valid" and not any(
                      r.passed for r in oracle.results if r.task == t.name)
                  and not any(r.reason == "image_build" for r in oracle.results if r.task == t.name)]
    if retry_root:
        rooted = await run_suite(retry_root, OraclePolicy(), config(1, "root"), image_for=image_for, slots=slots)
        for r in rooted.results:
            if r.passed:
                v = verdicts[r.task]
                v.status = "invalid"
                v.reason = (f"the oracle passes only as root (it failed as the task's user "
                            f"{_user_of(oracle.results, r.task)}): declare the user ([agent].user or the "
                            f"Dockerfile's USER) or run with --agent-user root\n{v.reason}")
    if under_load is not None:
        await _beside_load(tasks, verdicts, oracle.results, under_load,
                           lambda: run_suite([t for t in tasks if any(r.passed for r in oracle.results
                                                                      if r.task == t.name)],
                                             OraclePolicy(), config(), image_for=image_for, slots=slots))
    return verdicts


async def _beside_load(tasks: Sequence[Task], verdicts: dict[str, Verdict], quiet: Sequence[RolloutResult],
                       procs: int, run: Callable[[], Awaitable[RunReport]]) -> None:
    """Run the oracles (``run``) beside ``procs`` busy processes and record on each verdict its
    rewards so, and whether they flipped."""
    from sandfleet.rollout.underload import cpu_load, flipped

    with cpu_load(procs):
        loaded = await run()
    for task in tasks:
        mine = [r for r in loaded.results if r.task == task.name]
        if not mine:
            continue  # its oracle never passed on the quiet host: nothing to flip
        v = verdicts[task.name]
        v.under_load_rewards = [r.reward for r in mine]
        v.load_sensitive, v.load_flipped = flipped([r for r in quiet if r.task == task.name], mine)
        if v.load_sensitive:
            passed = sum(r.passed for r in mine)
            why = (f"load-sensitive: the oracle passed {passed}/{len(mine)} beside {procs} busy processes; "
                   f"failed: {', '.join(v.load_flipped)} (time against a baseline measured in the same run, "
                   f"or declare [verifier] load_sensitive = true)")
            if v.status == "valid":
                v.status = "load_sensitive"
            v.reason = f"{why}\n{v.reason}" if v.reason else why


async def _image_for(task: Task, *, strict: bool, accept_older: bool) -> str:
    from sandfleet.tasks.images import ensure_task_image, remote_builder

    return await ensure_task_image(task, strict=strict, accept_older=accept_older, builder=remote_builder())


def fidelity(verdict: Verdict, task: Task, image: str | None, results: Sequence[RolloutResult], *,
             network: bool) -> None:
    """Record on ``verdict`` the base, its substitutions, the users, and what the tests
    download at test time (named; a reason of its own when the run had no network and the
    task is not valid)."""
    from sandfleet.errors import ImageError
    from sandfleet.images.bases import resolve_base
    from sandfleet.rollout.verifier import NO_LANDLOCK_RISK, verifier_user
    from sandfleet.tasks.scan import (
        CONFTEST_RISK,
        GUARD_OFF_RISK,
        NEEDS_NETWORK,
        SHARED_TMP_RISK,
        SOURCED_RISK,
        TESTS_DATA_RISK,
        WORKDIR_PATH_RISK,
        downloads_at_test_time,
        python_guard_off,
        shared_tmp_writes,
        sourced_from_workdir,
        tests_data_writes,
        workdir_conftest_risk,
        workdir_path_risk,
    )

    meta: dict[str, Any] = {}
    if image is not None and image != "host":
        from sandfleet.imagestore import resolve_image

        try:
            meta = dict(resolve_image(image).meta)
        except Exception:  # a vanished cache entry: fall back to the static mapping
            meta = {}
    if meta.get("base_used"):
        verdict.base = str(meta["base_used"])
        verdict.warnings += [str(w) for w in meta.get("warnings") or []]
    elif task.base_image is not None:
        try:
            ref = resolve_base(task.base_image)
            verdict.base = ref.describe()
            if ref.substituted and ref.note:
                verdict.warnings.append(ref.note)
        except ImageError as e:
            verdict.base = f"{task.base_image} (refused: {e})"
    elif image == "host":
        verdict.base = "host"
    users = sorted({str(r.info["agent_user"]) for r in results if r.info.get("agent_user")})
    verdict.user = ", ".join(users) or None
    verdict.verifier_user = verdict.user if task.verifier.same_shell else verifier_user(task)
    verdict.needs_network = downloads_at_test_time(task)
    verdict.warnings += [f"{CONFTEST_RISK}: {line}" for line in workdir_conftest_risk(task)]
    verdict.warnings += [f"{GUARD_OFF_RISK}: {line}" for line in python_guard_off(task)]
    verdict.warnings += [f"{WORKDIR_PATH_RISK}: {line}" for line in workdir_path_risk(task)]
    verdict.warnings += [f"{SOURCED_RISK}: {line}" for line in sourced_from_workdir(task)]
    verdict.warnings += [f"{SHARED_TMP_RISK}: {line}" for line in shared_tmp_writes(task)]
    verdict.warnings += [f"{TESTS_DATA_RISK}: {line}" for line in tests_data_writes(task)]
    if any(NO_LANDLOCK_RISK in (r.info.get("verifier_risks") or []) for r in results):
        verdict.warnings.append(NO_LANDLOCK_RISK)  # the backend's, seen by the verifier's probe
    if verdict.needs_network and not network:
        what = f"{NEEDS_NETWORK}: " + "; ".join(verdict.needs_network) + " (run with --network)"
        verdict.warnings.append(what)
        if verdict.status != "valid":
            verdict.reason = f"{what}\n{verdict.reason}"


def _user_of(results: Sequence[RolloutResult], task: str) -> str:
    users = {r.info.get("agent_user") for r in results if r.task == task} - {None}
    return ", ".join(sorted(str(u) for u in users)) or "(declared)"
