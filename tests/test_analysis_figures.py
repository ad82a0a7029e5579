"""Breakdown, tiling, KV-cache idle, group wait and staleness on hand-computed examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandfleet.analysis import TraceError, load_run, write_trace
from sandfleet.analysis.breakdown import breakdown, percentile, whatif
from sandfleet.analysis.figures import (
    group_wait,
    kv_idle_fraction,
    kv_integrals,
    staleness,
    step_time_for_bound,
    training_speedup,
)
from sandfleet.analysis.trace import parse_rollout
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


def test_kv_idle_hand_computed() -> None:
    r = parse_rollout(
        record(
            [
                span("sandbox_start", 0, 1),  # before the window
                span("model", 1, 3, prompt_tokens=100, completion_tokens=20),  # 100 x 2 = 200
                span("agent_command", 3, 6),  # 120 x 3 = 360 idle
                span("model", 6, 7, prompt_tokens=150, completion_tokens=30),  # 150 x 1 = 150
                span("other_sandbox", 7, 8),  # 180 x 1 = 180
                span("verifier", 8, 10),  # 180 x 2 = 360 idle
                span("overhead", 10, 11),  # after the window
            ]
        )
    )
    assert kv_integrals(r) == (pytest.approx(720.0), pytest.approx(1250.0))
    assert kv_idle_fraction([r]) == pytest.approx(720 / 1250)


def test_kv_idle_sums_over_rollouts_and_skips_those_without_model() -> None:
    a = parse_rollout(
        record(
            [
                span("model", 0, 1, prompt_tokens=10, completion_tokens=0),
                span("agent_command", 1, 2),  # 10 idle / 30
                span("model", 2, 3, prompt_tokens=10, completion_tokens=0),
                span("agent_command", 3, 9),
            ]
        )
    )  # after window
    b = parse_rollout(
        record(
            [span("model", 0, 1, prompt_tokens=100, completion_tokens=0), span("verifier", 1, 4)]
        )
    )  # 300 idle / 400
    no_model = parse_rollout(record([span("agent_command", 0, 5)]))
    assert kv_idle_fraction([a, b, no_model]) == pytest.approx(310 / 430)
    assert kv_idle_fraction([no_model]) is None


def _r(group: str, start: float, end: float, status: str = "completed") -> Any:
    return parse_rollout(
        {**record([span("agent_command", start, end)]), "group": group, "status": status}
    )


def test_group_wait_hand_computed() -> None:
    rollouts = [
        _r("g1", 0, 10),
        _r("g1", 0, 20),
        _r("g1", 0, 40),  # waits 30, 20, 0 over 10+20+40
        _r("g2", 5, 15),
        _r("g2", 5, 25, status="failed"),  # waits 10 over 10; failed excluded
    ]
    gw = group_wait(rollouts)
    assert gw.fraction == pytest.approx((30 + 20 + 0 + 10) / (10 + 20 + 40 + 10))
    assert gw.per_rollout == pytest.approx(sorted([3.0, 1.0, 0.0, 1.0]))
    assert gw.groups == 2


def test_staleness_and_the_step_time_a_bound_allows() -> None:
    durations = [float(d) for d in range(10, 110, 10)]  # 10, 20, ..., 100
    st = staleness(durations, step_time_s=40.0)
    assert st.p50 == pytest.approx(55 / 40)
    assert st.p90 == pytest.approx(91 / 40)
    assert st.max == pytest.approx(2.5)
    assert st.histogram == {0: 3, 1: 4, 2: 3}
    assert percentile(durations, 90) == pytest.approx(91.0)
    assert step_time_for_bound(durations, 1.0) == pytest.approx(91.0)
    assert step_time_for_bound(durations, 2.0) == pytest.approx(45.5)
    assert training_speedup(91.0, 100.1) == pytest.approx(0.1)


def test_whatif_divides_only_the_model_span(tmp_path: Path) -> None:
    recs = [rollout_record("t", 0, 0.0, {"model": 64.0, "agent_command": 36.0})]
    run = load_run(write_trace(tmp_path, recs))
    means = {w.k: w.mean_s[0] for w in whatif([run], [1, 4, 64])}
    assert means == {1: pytest.approx(100.0), 4: pytest.approx(52.0), 64: pytest.approx(37.0)}
    assert all(w.gap is None for w in whatif([run], [1]))


def test_unpaired_runs_compare_plain_means(tmp_path: Path) -> None:
    a = load_run(
        write_trace(tmp_path / "a", [rollout_record("x", 0, 0, {"model": 10.0})]), name="a"
    )
    b = load_run(write_trace(tmp_path / "b", [rollout_record("y", 0, 0, {"model": 20.0})]))
    (w,) = whatif([a, b], [1])
    assert w.gap == pytest.approx(1.0)


def test_load_errors_name_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "trace.jsonl"
    good = '{"start": 0, "end": 1, "spans": [{"name": "model", "start": 0, "end": 1}]}'
    p.write_text(
        good + "\n\n" + '{"start": 0, "end": 1, "spans": [{"name": "think", '
        '"start": 0, "end": 1}]}\n'
    )
    with pytest.raises(TraceError, match=r"trace\.jsonl:3: span 0: unknown span name 'think'"):
        load_run(tmp_path)
