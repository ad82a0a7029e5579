"""Opt-in (marker ``rl``; scripts/test-integrations.sh rl): what a masked completion (sandfleet's
reward function returned None: an infra fault) contributes to TRL's GRPO update, with TRL's own
code (examples/rl/masked_completion.py). Skips without torch/trl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.rl
pytest.importorskip("torch")
pytest.importorskip("trl")

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "rl" / "masked_completion.py"


def test_a_masked_completion_in_trl(tmp_path: Path) -> None:
    out = tmp_path / "mask.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    runs = {(r["loss_type"], r["beta"]): r for r in figures["runs"]}
    for r in runs.values():
        assert r["rewards"] == [1.0, 0.0, 0.0, None]  # scored, scored, policy fault, infra fault
        assert r["group_stats_exclude_masked"] and r["advantages"][3] == 0.0  # not in the group's mean and std
        assert r["per_completion_sum_rel_err"] < 1e-2
    for lt in ("dapo", "grpo"):
        assert runs[(lt, 0.0)]["masked_grad_norm"] == 0.0  # no gradient of its own without KL
        assert runs[(lt, 0.04)]["masked_grad_norm"] > 0.0  # TRL keeps its tokens in the KL term
    dapo = runs[("dapo", 0.0)]  # TRL counts its tokens in the normaliser: the others' gradient shrinks
    tokens = dapo["completion_tokens"]
    assert dapo["unmasked_grad_scale_vs_masked_removed"] == pytest.approx(1 - tokens[3] / sum(tokens), rel=1e-3)
    assert runs[("grpo", 0.0)]["unmasked_grad_scale_vs_masked_removed"] == pytest.approx(3 / 4, rel=1e-3)
