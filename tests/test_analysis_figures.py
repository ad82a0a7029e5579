"""Every analysis figure on hand-built traces, its expected value worked out by hand.

Each example is chosen so that the figure's definition in docs/figures.md gives a value
the previous definition would not; the comment next to it says what the old one gave.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandfleet.analysis import TraceError, analyze, load_run, write_trace
from sandfleet.analysis import breakdown as bd
from sandfleet.analysis import figures as fg
from sandfleet.analysis.breakdown import breakdown, compare, gap, whatif
from sandfleet.analysis.figures import (
    group_wait,
    kv_idle,
    kv_idle_fraction,
    kv_integrals,
    platform_overhead,
    platform_overhead_summary,
    staleness,
    step_time_for_bound,
    training_speedup,
)
from sandfleet.analysis.trace import final_attempts, parse_rollout
from sandfleet.errors import ConfigError
from sandfleet.stats import percentile
from sandfleet.testing.synth import rollout_record


def span(name: str, start: float, end: float, **attrs: Any) -> dict[str, Any]:
    return {"name": name, "start": start, "end": end, **attrs}


def record(spans: list[dict], **kw: Any) -> dict[str, Any]:
    return {
        "rollout_id": "r",
        "task": "t",
        "start": spans[0]["start"],
        "end": spans[-1]["end"],
        "status": "completed",
        "spans": spans,
        **kw,
    }


def run_of(tmp_path: Path, name: str, records: list[dict[str, Any]]) -> Any:
    return load_run(write_trace(tmp_path / name, records), name=name)


# --- breakdown, tiling, percentiles -------------------------------------------------------


def test_spans_tile_the_rollout(tmp_path: Path) -> None:
    recs = [
        rollout_record(
            "t",
            i,
            100.0 * i,
            {"model": 7, "agent_command": 3, "verifier": 2, "other_sandbox": 1, "overhead": 0.25},
        )
        for i in range(3)
    ]
    run = load_run(write_trace(tmp_path, recs))
    for r in run.rollouts:
        assert sum(r.span_seconds().values()) == pytest.approx(r.duration)
    stats = breakdown(run.rollouts)
    assert stats["total"].mean == pytest.approx(sum(stats[n].mean for n in stats if n != "total"))


@pytest.mark.parametrize(
    ("spans", "message"),
    [
        ([span("model", 0, 1), span("verifier", 1.5, 2)], "gap"),
        ([span("model", 0, 1), span("verifier", 0.5, 2)], "overlap"),
        ([span("model", 0, 1), span("verifier", 1, 2)], None),
    ],
)
def test_tiling_is_checked(spans: list[dict], message: str | None) -> None:
    rec = record(spans)
    if message is None:
        assert parse_rollout(rec).duration == 2
    else:
        with pytest.raises(ValueError, match=message):
            parse_rollout(rec)


def test_spans_must_end_at_the_rollout_end() -> None:
    with pytest.raises(ValueError, match="tile"):
        parse_rollout({**record([span("model", 0, 1)]), "end": 5.0})


def test_breakdown_percentiles_are_the_shared_ones() -> None:
    # totals 1, 2, 3, 4, 10: p90 at rank (5 - 1) * 0.9 = 3.6 -> 4 + 0.6 * (10 - 4) = 7.6,
    # median 3, mean 4. (The old analysis.breakdown.percentile gave the same numbers: it
    # was the same linear rule, written twice; now there is one, sandfleet.stats's.)
    rs = [parse_rollout(record([span("agent_command", 0, d)])) for d in (1, 2, 3, 4, 10)]
    st = breakdown(rs)["total"]
    assert (st.mean, st.median, st.p90) == (pytest.approx(4.0), pytest.approx(3.0), pytest.approx(7.6))
    assert percentile([1, 2, 3, 4, 10], 90) == pytest.approx(7.6)
    # no second percentile in analysis, and no re-export of the shared one
    assert not hasattr(bd, "percentile") and not hasattr(fg, "percentile")


# --- platform overhead --------------------------------------------------------------------


def _platform_rollouts() -> list[Any]:
    a = parse_rollout(
        record(
            [
                span("sandbox_start", 0, 2),  # 2 s platform
                span("model", 2, 5),
                span("other_sandbox", 5, 6),  # 1 s platform
                span("agent_command", 6, 9),
                span("overhead", 9, 10),  # 1 s platform: 4 s of 10
            ],
            rollout_id="a",
        )
    )
    b = parse_rollout(
        record(
            [span("sandbox_start", 0, 1), span("agent_command", 1, 29), span("overhead", 29, 30)],
            rollout_id="b",
        )
    )  # 2 s of 30
    failed = parse_rollout(
        record([span("sandbox_start", 0, 50)], rollout_id="c", status="failed")
    )  # not a completed rollout: left out
    return [a, b, failed]


def test_platform_overhead_hand_computed() -> None:
    p = platform_overhead(_platform_rollouts())
    # mean of (4, 2) = 3 s; fraction = (4 + 2) / (10 + 30) = 0.15, not the mean of the
    # per-rollout shares (0.4 + 0.0667) / 2 = 0.233. The old figure was only the
    # overhead span's share, overhead_fraction = (1 + 1) / 40 = 0.05.
    assert p.mean_s == pytest.approx(3.0)
    assert p.fraction == pytest.approx(0.15)
    assert p.rollouts == 2
    assert platform_overhead_summary(_platform_rollouts()) == {
        "platform_overhead_s": pytest.approx(3.0),
        "platform_overhead_fraction": pytest.approx(0.15),
    }
    assert platform_overhead([]).mean_s is None and platform_overhead([]).fraction is None


def test_platform_overhead_of_runner_results() -> None:
    """summary.json computes it from the runner's results (same figure, same function)."""
    from sandfleet.rollout.result import RolloutResult

    def result(rid: str, status: str, spans: list[dict[str, Any]]) -> RolloutResult:
        return RolloutResult(
            rollout_id=rid, task="t", group="t", sample=0, agent="x", backend="process",
            start=spans[0]["start"], end=spans[-1]["end"], status=status,
            spans=spans,
        )

    results = [
        result("a", "completed", [span("sandbox_start", 0, 3), span("verifier", 3, 9), span("overhead", 9, 10)]),
        result("b", "failed", [span("sandbox_start", 0, 7)]),
    ]
    # only the completed one: 3 + 1 = 4 s of 10 s (the failed one's 7 s left out)
    assert platform_overhead_summary(results) == {
        "platform_overhead_s": pytest.approx(4.0),
        "platform_overhead_fraction": pytest.approx(0.4),
    }


