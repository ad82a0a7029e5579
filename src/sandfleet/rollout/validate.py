"""Task validation: the reference solution must score 1 and doing nothing must score 0,
every time, in fresh sandboxes.

``sandfleet tasks validate DIR [--repeats R] [--json]`` runs both R times per task, in
parallel up to the host's limit (one busy sandbox per hardware thread), prints a table,
writes a JSON report and exits non-zero when any task is not valid. Each verdict is
``valid``, ``invalid`` (with why: the image build failed at a Dockerfile line, the oracle
scored 0 with the tail of the test output, the no-op agent passed) or ``flaky`` (2/3).

The oracle runs as the task's agent user (its declared user, else the non-root ``agent``;
``--agent-user`` overrides). When it fails so, it is run once more as root, and a task whose
oracle passes only as root says so: declare the user (``[agent].user``, ``USER``) or run it
with ``--agent-user root``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import click

from sandfleet.rollout.admission import Slots
from sandfleet.rollout.policy import NoopPolicy, OraclePolicy
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.runner import RetryPolicy
from sandfleet.rollout.suite import ImageFor, RunConfig, default_image_for, run_suite
from sandfleet.sandbox.spec import ROOT_UID, USERS
from sandfleet.tasks.model import Task

Status = Literal["valid", "invalid", "flaky"]
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


def _tail(result: RolloutResult) -> str:
    text = result.verifier_output or result.error or ""
    return text[-TAIL_CHARS:].strip()


def _why(r: RolloutResult) -> str:
    return f"{r.reason}: {r.error}" if r.status != "completed" else f"scored {r.reward}"


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
    zero = [r for r in noop if r.status == "completed" and r.reward == 0.0]
    bad_oracle = [r for r in oracle if not r.passed]
    bad_noop = [r for r in noop if not (r.status == "completed" and r.reward == 0.0)]
    reasons = []
    if bad_oracle:
        first = bad_oracle[0]
        reasons.append(f"oracle passed {len(passed)}/{n} ({_why(first)}); test output tail:\n"
                       f"{_tail(first)}")  # fmt: skip
    if bad_noop:
        first = bad_noop[0]
        what = "the tests pass without any work" if first.status == "completed" else _why(first)
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
) -> dict[str, Verdict]:
    """Run the oracle and the no-op agent ``repeats`` times per task, as ``agent_user`` (None:
    each task's declared user); a verdict per task. A task whose oracle fails is tried once
    more as root, and one that passes so is invalid: "passes only as root"."""
    limit = concurrency or os.cpu_count() or 1
    slots = Slots(limit)
    retry = RetryPolicy(max_attempts=1)

    def config(n: int = repeats, user: str | None = agent_user) -> RunConfig:
        # repeats are no GRPO group: each rollout takes a slot of its own
        return RunConfig(n=n, concurrency=limit, backend=backend, retry=retry, agent_user=user,
                         admission="rollout")

    oracle, noop = await asyncio.gather(
        run_suite(tasks, OraclePolicy(), config(), image_for=image_for, slots=slots),
        run_suite(tasks, NoopPolicy(), config(), image_for=image_for, slots=slots),
    )
    verdicts = {}
    for task in tasks:
        mine_o = [r for r in oracle.results if r.task == task.name]
        mine_n = [r for r in noop.results if r.task == task.name]
        verdicts[task.name] = judge(task, mine_o, mine_n)
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
    return verdicts


def _user_of(results: Sequence[RolloutResult], task: str) -> str:
    users = {r.info.get("agent_user") for r in results if r.task == task} - {None}
    return ", ".join(sorted(str(u) for u in users)) or "(declared)"


def _cell(rewards: list[float | None], want: float) -> str:
    good = sum(1 for r in rewards if r is not None and abs(r - want) < 1e-9)
    return f"{good}/{len(rewards)}"


@click.command("validate")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--repeats",
    "-r",
    default=3,
    show_default=True,
    type=int,
    help="Runs of the oracle and of the no-op agent per task.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report instead of a table.")
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("validation.json"),
    show_default=True,
    help="Where to write the report.",
)
@click.option("--concurrency", type=int, help="Rollouts at once (default: one per CPU).")
@click.option("--backend", default="auto", show_default=True)
@click.option("--agent-user", "agent_user", default=None,
              help="Run the oracle and the no-op agent as this user (root = Docker's behaviour); default: "
              "each task's declared user, else the non-root 'agent'.")
def validate(
    directory: Path, repeats: int, as_json: bool, report_path: Path, concurrency: int | None, backend: str,
    agent_user: str | None,
) -> None:
    """Validate the tasks under DIRECTORY: oracle scores 1, no-op scores 0, every time."""
    from sandfleet.tasks.loader import load_tasks

    if repeats < 1:
        raise click.BadParameter("must be at least 1", param_hint="--repeats")
    tasks, failures = load_tasks(directory)
    t0 = time.perf_counter()
    verdicts = asyncio.run(validate_tasks(tasks, repeats=repeats, concurrency=concurrency, backend=backend,
                                          agent_user=agent_user))
    wall = time.perf_counter() - t0
    for failure in failures:
        verdicts[failure.path.name] = Verdict("invalid", f"does not load: {failure.error}")
    report: dict[str, Any] = {name: asdict(v) for name, v in sorted(verdicts.items())}
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        rows = [("task", "status", "oracle=1", "noop=0", "reason")]
        for name, v in sorted(verdicts.items()):
            first = v.reason.splitlines()[0] if v.reason else ""
            rows.append((name, v.status, _cell(v.oracle_rewards, 1.0), _cell(v.noop_rewards, 0.0),
                         first[:100]))  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for row in rows:
            click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[4])
        bad = {n: v for n, v in verdicts.items() if v.status != "valid"}
        for name, v in sorted(bad.items()):
            click.echo(f"\n{name}: {v.status}\n{v.reason}", err=True)
        click.echo(
            f"\n{len(verdicts) - len(bad)}/{len(verdicts)} valid in {wall:.1f} s "
            f"(repeats {repeats}); report: {report_path}"
        )
    if any(v.status != "valid" for v in verdicts.values()):
        raise SystemExit(1)
