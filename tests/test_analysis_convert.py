"""Harbor trial results converted into sandfleet traces, then analyzed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sandfleet.analysis import TraceError, analyze, load_run
from sandfleet.analysis.convert import convert, harbor_job
from sandfleet.cli.analyze import analyze as analyze_cmd


def timing(start: str | None, end: str | None) -> dict[str, Any]:
    return {"started_at": start, "finished_at": end}


def trial(
    task: str,
    name: str,
    t: dict[str, Any],
    reward: float | None,
    exception: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A trial ``result.json`` the way Harbor's ``TrialResult`` serializes it."""
    return {
        "id": "4b0e4d43-5d2b-4c55-9a0c-0a6f1b9b2f11",
        "task_name": task,
        "trial_name": name,
        "trial_uri": f"file:///jobs/2025-11-29__10-15-00/{name}",
        "task_id": {"path": f"tasks/{task}"},
        "source": "terminal-bench",
        "task_checksum": "9f2c7d1e",
        "config": {
            "task": {"path": f"tasks/{task}", "git_url": None},
            "trial_name": name,
            "trials_dir": "jobs/2025-11-29__10-15-00",
            "timeout_multiplier": 1.0,
            "agent": {"name": "terminus-2", "model_name": "openai/gpt-5-mini", "kwargs": {}},
            "environment": {"type": "docker", "force_build": False, "delete": True},
            "verifier": {"override_timeout_sec": None},
            "job_id": "e7c1a9a0-0000-4000-8000-000000000001",
        },
        "agent_info": {
            "name": "terminus-2",
            "version": "2.0.0",
            "model_info": {"name": "gpt-5-mini", "provider": "openai"},
        },
        "agent_result": {
            "n_input_tokens": 48211,
            "n_cache_tokens": 30112,
            "n_output_tokens": 2210,
            "cost_usd": 0.0213,
            "metadata": {},
        },
        "verifier_result": None if reward is None else {"rewards": {"reward": reward}},
        "exception_info": exception,
        "started_at": t["started_at"],
        "finished_at": t["finished_at"],
        "environment_setup": t.get("environment_setup"),
        "agent_setup": t.get("agent_setup"),
        "agent_execution": t.get("agent_execution"),
        "verifier": t.get("verifier"),
    }


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    job = tmp_path / "2025-11-29__10-15-00"
    trials = [
        trial(
            "hello-world",
            "hello-world__Xk3pQ9a",
            {
                "started_at": "2025-11-29T10:15:00.000000",
                "environment_setup": timing(
                    "2025-11-29T10:15:00.100000", "2025-11-29T10:15:12.100000"
                ),
                "agent_setup": timing("2025-11-29T10:15:12.200000", "2025-11-29T10:15:20.200000"),
                "agent_execution": timing(
                    "2025-11-29T10:15:20.200000", "2025-11-29T10:16:20.200000"
                ),
                "verifier": timing("2025-11-29T10:16:20.700000", "2025-11-29T10:16:30.700000"),
                "finished_at": "2025-11-29T10:16:31.000000",
            },
            reward=1.0,
        ),
        trial(
            "hello-world",
            "hello-world__Lm7rT2b",
            {
                "started_at": "2025-11-29T10:15:00.000000+00:00",
                "environment_setup": timing(
                    "2025-11-29T10:15:00+00:00", "2025-11-29T10:15:10+00:00"
                ),
                "agent_setup": timing("2025-11-29T10:15:10+00:00", "2025-11-29T10:15:15+00:00"),
                "agent_execution": timing("2025-11-29T10:15:15+00:00", None),  # timed out
                "verifier": timing("2025-11-29T10:30:15+00:00", "2025-11-29T10:30:25+00:00"),
                "finished_at": "2025-11-29T10:30:25+00:00",
            },
            reward=0.0,
            exception={
                "exception_type": "AgentTimeoutError",
                "exception_message": "Agent execution timed out after 900.0 seconds",
                "exception_traceback": "Traceback (most recent call last): ...",
                "occurred_at": "2025-11-29T10:30:15",
            },
        ),
        trial(
            "fix-git",
            "fix-git__Qa1bC3d",
            {
                "started_at": "2025-11-29T10:15:01Z",
                "environment_setup": timing("2025-11-29T10:15:01Z", None),
                "finished_at": "2025-11-29T10:15:31Z",
            },
            reward=None,
            exception={
                "exception_type": "RuntimeError",
                "exception_message": "Docker compose command failed",
                "exception_traceback": "...",
                "occurred_at": "2025-11-29T10:15:31",
            },
        ),
    ]
    for t in trials:
        (job / t["trial_name"]).mkdir(parents=True)
        (job / t["trial_name"] / "result.json").write_text(json.dumps(t, indent=2))
        (job / t["trial_name"] / "config.json").write_text(json.dumps(t["config"]))
    (job / "config.json").write_text(json.dumps({"job_name": job.name, "n_attempts": 2}))
    (job / "result.json").write_text(
        json.dumps(
            {
                "id": "e7c1a9a0-0000-4000-8000-000000000001",
                "started_at": "2025-11-29T10:15:00",
                "finished_at": "2025-11-29T10:30:30",
                "n_total_trials": 3,
                "stats": {"n_trials": 3, "n_errors": 2, "evals": {}},
            }
        )
    )
    return job