def test_run_summary_has_platform_overhead() -> None:
    from sandfleet.rollout.result import RolloutResult
    from sandfleet.rollout.suite import RunConfig, RunReport

    r = RolloutResult(
        rollout_id="t#0", task="t", group="t", sample=0, agent="x", backend="process",
        start=0.0, end=8.0, status="completed",
        spans=[span("sandbox_start", 0, 1), span("agent_command", 1, 6), span("other_sandbox", 6, 8)],
    )
    summary = RunReport(RunConfig(), [r], [r], {}, wall_s=8.0).summary()
    # 1 + 2 = 3 s of 8 s
    assert summary["platform_overhead_s"] == pytest.approx(3.0)
    assert summary["platform_overhead_fraction"] == pytest.approx(0.375)
    json.dumps(summary)


# --- KV-cache idle ------------------------------------------------------------------------


def _kv_rollout() -> Any:
    return parse_rollout(
        record(
            [
                span("sandbox_start", 0, 1),  # before the window
                span("model", 1, 3, prompt_tokens=100, completion_tokens=20),  # 100 x 2 = 200
                span("agent_command", 3, 6),  # 120 x 3 = 360 idle
                span("other_sandbox", 6, 7),  # 120 x 1 = 120 idle (between response and request)
                span("model", 7, 8),  # no usage: keeps 120 -> 120 x 1 = 120, busy
                span("agent_command", 8, 10),  # still 120 -> 120 x 2 = 240 idle
                span("model", 10, 11, prompt_tokens=200, completion_tokens=10),  # 200 x 1 = 200
                # the first window ends here (last response); the second goes on to the reward
                span("other_sandbox", 11, 12),  # 210 x 1 = 210 idle
                span("verifier", 12, 16),  # 210 x 4 = 840 idle
                span("overhead", 16, 17),  # after the reward
            ]
        )
    )


def test_kv_idle_hand_computed() -> None:
    r = _kv_rollout()
    # first request (1) to last response (11): idle 360 + 120 + 240 = 720,
    # total 200 + 360 + 120 + 120 + 240 + 200 = 1240
    assert kv_integrals(r) == (pytest.approx(720.0), pytest.approx(1240.0))
    assert kv_idle_fraction([r]) == pytest.approx(720 / 1240)  # 0.5806
    # through the reward (to the verifier's end, 16): idle 720 + 210 + 840 = 1770,
    # total 1240 + 1050 = 2290
    assert kv_integrals(r, through_reward=True) == (pytest.approx(1770.0), pytest.approx(2290.0))
    assert kv_idle_fraction([r], through_reward=True) == pytest.approx(1770 / 2290)  # 0.7729
    # The old definition (window to the verifier's end; idle only in agent_command and
    # verifier; a model span without usage counted as 0 tokens, during and after) gave
    # idle 360 + 840 = 1200 of 200 + 360 + 120 + 0 + 0 + 200 + 210 + 840 = 1930: 0.6218.
    assert kv_idle_fraction([r]) != pytest.approx(1200 / 1930)


