"""sandfleet.cluster without Ray: placement, task shipping, the --ray option's refusals."""

from __future__ import annotations

import asyncio
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandfleet.cluster.local import parse_local, seed_cache
from sandfleet.cluster.placement import Node, NoNodeError, Placer, task_arches
from sandfleet.errors import ConfigError
from sandfleet.tasks import load_task
from sandfleet.tasks.bundle import content_hash, pack, relocate, unpack
from sandfleet.tasks.reward import with_reward_selection
from test_rollout_support import make_task


def placer(*caps: int, arch: str = "amd64") -> Placer:
    p = Placer()
    for i, c in enumerate(caps):
        p.add(Node(f"n{i}", arch, c))
    return p


async def test_a_group_goes_whole_to_the_node_with_most_free_capacity() -> None:
    p = placer(4, 8, 6)
    a = await p.place(4)
    assert a.node_id == "n1" and a.free == 4
    b = await p.place(4)
    assert b.node_id == "n2"  # 6 free beats 4 and 4
    c = await p.place(4)
    assert c.node_id == "n0"
    assert [x.free for x in p.nodes.values()] == [0, 4, 2]  # a tie: to the node given fewer groups
    even = placer(2, 2, 2)
    order = []
    for _ in range(6):  # one group at a time: equally free nodes take turns
        node = await even.place(2)
        order.append(node.node_id)
        even.release(node, 2)
    assert order == ["n0", "n1", "n2"] * 2


async def test_backpressure_never_overcommits_and_serves_in_order() -> None:
    p = placer(4, 4)
    first = [await p.place(3), await p.place(3)]
    waiting = [asyncio.create_task(p.place(2)), asyncio.create_task(p.place(1))]
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in waiting)  # 1 free per node: the group of 2 waits, and the 1 behind it
    assert all(x.free >= 0 for x in p.nodes.values())
    p.release(first[0], 3)
    got = await asyncio.wait_for(waiting[0], 1)
    assert got is first[0] and (await asyncio.wait_for(waiting[1], 1)).free >= 0
    assert all(0 <= x.free <= x.capacity for x in p.nodes.values())


async def test_a_drained_node_takes_nothing_new_and_a_lost_one_never_again() -> None:
    p = placer(4, 4)
    p.drain("n0")
    assert (await p.place(2)).node_id == "n1"
    assert (await p.place(2)).node_id == "n1"
    wait = asyncio.create_task(p.place(2))
    await asyncio.sleep(0.01)
    assert not wait.done()
    p.drain("n0", on=False)
    assert (await asyncio.wait_for(wait, 1)).node_id == "n0"
    p.lose("n1")
    with pytest.raises(NoNodeError, match="fits on no node"):
        await p.place(5)


async def test_arch_is_matched_and_an_impossible_group_is_refused_at_once() -> None:
    p = placer(4)
    p.add(Node("arm", "arm64", 2))
    assert (await p.place(2, {"arm64"})).node_id == "arm"
    with pytest.raises(NoNodeError, match="no node runs riscv64"):
        await p.place(1, {"riscv64"})
    with pytest.raises(NoNodeError, match="a group of 3 fits on no node"):
        await p.place(3, {"arm64"})
    waiting = asyncio.create_task(p.place(2, {"arm64"}))
    await asyncio.sleep(0.01)
    p.lose("arm")  # the only node of its arch is gone: the waiter is told, not left waiting
    with pytest.raises(NoNodeError):
        await asyncio.wait_for(waiting, 1)
    assert task_arches({"arch": "amd64, arm64"}, None) == {"amd64", "arm64"}
    assert task_arches({}, "arm64") == {"arm64"} and task_arches({}, None) is None


def test_task_folders_ship_by_content_hash_and_load_the_same_task_elsewhere(tmp_path: Path) -> None:
    task = with_reward_selection(make_task(tmp_path / "src"), "reward")
    bundle = pack(task)
    assert bundle.digest == content_hash(task.path) == pack(task).digest
    with tarfile.open(fileobj=__import__("io").BytesIO(bundle.data)) as tar:
        assert "tests/test.sh" in tar.getnames()
    folder = unpack(bundle.digest, bundle.data, tmp_path / "node")
    assert folder == tmp_path / "node" / bundle.digest and unpack(bundle.digest, b"", tmp_path / "node") == folder
    moved = relocate(task, folder)
    assert moved.path == folder and moved.tests_dir == folder / "tests"
    assert moved.verifier.reward_key == "reward"  # what the driver applied travels with it
    assert moved.model_dump(exclude={"path", "tests_dir", "dockerfile", "context_dir", "solution", "verifier"}) == \
        task.model_dump(exclude={"path", "tests_dir", "dockerfile", "context_dir", "solution", "verifier"})
    assert load_task(folder).instruction == task.instruction
    (task.path / "tests" / "test.sh").write_text("echo changed\n")
    assert content_hash(task.path) != bundle.digest
    with pytest.raises(ConfigError, match="corrupt"):
        unpack("0" * 64, bundle.data, tmp_path / "other")
    assert not list((tmp_path / "other").iterdir())  # nothing half-made is left


def test_local_addresses_and_seeded_caches(tmp_path: Path) -> None:
    assert parse_local("local:3") == 3 and parse_local("10.0.0.1:6379") is None
    for bad in ("local:0", "local:x", "local:99"):
        with pytest.raises(ConfigError, match="node count"):
            parse_local(bad)
    src = tmp_path / "cache"
    (src / "images" / "done").mkdir(parents=True)
    (src / "images" / "done" / "image.json").write_text("{}")
    (src / "images" / "half").mkdir()
    (src / "images" / ".build-x").mkdir()
    seed_cache(tmp_path / "node", src)
    assert [p.name for p in (tmp_path / "node" / "images").iterdir()] == ["done"]
    assert (tmp_path / "node" / "images" / "done").resolve() == src / "images" / "done"


def test_run_refuses_ray_with_remote_or_a_slower_host(tmp_path: Path) -> None:
    from sandfleet.cli import cli

    make_task(tmp_path / "tasks")
    for extra in (["--remote", "http://127.0.0.1:1"], ["--cpu-fraction", "0.5"]):
        res = CliRunner().invoke(cli, ["run", "--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "o"),
                                        "--ray", "local:2", *extra])
        assert res.exit_code == 2 and "--ray" in res.output, res.output


async def test_pool_options_are_one_bundle_and_a_stray_one_is_named() -> None:
    """Both pools take PoolOptions; an option no pool knows (an untyped caller's typo) or a bad
    count is a ConfigError before any host is reached (none listens on these URLs)."""
    from typing import Any

    from sandfleet.cluster.pool import RolloutPool
    from sandfleet.cluster.services import ServicePool

    stray: dict[str, Any] = {"capacty": 2}
    with pytest.raises(ConfigError, match="no option capacty .*capacity"):
        await ServicePool.create("http://127.0.0.1:9", "t", **stray)
    with pytest.raises(ConfigError, match="no option capacty"):
        await RolloutPool.create("local:1", **stray)
    with pytest.raises(ConfigError, match="placements must be at least 1, not 0"):
        await ServicePool.create("http://127.0.0.1:9", "t", placements=0)
    with pytest.raises(ConfigError, match="capacity must be at least 1, not 0"):
        await RolloutPool.create("local:1", capacity=0)
