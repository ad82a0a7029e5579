"""The soak's arithmetic (sandfleet.bench.soak): its windows, and when their drift is read."""

from __future__ import annotations

from sandfleet.bench.soak import MIN_ROLLOUTS, comparable, mean_in, windows


def test_windows_count_whole_windows_from_the_start() -> None:
    ends = [10.0, 10.5, 29.9, 30.0, 59.0, 61.0, 95.0]
    assert windows(ends, 10.0, 100.0, 30.0) == [8.0, 4.0, 2.0]  # 4, 2 and 1 rollouts a window of 30 s
    assert windows(ends, 10.0, 99.0, 30.0) == [8.0, 4.0]  # 95 is in no whole window


def test_drift_is_read_only_when_the_windows_resolve_it_and_the_host_held_still() -> None:
    assert comparable([40, 38, 41], [6.0, 6.5, 7.0], [20.0, 19.0, 21.0]) == {"ok": True, "why": ""}
    few = comparable([MIN_ROLLOUTS - 1, 30, 30], [6.0, 6.0, 6.0], [20.0, 20.0, 20.0])
    assert not few["ok"] and f"windows of {MIN_ROLLOUTS - 1} and 30 rollouts" in few["why"]
    busier = comparable([40, 30, 30], [6.0, 9.0, 8.0], [20.0, 20.0, 20.0])
    assert not busier["ok"] and "runnable tasks went from 6.0 to 8.0" in busier["why"]
    starved = comparable([40, 30, 30], [6.0, 6.0, 6.0], [20.0, 15.0, 15.0])
    assert not starved["ok"] and "CPU-seconds went from 20.0 to 15.0" in starved["why"]
    assert not comparable([40, 40], [None, 5.0], [1.0, 1.0])["ok"] and not comparable([], [], [])["ok"]


def test_mean_in_a_window() -> None:
    samples = [(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]
    assert mean_in(samples, 0.0, 2.0) == 2.0 and mean_in(samples, 5.0, 6.0) is None