def test_kv_idle_sums_token_seconds_over_rollouts() -> None:
    a = _kv_rollout()
    b = parse_rollout(
        record(
            [
                span("model", 0, 1, prompt_tokens=1000, completion_tokens=0),  # 1000 busy
                span("agent_command", 1, 2),  # 1000 idle
                span("model", 2, 3, prompt_tokens=1000, completion_tokens=0),  # 1000 busy
                span("verifier", 3, 4),  # 1000 idle, through the reward only
            ],
            rollout_id="b",
        )
    )
    no_model = parse_rollout(record([span("agent_command", 0, 5)], rollout_id="c"))
    k = kv_idle([a, b, no_model])
    # (720 + 1000) / (1240 + 3000) = 0.4057, not the mean of the two rollouts' own
    # fractions (0.5806 + 0.3333) / 2 = 0.457
    assert k.fraction == pytest.approx(1720 / 4240)
    # through the reward: (1770 + 2000) / (2290 + 4000)
    assert k.fraction_through_reward == pytest.approx(3770 / 6290)
    assert k.per_rollout == pytest.approx([1 / 3, 720 / 1240])
    # The old definition gave (1200 + 2000) / (1930 + 4000) = 0.5396.
    assert kv_idle([no_model]).fraction is None
    assert kv_idle([no_model]).fraction_through_reward is None


def test_kv_through_reward_without_verifier_ends_with_the_rollout() -> None:
    r = parse_rollout(
        record(
            [
                span("model", 0, 1, prompt_tokens=10, completion_tokens=10),  # 10 busy
                span("agent_command", 1, 3),  # 20 x 2 = 40 idle
                span("overhead", 3, 4),  # 20 x 1 = 20 idle
            ]
        )
    )
    # first window: the model span alone, 0 idle of 10
    assert kv_integrals(r) == (pytest.approx(0.0), pytest.approx(10.0))
    # to the rollout's end: 60 idle of 70 (old: window to the last model end, 0 of 10)
    assert kv_integrals(r, through_reward=True) == (pytest.approx(60.0), pytest.approx(70.0))


# --- group wait ---------------------------------------------------------------------------


def _member(sample: int, start: float, end: float, status: str = "completed", attempt: int = 1,
            group: str = "g") -> dict[str, Any]:
    rid = f"{group}#{sample}" + (f"~{attempt}" if attempt > 1 else "")
    return {
        **record([span("agent_command", start, end)]),
        "rollout_id": rid,
        "group": group,
        "task": group,
        "sample": sample,
        "attempt": attempt,
        "status": status,
    }


def test_group_wait_hand_computed() -> None:
    rollouts = [
        parse_rollout(r)
        for r in [
            # group g, admitted at 0
            _member(0, 0, 4, "failed"),  # retried
            _member(0, 5, 12, attempt=2),  # final: waits 20 - 12 = 8
            _member(1, 0, 10),  # waits 20 - 10 = 10
            _member(2, 0, 25, "failed"),  # retried: does not set the group end
            _member(2, 2, 20, attempt=2),  # final: sets the group end, 20; waits 0
            # group h, admitted at 100
            _member(0, 100, 110, group="h"),  # waits 130 - 110 = 20
            _member(1, 100, 130, "cancelled", group="h"),  # final, not completed: ends h at 130
        ]
    ]
    gw = group_wait(rollouts)
    # waits 8 + 10 + 0 + 20 = 38 over (20 - 0) x 3 + (130 - 100) = 90: 0.4222.
    # The old definition (group end over every attempt, 25 for g; over rollout durations)
    # gave (13 + 15 + 5 + 20) / (7 + 10 + 18 + 10) = 53 / 45 = 1.18.
    assert gw.fraction == pytest.approx(38 / 90)
    assert gw.per_rollout == pytest.approx([0.0, 8 / 20, 10 / 20, 20 / 30])
    assert gw.groups == 2


