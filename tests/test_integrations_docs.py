"""The constructor examples of docs/integrations.md run as written (issue 47: TRL's
SandfleetReward had none)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "integrations.md"


def _block(section: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {section}")
    end = text.index("\n## ", start + 1)
    m = re.search(r"```python\n(.*?)```", text[start:end], re.S)
    assert m is not None, f"no python block under '## {section}'"
    return m.group(1)


def test_trl_reward_example_builds_the_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandfleet.integrations.trl import Runner, SandfleetReward

    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {}
    exec(compile(_block("TRL"), str(DOC), "exec"), scope)  # noqa: S102 (the doc's own example)
    reward = scope["reward"]
    assert isinstance(reward, SandfleetReward) and isinstance(reward.runner, Runner)
    assert (reward.concurrency, reward.timeout_s, reward.tasks_root) == (8, 60.0, "examples/tasks")
    assert reward.runner.on_result is not None
    scope["trace"].close()  # type: ignore[attr-defined]
    assert (tmp_path / "trace.jsonl").exists()
