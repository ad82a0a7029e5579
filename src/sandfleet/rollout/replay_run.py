"""Replaying a run directory's records (``sandfleet replay``): check every record, replay the
ones that pass in fresh sandboxes, compare, and sum up (docs/replay.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from sandfleet.errors import ConfigError
from sandfleet.rollout import fusion_record
from sandfleet.rollout.admission import choose_concurrency
from sandfleet.rollout.normalize import DEFAULT
from sandfleet.rollout.record import read_records
from sandfleet.rollout.replay import Check, ReplayPolicy, check_record, compare
from sandfleet.rollout.runner import RetryPolicy, RolloutRequest, run_with_retries
from sandfleet.sandbox import backend_in_use, use_backend
from sandfleet.sandbox.base import Sandbox, Snapshot
from sandfleet.sandbox.spec import SandboxSpec

KEEP_TTL_S = 600.0
"""How long a replay's kept sandbox lives by default (``--stop-before verifier``, ``--until-turn``)."""


@dataclass
class ReplayReport:
    """Every record's check and replays."""

    run_dir: Path
    rollouts: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    """The replays' own records (written to ``--out``)."""
    wall_s: float = 0.0
    original_wall_s: float | None = None
    normalizers: tuple[str, ...] = DEFAULT
    repeat: int = 1
    until_turn: int | None = None
    where: dict[str, Any] = field(default_factory=dict)
    """Where the replays ran: ``backend`` (when not the recorded one), ``remote`` (a service's URL),
    ``keep_ttl_s`` (sandboxes left alive)."""

    def summary(self) -> dict[str, Any]:
        rows = self.rollouts
        out: dict[str, Any] = {
            "rollouts": len(rows), "same_reward": sum(r["same_reward"] for r in rows),
            "identical": sum(r["status"] == "identical" for r in rows),
            "drifted": sum(r["status"] == "drifted" for r in rows),
            "diverged": sum(r["status"] == "diverged" for r in rows),
            "refused": len(self.refused), "tampered": sum(bool(r.get("tampered")) for r in rows),
            "wall_s": round(self.wall_s, 3), "original_wall_s": self.original_wall_s,
            "normalizers": list(self.normalizers),
            **({"until_turn": self.until_turn} if self.until_turn is not None else {}),
            **self.where,
        }  # fmt: skip
        if self.repeat > 1:
            replays = sum(len(r["replays"]) for r in rows)
            flips = sum(r["reward_flips"] for r in rows)
            out.update(repeat=self.repeat, reward_flip_rate=flips / replays if replays else 0.0)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary(), "rollouts": self.rollouts, "refused": self.refused}


