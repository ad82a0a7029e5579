"""Group admission: a GRPO group's n rollouts start together, never split by the queue; a
concurrency below n is refused; retried attempts are marked so that they never count as a
rollout's end. Real bwrap sandboxes, the scripted model server, real run directories."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sandfleet.cli import cli
from sandfleet.errors import ConfigError
from sandfleet.rollout import OpenAIPolicy, RetryPolicy, RunConfig
from sandfleet.rollout.admission import Slots
from sandfleet.testing.fake_server import FakeModelServer
from test_rollout_support import make_task, needs_bwrap, run

N = 4
# members of one group take different times (0.1-0.6 s), so that slots come free one by one
UNEVEN = [{"bash": "sleep 0.$((RANDOM % 6 + 1)); echo hello > /app/out.txt"}, "Done."]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def sandbox_start(trace: dict[str, Any]) -> float:
    return float(next(s["start"] for s in trace["spans"] if s["name"] == "sandbox_start"))


@needs_bwrap()
@pytest.mark.parametrize("concurrency", [N, 2 * N])
async def test_a_group_starts_whole_and_never_beside_a_partial_group(tmp_path: Path, concurrency: int) -> None:
    tasks = [make_task(tmp_path / "tasks", f"g{i}") for i in range(4)]
    out = tmp_path / "out"
    with FakeModelServer(UNEVEN) as server:
        report = await run(tasks, OpenAIPolicy(server.url, "m"), out, n=N, concurrency=concurrency)
    assert [r.reward for r in report.results] == [1.0] * 4 * N
    traces = lines(out / "trace.jsonl")
    members: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in traces:
        members[t["group"]].append(t)
    assert sorted(len(m) for m in members.values()) == [N] * 4
    order = sorted(members, key=lambda g: min(sandbox_start(t) for t in members[g]))
    for before, after in zip(order, order[1:], strict=False):
        # every member of a group starts before any member of a group admitted after it
        assert max(sandbox_start(t) for t in members[before]) < min(sandbox_start(t) for t in members[after])
        if concurrency == N:  # one group at a time: the next one waits for the whole group to end
            assert min(sandbox_start(t) for t in members[after]) >= max(t["end"] for t in members[before])
    for g in order:  # at a group's admission its n slots were free: no more than concurrency in flight
        at = min(t["start"] for t in members[g])
        others = sum(1 for t in traces if t["group"] != g and t["start"] <= at < t["end"])
        assert others + N <= concurrency, (g, others)
    if concurrency == 2 * N:  # and two groups did run side by side
        spans = {g: (min(t["start"] for t in m), max(t["end"] for t in m)) for g, m in members.items()}
        assert any(spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]
                   for a in spans for b in spans if a < b)
    groups = {g["group"]: g for g in lines(out / "groups.jsonl")}
    for g, m in members.items():
        assert groups[g]["admitted"] <= min(t["start"] for t in m)
        assert groups[g]["end"] == max(t["end"] for t in m)
        assert groups[g]["attempts"] == N


def test_concurrency_below_the_group_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"concurrency 3 is less than the group size n=4.*at least 4"):
        RunConfig(n=4, concurrency=3)
    RunConfig(n=4, concurrency=4)
    RunConfig(n=4, concurrency=3, admission="rollout")  # validation samples no groups
    with pytest.raises(ConfigError, match="admission must be group or rollout"):
        RunConfig(admission="task")
    tasks = tmp_path / "tasks"
    make_task(tasks, "a")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["run", "--tasks", str(tasks), "-n", "4", "--concurrency", "3",
                                   "--out", str(out), "--backend", "bwrap"])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "--concurrency 3 is less than the group size -n 4" in res.output and "Traceback" not in res.output
    assert not out.exists()


async def test_shared_slots_too_small_for_a_group_are_refused(tmp_path: Path) -> None:
    from sandfleet.rollout import NoopPolicy
    from sandfleet.rollout.suite import run_suite

    task = make_task(tmp_path, "a")
    with pytest.raises(ConfigError, match="concurrency 2 is less than the group size n=3"):
        await run_suite([task], NoopPolicy(), RunConfig(n=3, concurrency=3), slots=Slots(2))


async def test_slots_admit_whole_groups_first_come_first_served() -> None:
    slots = Slots(4)
    order: list[str] = []
    await slots.acquire(3)  # someone holds 3, 1 is free
    assert slots.free == 1

    async def group(name: str, k: int) -> None:
        async with slots.admit(k) as adm:
            order.append(name)
            await asyncio.sleep(0.01)
            adm.release_one()

    b = asyncio.create_task(group("b", 4))  # waits for all 4
    await asyncio.sleep(0)
    c = asyncio.create_task(group("c", 1))  # would fit now, but b asked first
    await asyncio.sleep(0.02)
    assert order == []
    slots.release(3)
    await asyncio.gather(b, c)
    assert order == ["b", "c"] and slots.free == 4
    with pytest.raises(ConfigError, match="cannot admit 5 rollouts at once with concurrency 4"):
        await slots.acquire(5)
    # a waiter cancelled in the queue lets the ones behind it in
    await slots.acquire(4)
    big = asyncio.create_task(slots.acquire(4))
    await asyncio.sleep(0)
    small = asyncio.create_task(slots.acquire(1))
    await asyncio.sleep(0)
    slots.release(2)
    big.cancel()
    await asyncio.wait_for(small, 1)
    assert slots.free == 1


@needs_bwrap()
async def test_retried_attempts_are_marked_not_final(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks", "r")
    out = tmp_path / "out"
    retry = RetryPolicy(max_attempts=2, backoff_s=0.01)
    with FakeModelServer(UNEVEN, faults=["500"]) as server:
        report = await run([task], OpenAIPolicy(server.url, "m"), out, n=2, concurrency=2, retry=retry)
    assert [r.reward for r in report.results] == [1.0, 1.0]
    traces = lines(out / "trace.jsonl")
    retried = [t for t in traces if not t["final"]]
    assert len(traces) == 3 and len(retried) == 1
    assert retried[0]["status"] == "failed" and retried[0]["reason"] == "model_http_500"
    assert retried[0]["attempt"] == 1
    finals = [t for t in traces if t["final"]]
    again = [t for t in finals if t["sample"] == retried[0]["sample"]][0]
    assert again["attempt"] == 2 and again["rollout_id"].endswith("~2")
    assert all(r["final"] for r in lines(out / "rollouts.jsonl"))
    (group,) = lines(out / "groups.jsonl")
    assert group["end"] == max(t["end"] for t in finals) and group["attempts"] == 3
