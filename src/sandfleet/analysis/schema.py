"""The analysis report as one typed object, :class:`Report` (schema ``sandfleet.analysis/1``).

:func:`sandfleet.analysis.report.build_report` makes it; every renderer reads it and nothing
else: the JSON (:meth:`Report.to_json`, what ``sandfleet analyze --json`` prints), the text
tables (:mod:`sandfleet.analysis.text`) and the HTML report (:mod:`sandfleet.analysis.html`).
So the three show the same numbers, and the JSON holds every number the other two show:
``Report.from_json(report.to_json())`` renders the same text and HTML.

Each model mirrors its JSON object, field for field and in the same order; figures keyed by
run are ``dict``\\ s from the run's label (``A``, and ``B`` when two runs are compared) to the
figure. A figure that can't be computed (no rollouts of its kind, a zero denominator) is
None (``null``). With one run, ``compare``, the what-if's ``B`` and ``gap`` and the
staleness comparison are left out of the JSON. Every figure is defined in
``docs/figures.md``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "sandfleet.analysis/1"
LABELS = ("A", "B")

Num = float | None
"""A figure: seconds, a fraction or a count; None (``null``) when it can't be computed."""
PerRun = dict[str, Num]
"""A figure per run label."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class SpanStats(_Model):
    """One span's seconds per completed rollout."""

    mean: Num
    median: Num
    p90: Num


class Verdicts(_Model):
    """Final attempts by verdict."""

    scored: int
    policy_fault: int
    infra_fault: int


class PhaseContention(_Model):
    """One phase's contention over the final attempts that measured it (docs/rollouts.md)."""

    measured: int
    """Final attempts that measured this phase."""
    outside_share_mean: Num
    outside_share_p95: Num
    outside_wait_s_mean: Num
    throttled_s_mean: Num
    """The sandbox's own CPU limit's throttling."""
    run_delay_s_mean: Num
    cpu_s_mean: Num


class Contention(_Model):
    """Contention of the agent and verifier phases, and the attempts masked for it."""

    agent: PhaseContention
    verifier: PhaseContention
    host_contention: int
    """Final attempts masked as ``host_contention``."""
    host_contention_rate: Num
    """Of all final attempts."""


class RunSummary(_Model):
    """One run: rollouts per status (every attempt), and the verdicts of final attempts."""

    name: str
    path: str
    rollouts: int
    completed: int
    failed: int
    cancelled: int
    verdicts: Verdicts
    mask_rate: Num
    """infra_fault final attempts / final attempts."""
    pass_rate: Num
    """Reward >= 1 over scored and policy-fault final attempts."""
    refilled: int
    """Masked attempts that were run again."""
    contention: Contention
    model_time_known: bool
    """False for a trace converted from another system (model time is in agent_command)."""


class Provenance(_Model):
    """Where and from what: the analysing host and options, and each run's ``run.json``'s."""

    analysis: dict[str, Any]
    runs: dict[str, Any]
    """Label to the ``provenance`` its ``run.json`` recorded (None without one)."""


class SpanDelta(_Model):
    """B - A of one span, over the same tasks (mean of per-task means)."""

    a: Num
    b: Num
    delta_s: Num
    delta_s_ci90: tuple[float, float] | None
    delta_pct: Num
    delta_pct_ci90: tuple[float, float] | None


class Compare(_Model):
    """Two runs on the same tasks."""

    tasks: int
    """Tasks with a completed rollout in both runs."""
    tasks_left_out: list[str]
    """Tasks without a completed rollout in one run."""
    ci_level: float
    spans: dict[str, SpanDelta]
    """Span (and ``total``) to its delta."""


class WhatIfPoint(_Model):
    """Mean rollout seconds of each run at one inference speed-up k, and their gap."""

    A: Num
    B: Num = None
    gap: Num = None
    """(B - A) / A; two runs only."""


class StalenessDistribution(_Model):
    """Weight versions behind at the trainer step time, over completed rollouts."""

    p50: Num
    p90: Num
    max: Num
    histogram: dict[str, int]
    """Versions (floor) to rollouts."""


class Staleness(_Model):
    """The staleness bound, the step time it allows per run and the distribution per run."""

    bound_versions: float
    quantile: float
    step_time_s: Num
    step_time_given: bool
    """False: ``step_time_s`` is the step time run A's bound allows."""
    allowed_step_time_s: PerRun
    distribution: dict[str, StalenessDistribution]
    training_faster_pct: Num = None
    """Two runs only: how much faster training can step with the faster run."""
    faster_run: str | None = None


class WorkSaved(_Model):
    """A --branch run's work against independent rollouts to the same leaves, per measure."""

    trees: int
    leaves: int
    ran: dict[str, float]
    independent: dict[str, float]
    saved: dict[str, float]
    saved_fraction: dict[str, float | None]
    branches: int
    branch_s: float


class TreeNode(_Model):
    """One node of a tree: its own commands and work, the leaves under it; a leaf's reward."""

    commands: list[str]
    work: dict[str, float]
    leaves: int
    reward: float | None
    verdict: str | None
    rollout_id: str | None


class TreeFigures(_Model):
    """The trees of a --branch run: work saved, and tree id to node id to node."""

    work_saved: WorkSaved
    trees: dict[str, dict[str, TreeNode]]


class Report(_Model):
    """Every figure of one run, or of two runs A and B on the same tasks."""

    schema_: str = Field(SCHEMA, alias="schema")
    gap_definition: str
    provenance: Provenance
    runs: dict[str, RunSummary]
    spans: dict[str, dict[str, SpanStats]]
    """Label to span (and ``total``) to its statistics."""
    spans_mean_s: dict[str, PerRun]
    """Label to span (and ``total``) to its mean (the ``mean`` of ``spans``)."""
    platform_overhead_s: PerRun
    platform_overhead_fraction: PerRun
    raw_bwrap_true_ms: PerRun
    """A bare ``bwrap true`` timed when the run started (None when not recorded)."""
    compare: Compare | None = None
    whatif_not_applicable: str | None
    """Why the what-if does not apply (then ``whatif`` and ``whatif_detail`` are None)."""
    whatif: PerRun | None
    """k to the gap (two runs) or to run A's mean rollout seconds (one run)."""
    whatif_detail: dict[str, WhatIfPoint] | None
    kv_idle_fraction: PerRun
    kv_idle_fraction_through_reward: PerRun
    kv_idle_per_rollout: dict[str, list[Num]]
    group_wait_fraction: PerRun
    group_wait_per_rollout: dict[str, list[Num]]
    staleness: Staleness
    trees: dict[str, TreeFigures | None]
    """A --branch run's trees (None: no tree in the run)."""

    @property
    def labels(self) -> list[str]:
        """The runs' labels: ``["A"]`` or ``["A", "B"]``."""
        return list(self.runs)

    def to_json(self) -> dict[str, Any]:
        """The JSON renderer: the report as plain data (``sandfleet analyze --json``)."""
        one_run: Any = {
            "compare": True,
            "whatif_detail": {"__all__": {"B", "gap"}},
            "staleness": {"training_faster_pct", "faster_run"},
        }
        return self.model_dump(mode="json", by_alias=True, exclude=one_run if len(self.runs) == 1 else None)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        """A report from its JSON (:meth:`to_json`'s output), validated."""
        return cls.model_validate(data)