async def replay_run(
    run_dir: Path, *, rollout_ids: Sequence[str] = (), backend: str | None = None,
    normalizers: Sequence[str] = DEFAULT, repeat: int = 1, concurrency: int | None = None,
    tasks_dir: Path | None = None, until_turn: int | None = None, stop_before_verifier: bool = False,
    on_checked: Callable[[str], None] | None = None, keep: bool = False, keep_ttl_s: float = KEEP_TTL_S,
    journal_dir: Path | None = None, resume: bool = False,
) -> ReplayReport:
    """Replay the records of ``run_dir`` (those of ``rollout_ids``, default all), each ``repeat``
    times, at most ``concurrency`` at once (None: as many sandboxes as this host's CPUs hold at
    the tasks' cpus, as ``sandfleet run`` admits them); on ``backend`` (default: the recorded one);
    ``until_turn``: each policy stops before turn ``until_turn + 1`` (the verifier still runs);
    ``stop_before_verifier``: no verifier runs (the commands are compared, the reward is not).
    ``on_checked`` hears, before any sandbox starts, each refusal and each edited item found.
    ``keep``: each replay's sandbox is left alive for ``keep_ttl_s`` seconds (from its start)
    instead of closed: made by a holder process here (``sandfleet sandbox ls/exec/rm``), or on
    the service in force (:func:`sandfleet.client.remote.remote`: ``sandbox ls --remote``).
    Inside ``remote(...)`` the sandboxes run on that service, and each record's image is checked
    there (the service builds the task's image and its digest must be the recorded one).
    ``journal_dir``: each rollout's replays go to ``journal_dir/replays.jsonl`` as they end (one
    line, flushed: a killed replay loses only those in flight); ``resume``: the rollouts that
    journal holds are taken from it, not replayed again (its options must be these)."""
    path = run_dir / "records.jsonl"
    if not path.exists():
        raise ConfigError(f"{run_dir} holds no records.jsonl (run with --record commands or full)")
    records = read_records(path)
    if rollout_ids:
        missing = set(rollout_ids) - {str(r.get("rollout_id")) for r in records}
        if missing:
            raise ConfigError(f"no record of rollout {', '.join(sorted(missing))} in {path}")
        records = [r for r in records if r.get("rollout_id") in rollout_ids]
    report = ReplayReport(run_dir, normalizers=tuple(normalizers), repeat=repeat, until_turn=until_turn)
    report.original_wall_s = _original_wall_s(run_dir, records)
    service = backend_in_use()
    if backend:
        report.where["backend"] = backend
    if service is not None:
        report.where["remote"] = str(getattr(service, "url", service.name))
    if keep:
        report.where["keep_ttl_s"] = keep_ttl_s
    if service is None:
        from sandfleet.rollout.record import environment

        here = str(environment().get("host", {}).get("hostname"))
        hosts = sorted({str(((r.get("environment") or {}).get("host") or {}).get("hostname")) for r in records})
        if hosts and hosts != [here]:
            report.where["host"] = {"recorded": hosts, "replayed": here}
    # all before anything runs; on a service, the image where the sandboxes run
    checks = [(rec, _check(rec, tasks_dir, service is None, until_turn is not None or stop_before_verifier or keep))
              for rec in records]  # fmt: skip
    if service is not None:
        await _check_images_on(service, checks)
    for rec, check in checks:
        if check.refused:
            report.refused.append({"rollout_id": rec.get("rollout_id"), "task": rec.get("task"),
                                   "why": check.refused, "tampered": check.tampered})
        if on_checked is not None:
            for why in check.refused:
                on_checked(f"refused {rec.get('rollout_id')}: {why}")
            for what in check.tampered if not check.refused else ():
                on_checked(f"tampered {rec.get('rollout_id')}: {what}")
    if concurrency is None:
        cpus = [float((r.get("spec") or {}).get("limits", {}).get("cpus") or 1.0) for r in records]
        concurrency = choose_concurrency(None, cpus)[0]
    slots = asyncio.Semaphore(max(1, concurrency))
    done: dict[str, dict[str, Any]] = {}
    journal = None
    if journal_dir is not None:
        options = {"run_dir": str(run_dir.resolve()), "rollouts": sorted(rollout_ids), "backend": backend,
                   "normalizers": list(normalizers), "repeat": repeat, "until_turn": until_turn,
                   "stop_before_verifier": stop_before_verifier, "keep": keep,
                   "remote": report.where.get("remote")}
        journal = _open_journal(journal_dir / JOURNAL, options, resume, done)
        if resume:
            report.where["resumed"] = len(done)
    t0 = time.perf_counter()

    async def one(rec: dict[str, Any], check: Check) -> dict[str, Any]:
        replays = []
        for k in range(repeat):
            async with slots:
                replays.append(await _replay_once(rec, check, backend, normalizers, k, until_turn,
                                                  stop_before_verifier, keep_ttl_s if keep else None))
        first = dict(replays[0])
        recorded = first["reward"]["recorded"]
        first["tampered"] = check.tampered
        first["replays"] = [{"status": r["status"], "reward": r["reward"]["replayed"], "seconds": r["seconds"]}
                            for r in replays]
        first["reward_flips"] = sum(r["reward"]["replayed"] != recorded for r in replays)
        first.pop("_records", None)
        first["_records"] = [x for r in replays for x in r.get("_records") or []]
        if journal is not None:
            journal.write(json.dumps(first, default=str) + "\n")
            journal.flush()
        return first

    todo = [(rec, check) for rec, check in checks if not check.refused and str(rec.get("rollout_id")) not in done]
    try:
        new = await asyncio.gather(*(one(rec, check) for rec, check in todo))
    finally:
        if journal is not None:
            journal.close()
    report.wall_s = time.perf_counter() - t0
    rows = {str(r["rollout_id"]): r for r in [*done.values(), *new]}
    for rec, check in checks:  # in the records' order, each rollout once
        row = rows.get(str(rec.get("rollout_id")))
        if row is None or check.refused:
            continue
        report.records.extend(row.pop("_records", None) or [])
        report.rollouts.append(row)
    return report


def _check(rec: dict[str, Any], tasks_dir: Path | None, local_image: bool, stops: bool) -> Check:
    """A record's check: a rollout's (:func:`check_record`), or a SandboxFusion call's
    (verl's route: rollout/fusion_record.py), which has no turns and no verifier to stop at."""
    if not fusion_record.is_fusion(rec):
        return check_record(rec, tasks_dir, local_image=local_image)
    found = Check(tampered=fusion_record.tampered(rec))
    found.refused = fusion_record.check(rec, local_image=local_image)
    if stops:
        found.refused.append("a SandboxFusion run_code call has no agent turns and no verifier: --until-turn, "
                             "--stop-before and --keep do not apply to it")
    return found


