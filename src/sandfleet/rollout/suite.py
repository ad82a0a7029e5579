"""Running a suite: n rollouts per task (GRPO groups) under a concurrency limit.

Each task's image is built once (a failed build fails that task's rollouts with the
Dockerfile line, and the run goes on). A group's n rollouts are admitted together, as a
trainer samples them (:mod:`sandfleet.rollout.admission`): they take n concurrency slots at
once, never part of them, and each gives its slot back as it ends. Every rollout gets a
fresh sandbox -- created from the image (and prepared, where the task has a prepare step),
or, with ``fork=True``, forked from the group's prepared state, made once per group
(:mod:`sandfleet.rollout.prepare`).

Nothing is lost: every attempt is appended (and flushed) to ``trace.jsonl`` as it ends,
every rollout's final attempt to ``rollouts.jsonl``, every group's statistics and
advantages to ``groups.jsonl`` when the group ends, and ``summary.json`` is written
atomically at the end, also when the run is interrupted. A directory that already holds
results is refused unless the run resumes it (finished groups are kept, the others run
again whole) or overwrites it. A killed run loses only the rollouts in flight.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from sandfleet.analysis.figures import platform_overhead_summary
from sandfleet.errors import ConfigError
from sandfleet.provenance import provenance
from sandfleet.rollout.admission import Admission, Slots
from sandfleet.rollout.policy import Policy
from sandfleet.rollout.prepare import Prepared, delete_snapshot, prepared_snapshot
from sandfleet.rollout.result import RolloutResult, group_advantages
from sandfleet.rollout.runner import RetryPolicy, RolloutRequest, failure_reason, run_with_retries, task_spec
from sandfleet.rollout.trace import SpanRecorder, now
from sandfleet.rollout.tree import (
    LINEAGE,
    BranchPlan,
    check_policy,
    parse_branch,
    run_tree_with_retries,
    tree_advantages,
)
from sandfleet.rollout.verdict import INFRA, counted, settle, verdict_counts
from sandfleet.sandbox.bwrap import raw_bwrap_true_ms
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.tasks.model import Task
from sandfleet.traceschema import SPAN_NAMES

log = logging.getLogger(__name__)

ImageFor = Callable[[Task], Awaitable[str]]


async def default_image_for(task: Task) -> str:
    """The task's environment image (built and cached by ``sandfleet.images.build``), here or
    on the sandbox service in force (``--remote``)."""
    from sandfleet.tasks.images import ensure_task_image, remote_builder

    return await ensure_task_image(task, builder=remote_builder())


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]


@dataclass
class RunConfig:
    """How a suite runs."""

    n: int = 1
    """Rollouts per task (the GRPO group size)."""
    concurrency: int = 8
    """Rollouts in flight at once; at least ``n`` (a group is admitted whole)."""
    backend: str = "auto"
    """Sandbox backend: auto (bwrap where it can run), bwrap, process, microvm."""
    network: bool = False
    """Give sandboxes network access (off by default, whatever the task asks)."""
    fork: bool = False
    """Run each group's prepare step once and fork its members from the prepared state,
    instead of each member preparing a fresh sandbox (tasks without one: fresh sandboxes)."""
    admission: str = "group"
    """``group``: a group's n rollouts take n slots at once (as a trainer samples them);
    ``rollout``: each rollout takes one slot (validation, which samples no groups)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    run_id: str = field(default_factory=new_run_id)
    agent_user: str | None = None
    """Who the agent runs as in every task (``root`` gives Docker's behaviour); None = each
    task's declared user, else the non-root ``agent`` (docs/security.md)."""
    verify: str = "shared"
    """``shared``: tests run in the agent's sandbox; ``separate``: in a fresh sandbox of the
    same image carrying only the workdir and declared artifacts."""
    seccomp_allow: tuple[str, ...] = ()
    """Rules of the default seccomp filter every sandbox opts out of, besides each task's own
    (``--seccomp-allow``; ``unconfined``: no filter)."""
    record: str = "commands"
    """What each rollout's record in ``records.jsonl`` keeps: ``none``, ``commands`` (all but
    the model's messages) or ``full`` (docs/replay.md)."""
    branch: str = ""
    """``TURN:WIDTH[,TURN:WIDTH...]``: each rollout is a tree that splits its sandbox and
    conversation at those turns (:mod:`sandfleet.rollout.tree`); a group is ``n`` trees and
    takes ``n`` x leaves slots. Empty: straight rollouts."""
    branch_processes: str = "error"
    """At a split, processes the backend can't carry: ``error`` fails the branch naming them
    (the children are then masked), ``drop`` leaves them behind."""

    @property
    def plan(self) -> BranchPlan | None:
        """The parsed ``branch``, or None."""
        return parse_branch(self.branch) if self.branch else None

    @property
    def group_slots(self) -> int:
        """Slots one group holds: its rollouts, a tree counting its leaves."""
        plan = self.plan
        return self.n * (plan.leaves if plan else 1)

    def __post_init__(self) -> None:
        from sandfleet.sandbox.spec import BACKENDS

        if self.backend not in ("auto", *BACKENDS):
            raise ConfigError(f"unknown backend {self.backend!r}; known: auto, {', '.join(BACKENDS)}")
        if not 1 <= self.n <= 100_000:
            raise ConfigError(f"n must be between 1 and 100000, not {self.n}")
        if not 1 <= self.concurrency <= 100_000:
            raise ConfigError(f"concurrency must be between 1 and 100000, not {self.concurrency}")
        if self.verify not in ("shared", "separate"):
            raise ConfigError(f"verify must be shared or separate, not {self.verify!r}")
        if self.record not in ("none", "commands", "full"):
            raise ConfigError(f"record must be none, commands or full, not {self.record!r}")
        if self.admission not in ("group", "rollout"):
            raise ConfigError(f"admission must be group or rollout, not {self.admission!r}")
        if self.branch and self.backend == "process":
            raise ConfigError("--branch needs a backend that can branch a live sandbox (bwrap, gvisor, microvm); "
                              "process can't")
        if self.branch_processes not in ("error", "drop"):
            raise ConfigError(f"branch processes must be error or drop, not {self.branch_processes!r}")
        if self.admission == "group" and self.concurrency < self.group_slots:
            raise ConfigError(group_too_big(self.group_slots, self.concurrency))
        from sandfleet.sandbox.seccomp import check_allow

        try:
            self.seccomp_allow = check_allow(self.seccomp_allow)
        except ValueError as e:
            raise ConfigError(f"--seccomp-allow: {e}") from None
        if self.agent_user is not None:
            from sandfleet.sandbox.spec import check_user

            try:
                self.agent_user = check_user(self.agent_user)
            except ValueError as e:
                raise ConfigError(f"agent user: {e}") from None