def test_final_attempts_without_sample_use_the_rollout_id() -> None:
    recs = [
        {**record([span("agent_command", 0, 3)]), "rollout_id": "t#0", "status": "failed"},
        {**record([span("agent_command", 3, 5)]), "rollout_id": "t#0~2", "attempt": 2},
        {**record([span("agent_command", 0, 4)]), "rollout_id": "t#1"},
    ]
    finals = final_attempts([parse_rollout(r) for r in recs])
    assert sorted(r.rollout_id for r in finals) == ["t#0~2", "t#1"]


@pytest.mark.parametrize(("key", "value"), [("attempt", 0), ("attempt", "2"), ("sample", -1), ("sample", 1.5)])
def test_bad_attempt_or_sample_is_named(key: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"'{key}' must be an integer"):
        parse_rollout({**record([span("model", 0, 1)]), key: value})


# --- staleness ----------------------------------------------------------------------------


def test_staleness_and_the_step_time_a_bound_allows() -> None:
    durations = [float(d) for d in range(10, 110, 10)]  # 10, 20, ..., 100
    st = staleness(durations, step_time_s=40.0)
    # p50 of d at rank 4.5: 55 s -> 55/40; p90 at rank 8.1: 91 s -> 91/40 (the definition
    # is unchanged; only the percentile is now sandfleet.stats's)
    assert st.p50 == pytest.approx(55 / 40)
    assert st.p90 == pytest.approx(91 / 40)
    assert st.max == pytest.approx(2.5)
    assert st.histogram == {0: 3, 1: 4, 2: 3}
    assert step_time_for_bound(durations, 1.0) == pytest.approx(91.0)
    assert step_time_for_bound(durations, 2.0) == pytest.approx(45.5)
    assert training_speedup(91.0, 100.1) == pytest.approx(0.1)


# --- gap and what-if ----------------------------------------------------------------------


def test_gap_is_relative_to_a() -> None:
    # the study: A 442 s, B 495 s -> 53 / 442 = 12.0 % (relative to B it would be 10.7 %)
    assert gap(442.0, 495.0) == pytest.approx(53 / 442)
    assert round(100 * gap(442.0, 495.0), 1) == 12.0


def test_whatif_divides_only_the_model_span(tmp_path: Path) -> None:
    recs = [rollout_record("t", 0, 0.0, {"model": 64.0, "agent_command": 36.0})]
    run = load_run(write_trace(tmp_path, recs))
    means = {w.k: w.mean_s[0] for w in whatif([run], [1, 4, 64])}
    # 36 + 64 / k
    assert means == {1: pytest.approx(100.0), 4: pytest.approx(52.0), 64: pytest.approx(37.0)}
    assert all(w.gap is None for w in whatif([run], [1]))


def test_whatif_gap_of_two_runs(tmp_path: Path) -> None:
    a = run_of(tmp_path, "a", [rollout_record("t", 0, 0.0, {"model": 60.0, "agent_command": 40.0})])
    b = run_of(tmp_path, "b", [rollout_record("t", 0, 0.0, {"model": 60.0, "agent_command": 60.0})])
    res = analyze([a, b], whatif_ks=[1, 4])
    # k=1: (120 - 100) / 100 = 0.2; k=4: A 40 + 15 = 55, B 60 + 15 = 75 -> 20 / 55 = 0.3636
    assert res["whatif"] == {"1": pytest.approx(0.2), "4": pytest.approx(20 / 55, abs=1e-6)}
    assert res["whatif_not_applicable"] is None


def test_whatif_is_not_applicable_without_model_spans(tmp_path: Path) -> None:
    # A converted trace: the model's time is inside agent_command. The old analysis drew a
    # flat curve (100 s for every k); now there is no curve and a reason.
    rec = {**rollout_record("t", 0, 0.0, {"agent_command": 100.0}, turns=1), "model_time_known": False}
    rec["spans"] = [s for s in rec["spans"] if s["name"] != "model"]
    run = run_of(tmp_path, "conv", [rec])
    res = analyze([run], whatif_ks=[1, 8])
    assert res["whatif"] is None and res["whatif_detail"] is None
    assert "agent_command" in res["whatif_not_applicable"]
    # a run that times the model but has no model span: also not applicable
    plain = run_of(tmp_path, "plain", [record([span("agent_command", 0, 5)])])
    res = analyze([plain])
    assert res["whatif"] is None and "no model spans" in res["whatif_not_applicable"]


# --- comparisons --------------------------------------------------------------------------