JOURNAL = "replays.jsonl"
"""Each replayed rollout's row (and its replays' records, ``_records``), a line as it ends."""


def _open_journal(path: Path, options: dict[str, Any], resume: bool, done: dict[str, dict[str, Any]]) -> Any:
    """The journal, opened to append; on ``resume``, the rows it holds go to ``done`` (a torn
    last line is dropped: that rollout runs again) after its options are checked against these."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if resume and path.exists():
        lines = path.read_text().splitlines()
        head: dict[str, Any] = {}
        with contextlib.suppress(ValueError, IndexError):
            head = json.loads(lines[0])
        if head.get("replay_journal") != 1:
            raise ConfigError(f"{path} is not a replay's journal: can't resume from it")
        old = head.get("options") or {}
        differ = [k for k in options if old.get(k) != options[k]]
        if differ:
            k = differ[0]
            raise ConfigError(f"--resume: {path} was written with {k} {old.get(k)!r}, not {options[k]!r} "
                              "(resume with the same options, or replay into another --out)")
        good = 1
        for i, line in enumerate(lines[1:], start=1):
            try:
                row = json.loads(line)
            except ValueError:  # torn by a kill: dropped, and the file cut there
                break
            done[str(row["rollout_id"])] = row
            good = i + 1
        if good < len(lines):
            path.write_text("".join(x + "\n" for x in lines[:good]))
        return path.open("a")
    f = path.open("w")
    f.write(json.dumps({"replay_journal": 1, "options": options}) + "\n")
    f.flush()
    return f


async def _check_images_on(service: Any, checks: list[tuple[dict[str, Any], Check]]) -> None:
    """Refuse the records whose image, as the service builds it for their task, is not the
    recorded one (a task on the host image runs on the service's host image: not compared)."""
    from sandfleet.tasks.images import ensure_task_image, remote_builder

    builder = remote_builder()
    for rec, check in checks:
        image = rec.get("image") or {}
        if check.task is None or builder is None or image.get("ref") == "host":
            continue
        try:
            there = await ensure_task_image(check.task, builder=builder)
        except Exception as e:
            check.refused.append(f"image of task {check.task.name} can't be had on the service: {e}")
            check.task = None
            continue
        if there != image.get("digest"):
            check.refused.append(f"image {image.get('ref')} is {there} on the service, recorded {image.get('digest')}")
            check.task = None


class _Kept:
    """A replay's sandbox that its rollout's close leaves alive (to its holder or its service)."""

    def __init__(self, sandbox: Sandbox):
        self._sandbox = sandbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sandbox, name)

    async def close(self) -> None:
        release = getattr(self._sandbox, "release", None)
        if release is not None:  # a held sandbox: its holder keeps it
            release()
        # a service's sandbox: left there, its TTL running