def group_too_big(n: int, concurrency: int, *, flags: bool = False) -> str:
    """Why a concurrency below the group size is refused (``flags``: as the CLI spells them)."""
    c, g = ("--concurrency ", "-n ") if flags else ("concurrency ", "n=")
    return (f"{c}{concurrency} is less than the group size {g}{n}: a group's {n} rollouts are admitted "
            f"together, so the concurrency must be at least {n}")


@dataclass
class RunReport:
    """The outcome of a run: the final attempt of every rollout, and every attempt."""

    config: RunConfig
    results: list[RolloutResult]
    attempts: list[RolloutResult]
    groups: dict[str, dict[str, Any]]
    wall_s: float
    interrupted: bool = False
    """The run was stopped (Ctrl-C, SIGTERM) before every group finished."""
    resumed: int = 0
    """Rollouts carried over from the run directory being resumed."""
    snapshot_errors: int = 0

    def summary(self) -> dict[str, Any]:
        """The figures of ``summary.json``."""
        done = [r for r in self.results if r.status == "completed"]
        spans: dict[str, float] = dict.fromkeys(SPAN_NAMES, 0.0)
        for r in self.results:
            for name, seconds in r.span_seconds().items():
                spans[name] += seconds
        n = len(self.results)
        total = sum(r.duration for r in self.results)
        verdicts = verdict_counts(self.results)
        kept = counted(self.results)  # scored and policy faults: what trains
        rewards = [r.reward for r in kept if r.reward is not None]
        return {
            "run_id": self.config.run_id, "n_rollouts": n, "n_completed": len(done),
            "n_failed": sum(r.status == "failed" for r in self.results),
            "n_cancelled": sum(r.status == "cancelled" for r in self.results),
            "n_attempts": len(self.attempts),
            "verdicts": verdicts, "mask_rate": verdicts[INFRA] / n if n else 0.0,
            "masked_causes": dict(Counter(str((r.fault or {}).get("cause")) for r in self.results if r.masked)),
            "policy_fault_causes": dict(Counter(str((r.fault or {}).get("cause")) for r in self.results
                                                if r.verdict == "policy_fault")),
            "refilled": sum(1 for r in self.attempts if r.masked and not r.final),
            "pass_rate": sum(r.passed for r in kept) / len(kept) if kept else 0.0,
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "spans_mean_s": {k: v / n for k, v in spans.items()} if n else spans,
            "mean_rollout_s": total / n if n else None,
            "overhead_fraction": spans["overhead"] / total if total else None,
            **platform_overhead_summary(self.results),
            "wall_s": self.wall_s,
            "rollouts_per_min": 60.0 * n / self.wall_s if self.wall_s else None,
            "concurrency": self.config.concurrency, "group_size": self.config.n,
            "backend": self.config.backend,
            "failures": dict(Counter(r.reason or "?" for r in self.results if not r.passed
                                     and r.status != "completed")),
            "close_failures": sum(bool(r.info.get("close_error")) for r in self.attempts)
            + self.snapshot_errors,
            "interrupted": self.interrupted, "resumed_rollouts": self.resumed,
            "groups_incomplete": sum(g.get("complete") is False for g in self.groups.values()),
            "groups": self.groups,
        }  # fmt: skip


