"""The study's training-run figures, reproduced from its published per-rollout components."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.analysis import analyze, load_run
from sandfleet.testing.synth import STUDY_A, STUDY_B, write_study


@pytest.fixture
def study(tmp_path: Path) -> dict:
    a, b = write_study(tmp_path)
    return analyze([load_run(a), load_run(b)], whatif_ks=[1, 2, 4, 8, 16, 32])


def test_study_inputs_are_the_published_reading() -> None:
    assert sum(STUDY_A.values()) == pytest.approx(442.0)
    assert sum(STUDY_B.values()) - sum(STUDY_A.values()) == pytest.approx(53.0)


@pytest.mark.parametrize(("k", "published"), [("1", 12.0), ("8", 33.0), ("32", 41.0)])
def test_gap_grows_with_faster_inference(study: dict, k: str, published: float) -> None:
    assert 100 * study["whatif"][k] == pytest.approx(published, abs=1.5)


def test_gap_is_monotonic_in_k(study: dict) -> None:
    gaps = [study["whatif"][k] for k in ("1", "2", "4", "8", "16", "32")]
    assert gaps == sorted(gaps)


def test_breakdown_deltas_match_the_study(study: dict) -> None:
    c = study["compare"]
    assert c["tasks"] == 20 and c["tasks_left_out"] == []
    spans = c["spans"]
    assert spans["total"]["delta_s"] == pytest.approx(53.0, abs=0.01)
    assert spans["agent_command"]["delta_s"] == pytest.approx(26.0, abs=0.01)
    assert spans["agent_command"]["delta_pct"] == pytest.approx(60.0, abs=1.0)
    assert spans["verifier"]["delta_s"] == pytest.approx(11.0, abs=0.01)
    assert spans["verifier"]["delta_pct"] == pytest.approx(24.0, abs=1.0)
    assert spans["other_sandbox"]["delta_s"] == pytest.approx(12.0, abs=0.01)
    assert spans["model"]["delta_s"] == pytest.approx(4.0, abs=0.01)
    assert spans["total"]["delta_pct"] == pytest.approx(12.0, abs=0.1)
    for d in spans.values():
        lo, hi = d["delta_s_ci90"]
        assert lo <= d["delta_s"] <= hi


def test_shorter_rollouts_allow_faster_training(study: dict) -> None:
    st = study["staleness"]
    assert st["faster_run"] == "A"
    assert st["training_faster_pct"] == pytest.approx(12.0, abs=0.5)


def test_figures_are_present_and_in_range(study: dict) -> None:
    for key in ("spans_mean_s", "whatif", "kv_idle_fraction", "group_wait_fraction"):
        assert key in study
    assert "mean of A" in study["gap_definition"]
    for lab in ("A", "B"):
        assert 0 < study["kv_idle_fraction"][lab] < 1
        # the synthetic groups spread their members from 0.55x to 1.45x of the mean D and
        # start together: each member waits 1.45 D - f D of the group's 1.45 D, and the f
        # average 1, so the fraction is (1.45 - 1) / 1.45
        assert study["group_wait_fraction"][lab] == pytest.approx(0.45 / 1.45, abs=1e-6)
        assert 0 < study["kv_idle_fraction"][lab] < study["kv_idle_fraction_through_reward"][lab] < 1
    assert study["kv_idle_fraction"]["B"] > study["kv_idle_fraction"]["A"]


def test_platform_overhead_of_the_study(study: dict) -> None:
    # A: sandbox_start 0.5 + other_sandbox 19 + overhead 0.5 = 20 s of 442 s (4.5 %; the
    # study's "other sandbox" alone is 19 s, 4.3 %); B: 0.5 + 31 + 0.5 = 32 s of 495 s
    assert study["platform_overhead_s"] == {"A": pytest.approx(20.0), "B": pytest.approx(32.0)}
    assert study["platform_overhead_fraction"]["A"] == pytest.approx(20 / 442, abs=1e-6)
    assert study["platform_overhead_fraction"]["B"] == pytest.approx(32 / 495, abs=1e-6)