def test_harbor_phases_become_tiled_spans(job_dir: Path) -> None:
    recs = {r["rollout_id"]: r for r in harbor_job(job_dir)}
    assert len(recs) == 3
    ok = recs["hello-world__Xk3pQ9a"]
    assert ok["status"] == "completed" and ok["reward"] == 1.0 and ok["error"] is None
    assert ok["model_time_known"] is False and ok["backend"] == "harbor:docker"
    names = [(s["name"], round(s["end"] - s["start"], 3)) for s in ok["spans"]]
    assert names == [
        ("overhead", 0.1),
        ("sandbox_start", 12.0),
        ("overhead", 0.1),
        ("other_sandbox", 8.0),
        ("agent_command", 60.0),
        ("overhead", 0.5),
        ("verifier", 10.0),
        ("overhead", 0.3),
    ]
    assert ok["spans"][4]["model_time_known"] is False
    timed_out = recs["hello-world__Lm7rT2b"]
    assert timed_out["status"] == "completed" and timed_out["reward"] == 0.0
    assert timed_out["error"].startswith("AgentTimeoutError: Agent execution timed out")
    agent = next(s for s in timed_out["spans"] if s["name"] == "agent_command")
    assert agent["end"] - agent["start"] == pytest.approx(900.0)  # closed by the verifier
    assert {ok["sample"], timed_out["sample"]} == {0, 1} and ok["group"] == "hello-world"
    broken = recs["fix-git__Qa1bC3d"]
    assert broken["status"] == "failed" and broken["reward"] is None
    assert [s["name"] for s in broken["spans"]] == ["sandbox_start"]


def test_converted_run_loads_and_analyzes(job_dir: Path, tmp_path: Path) -> None:
    path, n = convert("harbor", job_dir, tmp_path / "run")
    assert n == 3 and path == tmp_path / "run" / "trace.jsonl"
    run = load_run(path.parent)
    assert not run.model_time_known and len(run.completed) == 2
    a = analyze([run])
    assert a["kv_idle_fraction"]["A"] is None  # no model spans: unknown, not zero
    assert a["spans_mean_s"]["A"]["agent_command"] == pytest.approx(480.0)
    assert a["spans_mean_s"]["A"]["model"] == 0
    # no model time to divide by k: not applicable, said why (not a flat curve)
    assert a["whatif"] is None and a["whatif_detail"] is None
    assert "agent_command" in a["whatif_not_applicable"]


def test_convert_from_the_cli(job_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "converted"
    res = CliRunner().invoke(analyze_cmd, ["--convert", "harbor", str(job_dir), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote 3 rollouts" in res.output
    html = tmp_path / "report.html"
    res = CliRunner().invoke(analyze_cmd, [str(out), "--html", str(html)])
    assert res.exit_code == 0, res.output
    assert "model time unknown" in res.output
    assert "not applicable: run A" in res.output
    page = html.read_text()
    assert 'data-chart="whatif"' not in page and "Not applicable: run A" in page
    assert 'data-chart="breakdown"' in page and 'data-chart="group-wait"' in page
    assert 'data-chart="kv-idle"' not in page and "data-chart-omitted='kv-idle'" in page


def test_convert_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no Harbor trial results"):
        harbor_job(tmp_path)
    bad = tmp_path / "t1" / "result.json"
    bad.parent.mkdir()
    bad.write_text('{"trial_name": "t1", "started_at": "yesterday"}')
    with pytest.raises(TraceError, match=r"result\.json: started_at: not an ISO timestamp"):
        harbor_job(tmp_path)
    res = CliRunner().invoke(
        analyze_cmd, ["--convert", "harbor", str(tmp_path / "none"), "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 2 and res.output.startswith("error: ")