class _Keeping:
    """A Backend that makes each sandbox where ``inner`` makes it, and leaves it alive at close."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name = str(getattr(inner, "name", "keeping"))

    async def create(self, spec: SandboxSpec) -> Sandbox:
        sandbox = await self.inner.create(spec)
        kept: Sandbox = _Kept(sandbox)
        return kept

    async def fork(self, snapshot: Snapshot, n: int) -> list[Sandbox]:
        return [_Kept(sb) for sb in await self.inner.fork(snapshot, n)]


async def _replay_once(rec: dict[str, Any], check: Check, backend: str | None, normalizers: Sequence[str],
                       k: int, until_turn: int | None = None, stop_before_verifier: bool = False,
                       keep_ttl_s: float | None = None) -> dict[str, Any]:
    if fusion_record.is_fusion(rec):  # a SandboxFusion call (verl): its program run again
        row, again = await fusion_record.replay(rec, backend=backend, normalizers=normalizers)
        row["_records"] = [again]
        if k:
            row["repeat"] = k
        return row
    assert check.task is not None
    keep = keep_ttl_s is not None
    policy = ReplayPolicy(rec, normalizers, until_turn, stop_before_verifier or keep)
    spec_data = dict(rec["spec"])
    if backend:
        spec_data["backend"] = backend
    if keep:
        spec_data["limits"] = {**(spec_data.get("limits") or {}), "ttl_s": keep_ttl_s}
    spec = SandboxSpec.model_validate(spec_data)
    req = RolloutRequest(task=check.task, policy=policy, spec=spec, sample=int(rec.get("sample") or 0),
                         run_id=f"replay-{rec.get('run_id', '')}", rollout_id=str(rec.get("rollout_id")),
                         verify=str(rec.get("verify") or "shared"), record=str(rec.get("mode") or "commands"))
    service = backend_in_use()
    where: Any = nullcontext()
    if keep:
        from sandfleet.sandbox.held import HeldBackend

        where = use_backend(_Keeping(service if service is not None else HeldBackend()))
    with where:
        result = await run_with_retries(req, RetryPolicy(max_attempts=1))
    diverged = policy.state.diverged
    stopped = result.reason == "replay_stopped_before_verifier"
    reward = result.reward if diverged is None and not stopped else None
    row = compare(rec, result.record, reward, diverged, normalizers, until_turn=until_turn, scored=not stopped)
    if stopped:
        row["scored"] = False  # no verifier ran: the reward is not compared
    row["seconds"] = {"recorded": (rec.get("result") or {}).get("duration_s"), "replayed": round(result.duration, 4)}
    if result.status != "completed" and diverged is None and not stopped:
        row["status"] = "drifted"
        row["failed"] = {"reason": result.reason, "error": result.error}
    if keep and result.sandbox_id:
        row["kept"] = {"sandbox_id": result.sandbox_id, "ttl_s": keep_ttl_s,
                       "remote": str(getattr(service, "url", "")) or None}
    if result.backend != rec.get("backend"):
        row["backend"] = {"recorded": rec.get("backend"), "replayed": result.backend}
    row["_records"] = [result.record] if result.record is not None else []
    if k:
        row["repeat"] = k
    return row


def _original_wall_s(run_dir: Path, records: list[dict[str, Any]]) -> float | None:
    """The original run's wall time when all its rollouts are replayed, else the sum of the
    replayed rollouts' durations (None if unknown)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        if summary.get("n_rollouts") == len(records):
            return float(summary["wall_s"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    total = [float((r.get("result") or {}).get("duration_s") or 0) for r in records]
    return round(sum(total), 3) if total else None


def write_out(report: ReplayReport, out: Path, text: str) -> None:
    """``--out``: replay.json, report.txt, report.html and the replays' own records.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    (out / "report.txt").write_text(text + "\n")
    (out / "report.html").write_text(report_html(report))
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in report.records))


def report_text(report: ReplayReport) -> str:
    """The report a person reads: per rollout, per command, then the summary."""
    lines = [f"replay of {report.run_dir} (normalizers: {', '.join(report.normalizers) or 'none'})"]
    w = report.where
    if w.get("remote"):
        lines.append(f"on the service at {w['remote']}")
    if w.get("host"):
        lines.append(f"on host {w['host']['replayed']}, recorded on {', '.join(w['host']['recorded'])}")
    for r in report.refused:
        lines.append(f"REFUSED {r['rollout_id']}:")
        lines += [f"  {why}" for why in r["why"]]
    for row in report.rollouts:
        rw = row["reward"]
        same = "same reward" if row["same_reward"] else "reward differs"
        if row.get("scored") is False:
            same = "not scored"
        lines.append(f"{row['rollout_id']}: {row['status']}, {same} ({rw['recorded']} -> {rw['replayed']}), "
                     f"{row['commands_identical']}/{row['commands']} commands identical")
        for t in row.get("tampered") or []:
            lines.append(f"  tampered: {t}")
        if row.get("diverged_at"):
            d = row["diverged_at"]
            lines.append(f"  diverged at turn {d['turn']}: {d['what']}")
        if row.get("failed"):
            lines.append(f"  replay failed: {row['failed']['reason']}: {row['failed']['error']}")
        if row.get("backend"):
            lines.append(f"  replayed on {row['backend']['replayed']}, recorded on {row['backend']['recorded']}")
        if row.get("kept"):
            lines.append("  " + kept_line(row["kept"]))
        for c in row["command_rows"]:
            lines.append("  " + _command_line(c))
        if row.get("verifier"):
            v = row["verifier"]
            code = "same exit code" if v["exit_code"] == "same" else \
                f"exit code {v['exit_code']['recorded']} -> {v['exit_code']['replayed']}"
            o = v["output"]
            out = o if isinstance(o, str) else \
                f"differs at line {o['line']}: recorded {o['recorded']!r}, replayed {o['replayed']!r}"
            lines.append(f"  verifier: {code}, output {out}")
        if report.repeat > 1:
            lines.append(f"  {report.repeat} replays: rewards {[x['reward'] for x in row['replays']]}, "
                         f"{row['reward_flips']} flipped")
    s = report.summary()
    lines.append(f"summary: {s['rollouts']} replayed: {s['identical']} identical, {s['drifted']} drifted, "
                 f"{s['diverged']} diverged; same reward {s['same_reward']}/{s['rollouts']}; "
                 f"{s['refused']} refused, {s['tampered']} tampered")
    if report.repeat > 1:
        lines.append(f"reward flip rate over {report.repeat} replays each: {s['reward_flip_rate']:.1%}")
    orig = f" (the original: {report.original_wall_s:.2f} s)" if report.original_wall_s else ""
    lines.append(f"replay took {report.wall_s:.2f} s{orig}")
    return "\n".join(lines)


_CSS = ("body{font:14px sans-serif;margin:2em}table{border-collapse:collapse;margin:.5em 0 1.5em}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}"
        ".identical{background:#e6f4e6}.drifted{background:#fff4d6}.diverged,.refused{background:#fde2e2}"
        "code{font-size:12px;white-space:pre-wrap}")


def report_html(report: ReplayReport) -> str:
    """The report as one self-contained HTML page: the summary, refused records, and per
    rollout its status and a table of its commands."""
    s = report.summary()
    parts = [f"<!doctype html><meta charset=utf-8><title>replay of {escape(str(report.run_dir))}</title>",
             f"<style>{_CSS}</style><h1>Replay of <code>{escape(str(report.run_dir))}</code></h1>",
             "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in s.items())
             + "</table>"]
    if report.refused:
        parts.append("<h2>Refused</h2><table>")
        for r in report.refused:
            parts.append(f"<tr class=refused><td>{escape(str(r['rollout_id']))}</td><td>"
                         + "<br>".join(escape(w) for w in r["why"]) + "</td></tr>")
        parts.append("</table>")
    for row in report.rollouts:
        rw = row["reward"]
        parts.append(f"<h2 class={row['status']}>{escape(str(row['rollout_id']))}: {row['status']}</h2>"
                     f"<p>reward {rw['recorded']} &rarr; {rw['replayed']} "
                     f"({'same' if row['same_reward'] else 'differs'}); "
                     f"{row['commands_identical']}/{row['commands']} commands identical</p>")
        notes = [f"tampered: {t}" for t in row.get("tampered") or []]
        if row.get("diverged_at"):
            notes.append(f"diverged at turn {row['diverged_at']['turn']}: {row['diverged_at']['what']}")
        parts += [f"<p class=diverged>{escape(n)}</p>" for n in notes]
        if row.get("backend"):
            parts.append(f"<p>replayed on {escape(str(row['backend']['replayed']))}, "
                         f"recorded on {escape(str(row['backend']['recorded']))}</p>")
        if row.get("kept"):
            parts.append(f"<p><code>{escape(kept_line(row['kept']))}</code></p>")
        parts.append("<table><tr><th>#</th><th>turn</th><th>command</th><th>exit code</th><th>output</th></tr>")
        for c in row["command_rows"]:
            cells = _command_line(c).split(": ", 1)[-1]
            parts.append(f"<tr><td>{c['i'] + 1}</td><td>{c['turn']}</td><td><code>{escape(c['command'])}</code></td>"
                         f"<td colspan=2>{escape(cells)}</td></tr>")
        parts.append("</table>")
    return "\n".join(parts) + "\n"


def kept_line(kept: dict[str, Any]) -> str:
    """Where a kept sandbox is, and how to reach it."""
    sid, remote = kept["sandbox_id"], kept.get("remote")
    on = f" --remote {remote}" if remote else ""
    return (f"sandbox {sid} left alive for {kept['ttl_s']:g} s from its start: "
            f"sandfleet sandbox exec{on} {sid} -- bash -lc '...'; sandfleet sandbox rm{on} {sid}")


def _command_line(c: dict[str, Any]) -> str:
    head = f"cmd {c['i'] + 1} (turn {c['turn']}) `{c['command'][:60]}`: "
    if c.get("ran") is False:
        return head + "not run"
    parts = []
    ec = c["exit_code"]
    parts.append("same exit code" if ec == "same" else f"exit code {ec['recorded']} -> {ec['replayed']}")
    out = c["output"]
    if isinstance(out, str):
        parts.append(f"output {out}")
    else:
        parts.append(f"output differs at line {out['line']}: recorded {out['recorded']!r}, "
                     f"replayed {out['replayed']!r}")
    return head + ", ".join(parts)