def _totals(task_totals: list[tuple[str, float]]) -> list[dict[str, Any]]:
    return [
        {**rollout_record(task, i, 1000.0 * i, {"agent_command": t}, turns=1), "rollout_id": f"{task}#{i}"}
        for i, (task, t) in enumerate(task_totals)
    ]


def test_compare_means_per_task_with_intervals(tmp_path: Path) -> None:
    a = run_of(tmp_path, "a", _totals([("x", 10), ("x", 20), ("y", 30)]))
    b = run_of(tmp_path, "b", _totals([("x", 40), ("y", 30), ("y", 50)]))
    p, deltas = compare(a, b)
    # A = mean(mean(10, 20), 30) = 22.5; B = mean(40, mean(30, 50)) = 40; B - A = 17.5
    # (plain means over rollouts would give 20 and 40: 20)
    d = deltas["total"]
    assert (d.a, d.b, d.delta_s) == (pytest.approx(22.5), pytest.approx(40.0), pytest.approx(17.5))
    assert d.delta_pct == pytest.approx(100 * 17.5 / 22.5)
    lo, hi = d.delta_s_ci
    assert lo <= d.delta_s <= hi and lo < hi
    assert compare(a, b)[1]["total"].delta_s_ci == d.delta_s_ci  # seeded: the same interval
    assert p.tasks == ("x", "y") and p.left_out == ()


def test_compare_interval_of_constant_runs_is_the_delta(tmp_path: Path) -> None:
    # every resample of constant runs has the same means: the interval is [5, 5] (and 50 %)
    a = run_of(tmp_path, "a", _totals([("x", 10), ("x", 10), ("y", 10)]))
    b = run_of(tmp_path, "b", _totals([("x", 15), ("y", 15), ("y", 15)]))
    res = analyze([a, b])
    tot = res["compare"]["spans"]["total"]
    assert tot["delta_s"] == pytest.approx(5.0)
    assert tot["delta_s_ci90"] == [pytest.approx(5.0), pytest.approx(5.0)]
    assert tot["delta_pct_ci90"] == [pytest.approx(50.0), pytest.approx(50.0)]
    assert res["compare"]["ci_level"] == 0.9


def test_compare_refuses_different_task_sets(tmp_path: Path) -> None:
    # The old comparison went on over the shared tasks (x, y) and counted the others.
    a = run_of(tmp_path, "a", _totals([("x", 1), ("y", 1), ("z", 1)]))
    b = run_of(tmp_path, "b", _totals([("x", 1), ("y", 1), ("w", 1), ("v", 1)]))
    with pytest.raises(ConfigError, match=r"only in A \(1\): z; only in B \(2\): v, w"):
        analyze([a, b])
    with pytest.raises(ConfigError, match="different tasks"):
        whatif([a, b], [1])


def test_compare_leaves_out_a_task_without_completed_rollouts(tmp_path: Path) -> None:
    a = run_of(tmp_path, "a", _totals([("x", 10), ("y", 30)]))
    recs = _totals([("x", 20), ("y", 50)])
    recs[1]["status"] = "failed"
    b = run_of(tmp_path, "b", recs)
    p, deltas = compare(a, b)
    # y has no completed rollout in B: both runs are compared on x alone, 20 - 10
    assert p.tasks == ("x",) and p.left_out == ("y",)
    assert deltas["total"].delta_s == pytest.approx(10.0)


# --- provenance ---------------------------------------------------------------------------


def test_analysis_records_provenance(tmp_path: Path) -> None:
    a = run_of(tmp_path, "a", _totals([("x", 10)]))
    b = run_of(tmp_path, "b", _totals([("x", 12)]))
    recorded = {"host": {"hostname": "runner-7"}, "commit": "abc123"}
    (tmp_path / "a" / "run.json").write_text(json.dumps({"run_id": "r1", "provenance": recorded}))
    res = analyze([a, b], whatif_ks=[1, 2])
    prov = res["provenance"]
    assert prov["runs"] == {"A": recorded, "B": None}
    assert prov["analysis"]["host"]["hostname"] and "sandfleet" in prov["analysis"]
    assert prov["analysis"]["config"]["whatif_ks"] == [1, 2]
    json.dumps(res)


def test_load_errors_name_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "trace.jsonl"
    good = '{"start": 0, "end": 1, "spans": [{"name": "model", "start": 0, "end": 1}]}'
    p.write_text(
        good + "\n\n" + '{"start": 0, "end": 1, "spans": [{"name": "think", '
        '"start": 0, "end": 1}]}\n'
    )
    with pytest.raises(TraceError, match=r"trace\.jsonl:3: span 0: unknown span name 'think'"):
        load_run(tmp_path)
