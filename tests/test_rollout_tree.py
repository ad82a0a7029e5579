"""Rollouts that branch (issue 44): the bundled example (examples/branch) split at turn 2 into
4 with the shipped scripted model, on real sandboxes; lineage, the prefix once, tree advantages."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from conftest import backend_skip
from sandfleet.cli import cli
from sandfleet.errors import ConfigError
from sandfleet.rollout import OpenAIPolicy, RunConfig, run_suite
from sandfleet.rollout.replay import check_record
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.tree import node_values, parse_branch, tree_advantages
from sandfleet.tasks import load_task
from sandfleet.testing.fake_server import FakeModelServer
from sandfleet.testing.scripted_model import ScriptedModel

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "branch"
SCRIPT = json.loads((EXAMPLE / "script.json").read_text())


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.parametrize(("spec", "why"), [
    ("0:2", "at least 1"), ("2:1", "at least 2 children"), ("3:2,3:2", "must increase"),
    ("3:2,2:2", "must increase"), ("2", "not TURN:WIDTH"), ("a:b", "not TURN:WIDTH"), ("1:2,", "not TURN:WIDTH"),
    ("1:64,2:64", "more than 1024"),
])  # fmt: skip
def test_bad_branch_specs_are_refused_by_name(spec: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_branch(spec)
    res = CliRunner().invoke(cli, ["run", "--tasks", str(EXAMPLE / "tasks"), "--out", "/nonexistent/x",
                                   "--agent", "openai", "--model-url", "http://127.0.0.1:9/v1", "--branch", spec])
    assert res.exit_code == 2 and "--branch" in res.output and why in res.output, res.output


def test_branch_needs_an_agent_that_takes_turns() -> None:
    res = CliRunner().invoke(cli, ["run", "--tasks", str(EXAMPLE / "tasks"), "--out", "/nonexistent/x",
                                   "--agent", "oracle", "--branch", "2:4"])
    assert res.exit_code == 2 and "takes turns" in res.output, res.output
    assert parse_branch("1:2,3:2").leaves == 4 and str(parse_branch(" 2:4 ")) == "2:4"
    with pytest.raises(ConfigError, match="process can't"):
        RunConfig(branch="2:4", backend="process", concurrency=4)
    with pytest.raises(ConfigError, match="less than the group size n=8"):
        RunConfig(n=2, branch="2:4", concurrency=4)  # a group of 2 trees holds 8 slots


def leaf(node: str, reward: float | None, turns: int, tree: str = "t#0") -> RolloutResult:
    r = RolloutResult(rollout_id=f"{tree}/{node}", task="t", group="t", sample=0, agent="a", backend="b",
                      start=0, end=1, status="completed" if reward is not None else "failed", spans=[],
                      reward=reward, turns=turns, reason=None if reward is not None else "sandbox_died",
                      info={} if reward is not None else {"phase": "start"})
    r.tree = {"tree_id": tree, "node_id": node, "parent_node": node.rpartition(".")[0] or None, "branch_turn": 1}
    return r


def test_tree_advantages_are_child_value_minus_parent_value() -> None:
    plan = parse_branch("1:2,2:2")  # root takes turn 1, level-1 nodes turn 2, leaves turns 3+
    leaves = [leaf("0.0.0", 1.0, 3), leaf("0.0.1", 1.0, 3), leaf("0.1.0", 1.0, 4), leaf("0.1.1", 0.0, 3),
              leaf("0.1.2", None, 3)]  # an infra fault: masked, left out of every value
    values = tree_advantages(leaves, plan)["t#0"]
    assert values == {"0": 0.75, "0.0": 1.0, "0.1": 0.5, "0.0.0": 1.0, "0.0.1": 1.0, "0.1.0": 1.0, "0.1.1": 0.0,
                      "0.1.2": None}
    assert leaves[0].tree_advantages == [0.0, 0.25, 0.0]
    assert leaves[2].tree_advantages == [0.0, -0.25, 0.5, 0.5]  # its turn 4 is still its own node's
    assert leaves[3].tree_advantages == [0.0, -0.25, -0.5]
    assert leaves[4].tree_advantages is None and leaves[4].masked
    assert node_values([leaf("0", 1.0, 1, tree="u#1")]) == {"u#1": {"0": 1.0}}


def check_example(out: Path, rows: list[dict[str, Any]]) -> None:
    """The done-when checks of issue 44 on a run of the example with --branch 2:4."""
    assert len(rows) == 4
    by_node = {r["node_id"]: r for r in rows}
    assert sorted(by_node) == ["0.0", "0.1", "0.2", "0.3"]
    assert {r["tree_id"] for r in rows} == {"branch-demo#0"}
    assert all(r["parent_node"] == "0" and r["branch_turn"] == 2 for r in rows)
    assert [by_node[f"0.{k}"]["reward"] for k in range(4)] == [1.0, 0.0, 1.0, 0.0]
    assert len({r["sandbox_id"] for r in rows}) == 4
    records = {r["rollout_id"]: r for r in lines(out / "records.jsonl")}
    group = lines(out / "groups.jsonl")[0]
    for k in range(4):
        row = by_node[f"0.{k}"]
        cmds = records[row["rollout_id"]]["commands"]
        assert len(cmds) == 4 and cmds[0]["command"] == "echo prefix-one > /app/prefix.txt"
        assert cmds[2]["output"] == "prefix-one\nprefix-two\n"  # the child sees what the prefix wrote
        assert f"child-{k}" in cmds[2]["command"]  # and differs afterwards
        assert cmds[3]["output"].split() == [f"c{k}"]  # no sibling's write is seen
        assert records[row["rollout_id"]]["tree"]["node_id"] == f"0.{k}"
        assert group["tree_advantages"][row["rollout_id"]] == [0.0, 0.0] + [0.5 if k % 2 == 0 else -0.5] * 3
    traces = lines(out / "trace.jsonl")
    commands = [s for t in traces for s in t["spans"] if s["name"] == "agent_command"]
    assert sum("prefix-one" in s["command"] for s in commands) == 1  # the prefix's commands once
    assert sum("prefix-two" in s["command"] for s in commands) == 1
    assert len(commands) == 2 + 4 * 2
    models = [s for t in traces for s in t["spans"] if s["name"] == "model"]
    assert len(models) == 2 + 4 * 3
    for t in traces:  # spans tile each line; the prefix's (node 0) only on the first child's
        assert t["spans"][0]["start"] == t["start"] and t["spans"][-1]["end"] == t["end"]
        nodes = {s.get("node") for s in t["spans"]}
        assert nodes == ({"0", "0.0"} if t["node_id"] == "0.0" else {t["node_id"]})
    assert group["trees"]["branch-demo#0"] == {"0": 0.5, "0.0": 1.0, "0.1": 0.0, "0.2": 1.0, "0.3": 0.0}


def backends() -> list[Any]:
    out = []
    for name in ("bwrap", "gvisor", "microvm"):
        marks = [pytest.mark.skipif(backend_skip(name) is not None, reason=str(backend_skip(name)))]
        if name != "bwrap":
            marks.append(pytest.mark.slow)
        out.append(pytest.param(name, marks=marks))
    return out


@pytest.mark.parametrize("backend", backends())
async def test_the_example_branches_at_turn_2_into_4(tmp_path: Path, backend: str) -> None:
    task = load_task(EXAMPLE / "tasks" / "branch-demo")
    model = ScriptedModel(SCRIPT)
    report = await run_suite([task], OpenAIPolicy(model=model), RunConfig(n=1, concurrency=4, backend=backend,
                                                                          branch="2:4"), out_dir=tmp_path)
    assert [r.status for r in report.results] == ["completed"] * 4, [r.error for r in report.results]
    assert len(model.requests) == 2 + 4 * 3  # the prefix's two requests once, then three per child
    assert [m.get("seed") for m in model.requests[:2]] == [0, 0]
    firsts = [m for m in model.requests if sum(x["role"] == "assistant" for x in m["messages"]) == 2]
    assert sorted(m.get("seed") for m in firsts) == [0, 1, 2, 3]  # each child's first request: its own seed
    check_example(tmp_path, lines(tmp_path / "rollouts.jsonl"))
    if backend == "bwrap":  # analyze draws the tree and counts the work saved; replay refuses a leaf
        res = CliRunner().invoke(cli, ["analyze", str(tmp_path), "--json", "--html", str(tmp_path / "r.html")])
        assert res.exit_code == 0, res.output
        ws = json.loads(res.output)["trees"]["A"]["work_saved"]
        assert (ws["trees"], ws["leaves"], ws["branches"]) == (1, 4, 1)
        assert ws["ran"]["commands"] == 10 and ws["independent"]["commands"] == 16 and ws["saved"]["commands"] == 6
        assert ws["ran"]["model_calls"] == 14 and ws["saved"]["model_calls"] == 6  # the prefix's 2 calls, 3 more times
        assert ws["saved"]["model_tokens"] > 0 and ws["saved"]["command_s"] > 0
        html = (tmp_path / "r.html").read_text()
        assert "tree branch-demo#0" in html and html.count("reward 1.0") == 2 and html.count("reward 0.0") == 2
        assert html.count("echo prefix-one") == 1 and all(f"echo child-{k}" in html for k in range(4))
        for record in lines(tmp_path / "records.jsonl"):
            why = check_record(record).refused
            assert len(why) == 1 and why[0].startswith("a leaf of a branched rollout (tree branch-demo#0, node 0."), why


@pytest.mark.skipif(backend_skip("bwrap") is not None, reason=str(backend_skip("bwrap")))
def test_cli_two_levels_over_the_scripted_server(tmp_path: Path) -> None:
    with FakeModelServer(SCRIPT) as server:
        res = CliRunner().invoke(cli, ["run", "--tasks", str(EXAMPLE / "tasks"), "--out", str(tmp_path / "o"),
                                       "--backend", "bwrap", "--agent", "openai", "--model-url", server.url,
                                       "-n", "2", "--branch", "1:2,3:2"])
    assert res.exit_code == 0, res.output
    rows = lines(tmp_path / "o" / "rollouts.jsonl")
    assert len(rows) == 2 * 4 and {r["tree_id"] for r in rows} == {"branch-demo#0", "branch-demo#1"}
    assert sorted(r["node_id"] for r in rows if r["tree_id"] == "branch-demo#0") == [
        "0.0.0", "0.0.1", "0.1.0", "0.1.1"]
    assert {(r["parent_node"], r["branch_turn"]) for r in rows} == {("0.0", 3), ("0.1", 3)}
    group = lines(tmp_path / "o" / "groups.jsonl")[0]
    assert group["n"] == 8 and set(group["trees"]) == {"branch-demo#0", "branch-demo#1"}
    assert len(server.requests) == 2 * (1 + 2 * 2 + 4 * 2)  # per tree: 1 root, 2 per level-1 node, 2 per leaf


@pytest.fixture(scope="module")
def service(running_services: Any) -> Any:
    """The session's shared service, with two tokens of this module's own (tests/conftest.py)."""
    return running_services.view()


@pytest.mark.skipif(backend_skip("bwrap") is not None, reason=str(backend_skip("bwrap")))
def test_the_example_branches_on_a_service_with_remote(tmp_path: Path, service: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """--remote URL: the tree's sandboxes are the service's, branched there (RemoteSandbox.branch)."""
    monkeypatch.setenv("SANDFLEET_TOKEN", service.token)
    with FakeModelServer(SCRIPT) as server:
        res = CliRunner().invoke(cli, ["run", "--tasks", str(EXAMPLE / "tasks"), "--out", str(tmp_path / "o"),
                                       "--backend", "bwrap", "--agent", "openai", "--model-url", server.url,
                                       "--remote", service.url, "--branch", "2:4"])
    assert res.exit_code == 0, res.output
    check_example(tmp_path / "o", lines(tmp_path / "o" / "rollouts.jsonl"))


@pytest.mark.slow
@pytest.mark.skipif(backend_skip("bwrap") is not None, reason=str(backend_skip("bwrap")))
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the ray extra is not installed")
def test_the_example_branches_on_a_local_ray_cluster(tmp_path: Path) -> None:
    """--ray local:1: the group's trees run whole on a node; the lineage and the prefix once as here."""
    with FakeModelServer(SCRIPT) as server:
        res = subprocess.run([sys.executable, "-m", "sandfleet", "run", "--tasks", str(EXAMPLE / "tasks"), "--out",
                              str(tmp_path / "o"), "--backend", "bwrap", "--agent", "openai", "--model-url",
                              server.url, "--ray", "local:1", "--branch", "2:4"],
                             capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = lines(tmp_path / "o" / "rollouts.jsonl")
    check_example(tmp_path / "o", rows)
    assert len({r["info"].get("node") for r in rows}) == 1  # a tree stays on one host


@pytest.mark.skipif(backend_skip("bwrap") is not None, reason=str(backend_skip("bwrap")))
@pytest.mark.parametrize("processes", ["error", "drop"])
async def test_a_process_the_branch_cannot_carry_masks_the_children_or_is_dropped(tmp_path: Path,
                                                                                  processes: str) -> None:
    """The prefix leaves a process running: with processes=error the branch refuses naming it, is
    tried again from the same point (--attempts), and the children are failed leaves, masked,
    saying why; with drop the tree goes on without it."""
    task = load_task(EXAMPLE / "tasks" / "branch-demo")
    script = [{"bash": "echo prefix-one > /app/prefix.txt; setsid sleep 300 > /dev/null 2>&1 &"}, *SCRIPT[1:]]
    report = await run_suite([task], OpenAIPolicy(model=ScriptedModel(script)),
                             RunConfig(n=1, concurrency=4, backend="bwrap", branch="2:4", branch_processes=processes),
                             out_dir=tmp_path)
    rows = lines(tmp_path / "rollouts.jsonl")
    assert sorted(r["node_id"] for r in rows) == ["0.0", "0.1", "0.2", "0.3"]
    if processes == "drop":
        assert [r.reward for r in report.results] == [1.0, 0.0, 1.0, 0.0]
        return
    assert all(r["verdict"] == "infra_fault" and r["reward"] is None and r["info"]["phase"] == "start"
               for r in rows), rows
    assert all("branch failed" in str(r["error"]) and "sleep" in str(r["error"]) for r in rows), rows[0]["error"]
    trace = lines(tmp_path / "trace.jsonl")
    branches = [s for t in trace for s in t["spans"] if s.get("what") == "branch"]
    assert [s["attempt"] for s in branches] == [1, 2]  # refilled from the same point, then given up
    assert report.summary()["verdicts"]["infra_fault"] == 4


@pytest.mark.skipif(backend_skip("bwrap") is not None, reason=str(backend_skip("bwrap")))
async def test_an_infra_fault_in_one_leaf_masks_that_leaf_alone(tmp_path: Path) -> None:
    """Child 1's model request answers 500 (the model server's fault, not the agent's): that leaf
    is masked; its siblings score, and the tree's values leave it out."""
    children = list(SCRIPT[2]["choices"])
    children[1] = {"fault": "500"}
    script = [*SCRIPT[:2], {"choices": children}, *SCRIPT[3:]]
    task = load_task(EXAMPLE / "tasks" / "branch-demo")
    with FakeModelServer(script) as server:
        report = await run_suite([task], OpenAIPolicy(server.url, "fake"),
                                 RunConfig(n=1, concurrency=4, backend="bwrap", branch="2:4"), out_dir=tmp_path)
    by_node = {r.tree["node_id"]: r for r in report.results if r.tree}
    assert by_node["0.1"].verdict == "infra_fault" and by_node["0.1"].reward is None
    assert by_node["0.1"].reason == "model_http_500" and by_node["0.1"].tree_advantages is None
    assert [by_node[f"0.{k}"].reward for k in (0, 2, 3)] == [1.0, 1.0, 0.0]
    group = lines(tmp_path / "groups.jsonl")[0]
    assert group["masked"] == 1 and group["n"] == 3
    values = group["trees"]["branch-demo#0"]
    assert values["0"] == pytest.approx(2 / 3) and values["0.1"] is None
    assert group["tree_advantages"]["branch-demo#0/0.3"][2:] == [pytest.approx(-2 / 3)] * 3


@pytest.mark.skipif(backend_skip("bwrap") is not None, reason=str(backend_skip("bwrap")))
async def test_each_child_goes_on_in_its_copy_of_the_agents_shell(tmp_path: Path) -> None:
    """The branch carries the agent's shell session (cwd, variables): a child's first command
    runs where the prefix left the shell; a child's own change stays its own."""
    task = load_task(EXAMPLE / "tasks" / "branch-demo")
    script = [{"bash": "mkdir -p /app/children && cd /app/children && SEEN=prefix"},
              {"choices": [{"bash": 'echo "$(pwd) $SEEN"; cd /; SEEN=mine'}, {"bash": 'echo "$(pwd) $SEEN"'}]},
              {"bash": 'echo "$(pwd) $SEEN"'}, "Done."]
    await run_suite([task], OpenAIPolicy(model=ScriptedModel(script)),
                    RunConfig(n=1, concurrency=2, backend="bwrap", branch="1:2"), out_dir=tmp_path)
    records = {r["tree"]["node_id"]: r["commands"] for r in lines(tmp_path / "records.jsonl")}
    assert [c["output"] for c in records["0.0"][1:]] == ["/app/children prefix\n", "/ mine\n"]
    assert [c["output"] for c in records["0.1"][1:]] == ["/app/children prefix\n", "/app/children prefix\n"]