RUN_FILES = ("run.json", "trace.jsonl", "rollouts.jsonl", "groups.jsonl", "summary.json", "records.jsonl")
"""What a run directory holds (``--overwrite`` replaces only a directory holding one of these)."""


def _is_tmp(name: str) -> bool:
    """A temp file of :func:`write_atomic` (a run killed while writing)."""
    return name.startswith(".") and ".tmp-" in name


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of a file; a torn last line (a killed run) is dropped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def write_atomic(path: Path, text: str) -> None:
    """Write a file whole or not at all: a temp file beside it, flushed, then renamed."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def _result_from(trace: dict[str, Any], record: dict[str, Any] | None) -> RolloutResult:
    rec = record or {}
    return RolloutResult(
        rollout_id=str(trace["rollout_id"]), task=str(trace["task"]), group=str(trace["group"]),
        sample=int(trace["sample"]), agent=str(trace.get("agent", "")), backend=str(trace.get("backend", "")),
        start=float(trace["start"]), end=float(trace["end"]), status=trace["status"],
        spans=list(trace.get("spans") or []), run_id=str(trace.get("run_id", "")),
        attempt=int(trace.get("attempt", 1)), sandbox_id=trace.get("sandbox_id"),
        error=trace.get("error"), reason=trace.get("reason"), reward=trace.get("reward"),
        reward_details=rec.get("reward_details") or {}, advantage=rec.get("advantage"),
        stop_reason=rec.get("stop_reason"), turns=int(rec.get("turns", 0)),
        commands=int(rec.get("commands", 0)), prompt_tokens=int(rec.get("prompt_tokens", 0)),
        completion_tokens=int(rec.get("completion_tokens", 0)),
        verifier_exit_code=rec.get("verifier_exit_code"), verifier_output=rec.get("verifier_output") or "",
        info=rec.get("info") or {}, verdict=trace.get("verdict") or rec.get("verdict"),
        fault=trace.get("fault") or rec.get("fault"),
        tree={k: trace.get(k) for k in LINEAGE} if trace.get("tree_id") else None,
    )  # fmt: skip


@dataclass
class _Previous:
    """What an earlier, unfinished run left in the directory being resumed."""

    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: list[RolloutResult] = field(default_factory=list)
    attempts: list[RolloutResult] = field(default_factory=list)
    wall_s: float = 0.0


class _Writer:
    """The run directory: ``run.json`` at the start, ``trace.jsonl`` (every attempt) and
    ``rollouts.jsonl`` (every rollout's final attempt) appended and flushed as each ends,
    ``groups.jsonl`` as each group ends, ``summary.json`` atomically at the end (also when
    the run is interrupted)."""

    def __init__(self, out: Path | None, cfg: RunConfig, mode: str = "new"):
        self.out = out
        self.files: dict[str, IO[str]] = {}
        self.previous = _Previous()
        self.superseded: dict[tuple[str, int], int] = {}
        """(group, sample) -> the last attempt number a killed run recorded for a group it did
        not finish: the re-run's attempts are numbered after it (ids ``group#i~k``)."""
        if out is None:
            return
        if mode not in ("new", "resume", "overwrite"):
            raise ConfigError(f"unknown output mode {mode!r}")
        existing = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
        if mode == "resume" and existing and all(_is_tmp(n) for n in existing):
            for n in existing:  # killed while writing run.json: the run never began
                (out / n).unlink(missing_ok=True)
            existing = []
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out} exists and is not a directory")
        if existing and mode == "new":
            raise ConfigError(f"--out {out} is not empty ({len(existing)} entries): pass --resume to "
                              "continue that run, --overwrite to replace it, or choose another directory")
        if existing and mode == "overwrite":
            if not set(existing) & set(RUN_FILES):
                raise ConfigError(f"--overwrite refuses {out}: it holds no sandfleet run "
                                  f"(none of {', '.join(RUN_FILES)})")
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        if existing and mode == "resume":
            self._load_previous(out, cfg)
        else:
            info = {"run_id": cfg.run_id, "n": cfg.n, "backend": cfg.backend, "fork": cfg.fork,
                    "started": time.time(),
                    "provenance": provenance({"n": cfg.n, "concurrency": cfg.concurrency, "backend": cfg.backend,
                                              "fork": cfg.fork, "max_attempts": cfg.retry.max_attempts}),
                    "raw_bwrap_true_ms": raw_bwrap_true_ms() if cfg.backend in ("bwrap", "auto") else None}
            write_atomic(out / "run.json", json.dumps(info, indent=2) + "\n")
        for name in ("trace.jsonl", "rollouts.jsonl", "groups.jsonl", *(("records.jsonl",) if cfg.record != "none"
                                                                          else ())):
            self.files[name] = open(out / name, "a", encoding="utf-8")  # noqa: SIM115

    def _load_previous(self, out: Path, cfg: RunConfig) -> None:
        """Keep what finished groups recorded; their groups' other rows are superseded: those
        groups run again whole, and what their attempts recorded stays in ``trace.jsonl``
        with ``final: false`` (``superseded: "resume"``), never in ``rollouts.jsonl``."""
        try:
            info = json.loads((out / "run.json").read_text())
        except (OSError, ValueError):
            raise ConfigError(f"--resume: {out} holds no readable run.json (not a sandfleet run "
                              "directory, or one from an older version)") from None
        if not isinstance(info, dict) or not isinstance(info.get("run_id"), str):
            raise ConfigError(f"--resume: {out / 'run.json'} is malformed")
        if info.get("n") != cfg.n:
            raise ConfigError(f"--resume: {out} was run with -n {info.get('n')}, not -n {cfg.n}")
        cfg.run_id = info["run_id"]
        groups = {str(g["group"]): g for g in _json_lines(out / "groups.jsonl") if "group" in g}
        records = [r for r in _json_lines(out / "rollouts.jsonl") if r.get("group") in groups]
        traces = _json_lines(out / "trace.jsonl")
        by_id = {str(r["rollout_id"]): r for r in records}
        prev = self.previous
        prev.groups = {name: {k: g[k] for k in ("n", "mean", "std", "masked", "complete") if k in g}
                       for name, g in groups.items()}
        for t in traces:
            try:
                result = _result_from(t, by_id.get(str(t["rollout_id"])))
            except (KeyError, TypeError, ValueError) as e:
                raise ConfigError(f"--resume: a malformed line in {out / 'trace.jsonl'}: {e}") from None
            if result.group in groups:
                result.final = result.rollout_id in by_id  # rollouts.jsonl holds final attempts only
            else:  # a group the killed run did not finish: runs again whole, numbered after this
                result.final = t["final"] = False
                t["superseded"] = "resume"
                key = (result.group, result.sample)
                self.superseded[key] = max(self.superseded.get(key, 0), result.attempt)
            prev.attempts.append(result)
            if result.final:
                prev.results.append(result)
        try:
            prev.wall_s = float(json.loads((out / "summary.json").read_text()).get("wall_s") or 0)
        except (OSError, ValueError, AttributeError):
            prev.wall_s = 0.0
        # Rewrite the files with only what is kept (whole lines of finished groups).
        write_atomic(out / "groups.jsonl", "".join(json.dumps(g) + "\n" for g in groups.values()))
        write_atomic(out / "rollouts.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        write_atomic(out / "trace.jsonl", "".join(json.dumps(t) + "\n" for t in traces))
        if (out / "records.jsonl").exists():  # the records of finished groups' final attempts
            kept = [r for r in _json_lines(out / "records.jsonl") if r.get("rollout_id") in by_id]
            write_atomic(out / "records.jsonl", "".join(json.dumps(r) + "\n" for r in kept))

    def _append(self, name: str, items: Sequence[dict[str, Any]]) -> None:
        f = self.files.get(name)
        if f is not None:
            f.write("".join(json.dumps(i) + "\n" for i in items))
            f.flush()

    def attempt(self, r: RolloutResult) -> None:
        base = self.superseded.get((r.group, r.sample), 0)
        if base:  # after the superseded attempts of a resumed run: never two rows of one attempt
            r.attempt += base
            r.rollout_id = f"{r.group}#{r.sample}~{r.attempt}"
            if r.tree:  # a tree's leaf: its tree renumbered with it
                r.tree["tree_id"] = r.rollout_id
                r.rollout_id += f"/{r.tree['node_id']}"
        self._append("trace.jsonl", [r.to_trace()])

    def rollout(self, r: RolloutResult) -> None:
        self._append("rollouts.jsonl", [r.to_record()])
        if r.record is not None:
            r.record["rollout_id"] = r.rollout_id  # renumbered after a resumed run's attempts
            self._append("records.jsonl", [r.record])

    def group(self, name: str, stats: dict[str, Any], results: Sequence[RolloutResult],
              extra: dict[str, Any] | None = None) -> None:
        advantages = {r.rollout_id: r.advantage for r in results}
        self._append("groups.jsonl", [{"group": name, **stats, "n_rollouts": len(results),
                                       "advantages": advantages, **(extra or {})}])

    def summary(self, summary: dict[str, Any]) -> None:
        if self.out is not None:
            write_atomic(self.out / "summary.json", json.dumps(summary, indent=2) + "\n")

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()


def image_failure(
    task: Task, policy: Policy, cfg: RunConfig, sample: int, error: BaseException
) -> RolloutResult:
    """The result of a rollout whose group failed before any member started (the image could
    not be built, or the forked group's prepare step failed): no sandbox, no time."""
    rec = SpanRecorder()
    end = rec.finish()
    result = RolloutResult(
        rollout_id=f"{task.name}#{sample}", task=task.name, group=task.name, sample=sample,
        agent=policy.name, backend=cfg.backend, start=rec.start, end=end, status="failed",
        spans=rec.spans, run_id=cfg.run_id, reason=failure_reason(error), error=str(error),
        info={"phase": "start"},
    )  # fmt: skip
    settle(result, error)
    return result


async def run_suite(
    tasks: Sequence[Task],
    policy: Policy,
    config: RunConfig | None = None,
    *,
    out_dir: Path | None = None,
    image_for: ImageFor = default_image_for,
    on_result: Callable[[RolloutResult], None] | None = None,
    slots: Slots | None = None,
    out_mode: str = "new",
    samples: Sequence[int] | None = None,
) -> RunReport:
    """Run ``config.n`` rollouts of every task; returns when all are done (or cancelled).

    ``out_mode`` says what to do with an ``out_dir`` that is not empty: "new" refuses it
    (ConfigError), "resume" keeps the groups it finished and runs the others whole,
    "overwrite" replaces it. ``slots`` shares one concurrency limit between runs (default:
    ``config.concurrency``); with group admission it must hold a whole group. ``samples``
    runs only these members of each group (a refill of the members a lost node did not
    finish: :mod:`sandfleet.cluster.groups`); default all ``config.n``."""
    cfg = config or RunConfig()
    members_of = list(range(cfg.n)) if samples is None else sorted(set(samples))
    if not members_of or not all(0 <= i < cfg.n for i in members_of):
        raise ConfigError(f"samples must be distinct members 0..{cfg.n - 1} of the group, not {samples!r}")
    slots = slots or Slots(cfg.concurrency)
    plan = cfg.plan
    leaves = plan.leaves if plan else 1
    if plan is not None:
        check_policy(policy)
    if cfg.admission == "group" and slots.capacity < cfg.n * leaves:
        raise ConfigError(group_too_big(cfg.n * leaves, slots.capacity))
    writer = _Writer(out_dir, cfg, out_mode)
    prev = writer.previous
    attempts: list[RolloutResult] = list(prev.attempts)
    finals: list[RolloutResult] = list(prev.results)
    groups: dict[str, dict[str, Any]] = dict(prev.groups)
    builds = asyncio.Semaphore(2)
    snapshot_errors: list[str] = []

    def record(r: RolloutResult) -> None:
        attempts.append(r)
        writer.attempt(r)
        if on_result is not None:
            on_result(r)

    def failed(task: Task, error: BaseException) -> list[RolloutResult]:
        results = [image_failure(task, policy, cfg, i, error) for i in members_of]
        for r in results:
            record(r)
            finals.append(r)
            writer.rollout(r)
        return results

    async def one(req: RolloutRequest, admission: Admission | None) -> RolloutResult:
        try:
            if admission is None:  # per-rollout admission
                async with slots.admit(1):
                    result = await run_with_retries(req, cfg.retry, record)
            else:
                result = await run_with_retries(req, cfg.retry, record)
        finally:
            if admission is not None:
                admission.release_one()  # a member gives its slot back as it ends
        finals.append(result)
        writer.rollout(result)
        return result

    async def tree(req: RolloutRequest, plan: BranchPlan, admission: Admission | None) -> list[RolloutResult]:
        released = 0

        def leaf_ended(r: RolloutResult) -> None:  # a leaf gives its slot back as it ends
            nonlocal released
            record(r)
            if admission is not None and r.final and released < plan.leaves:
                admission.release_one()
                released += 1

        try:
            if admission is None:  # per-rollout admission: a tree holds its leaves' slots
                async with slots.admit(plan.leaves):
                    leaves = await run_tree_with_retries(req, plan, cfg.retry, processes=cfg.branch_processes,
                                                         on_result=record)
            else:
                leaves = await run_tree_with_retries(req, plan, cfg.retry, processes=cfg.branch_processes,
                                                     on_result=leaf_ended)
        finally:
            if admission is not None:  # the slots of leaves the tree never grew (it stopped early)
                for _ in range(plan.leaves - released):
                    admission.release_one()
        for leaf in leaves:
            finals.append(leaf)
            writer.rollout(leaf)
        return leaves

    async def prepare(task: Task, spec: SandboxSpec, admission: Admission | None) -> Prepared:
        if admission is None:
            async with slots.admit(1):
                return await prepared_snapshot(task, spec)
        return await prepared_snapshot(task, spec)

    async def members(task: Task, spec: SandboxSpec, admission: Admission | None,
                      info: dict[str, Any]) -> list[RolloutResult]:
        info["admitted"] = now()
        prepared: Prepared | None = None
        try:
            if cfg.fork and task.prepare is not None:
                try:
                    prepared = await prepare(task, spec, admission)
                except Exception as e:
                    info["prepare"] = {"mode": "fork", "error": str(e)}
                    return failed(task, e)
                info["prepare"] = {"mode": "fork", "seconds": prepared.seconds, "sandbox_id": prepared.sandbox_id,
                                   "snapshot": prepared.snapshot.id}
                if prepared.close_error:
                    snapshot_errors.append(prepared.sandbox_id)
            else:
                info["prepare"] = {"mode": "each" if task.prepare is not None else "none"}
            reqs = [
                RolloutRequest(task=task, policy=policy, spec=spec, sample=i, run_id=cfg.run_id,
                               snapshot=prepared.snapshot if prepared else None, verify=cfg.verify,
                               record=cfg.record)
                for i in members_of
            ]
            if plan is not None:
                trees = await asyncio.gather(*(tree(r, plan, admission) for r in reqs))
                return [leaf for leaves in trees for leaf in leaves]
            return list(await asyncio.gather(*(one(r, admission) for r in reqs)))
        finally:
            if prepared is not None and await delete_snapshot(prepared.snapshot) is not None:
                snapshot_errors.append(prepared.snapshot.id)

    async def group(task: Task) -> None:
        results: list[RolloutResult] = []
        info: dict[str, Any] = {}
        try:
            async with builds:
                image = await image_for(task)
            spec = task_spec(task, image, cfg.backend, network=cfg.network, agent_user=cfg.agent_user,
                             seccomp_allow=cfg.seccomp_allow)
        except Exception as e:
            results = failed(task, e)
        else:
            if cfg.admission == "group":
                async with slots.admit(len(members_of) * leaves) as admission:  # the whole group, never part of it
                    results = await members(task, spec, admission, info)
            else:
                results = await members(task, spec, None, info)
        stats = group_advantages(results)
        if plan is not None:  # node values per tree; each leaf's per-turn tree advantages
            info["trees"] = tree_advantages(results, plan)
            info["tree_advantages"] = {r.rollout_id: r.tree_advantages for r in results}
        groups[task.name] = stats
        info["end"] = max((r.end for r in results), default=None)  # its slowest final attempt's end
        info["attempts"] = sum(r.attempt for r in results)
        writer.group(task.name, stats, results, info)

    return await run_groups(tasks, group, writer, finals, lambda wall_s, interrupted: RunReport(
        cfg, finals, attempts, groups, wall_s, interrupted=interrupted, resumed=len(prev.results),
        snapshot_errors=len(snapshot_errors)))


R = TypeVar("R", bound=RunReport)


async def run_groups(tasks: Sequence[Task], group: Callable[[Task], Coroutine[Any, Any, None]], writer: _Writer,
                     finals: list[RolloutResult], report: Callable[[float, bool], R]) -> R:
    """Run ``group`` for every task whose group the writer's previous run did not finish, all
    at once. However that ends (done, failed, cancelled), put the final results in task
    order, build the report from the wall time (the previous run's included) and whether it
    was interrupted, and write its summary: an interrupted run keeps what is done so far."""
    prev = writer.previous
    t0 = time.perf_counter()
    interrupted = True
    try:
        async with asyncio.TaskGroup() as tg:
            for task in tasks:
                if task.name not in prev.groups:
                    tg.create_task(group(task), name=f"group-{task.name}")
        interrupted = False
    finally:
        writer.close()
        order = {t.name: i for i, t in enumerate(tasks)}
        finals.sort(key=lambda r: (order.get(r.task, 0), r.sample, str((r.tree or {}).get("node_id", ""))))
        done = report(prev.wall_s + time.perf_counter() - t0, interrupted)
        writer.summary(done.summary())
    return done
