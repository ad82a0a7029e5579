"""SkyRL's Harbor path on sandfleet's Harbor environment: the trial config SkyRL's
``HarborGenerator`` builds (its ``harbor_trial_config`` template with ``task.path`` set per
trajectory), with ``environment.import_path`` naming sandfleet's environment, validated by
Harbor's ``TrialConfig``, run as a Harbor ``Trial``, and the reward read where SkyRL reads it
(``verifier_result.rewards["reward"]``).

SkyRL's generator itself is not run (it is in SkyRL's repository examples, not its wheels, and
needs its vLLM inference engine); the agents are Harbor's ``oracle`` (right) and ``nop``
(wrong) instead of ``terminus-2`` and a model. SkyRL's code calls ``Trial(config)``, written for the
Harbor commit it pins; Harbor 0.25 wants ``await Trial.create(config)``, used here. Opt-in
(marker ``skyrl``): ``scripts/test-integrations.sh skyrl`` runs it in the Harbor venv.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.skyrl,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # Harbor 0.25 warns about its own API
    pytest.mark.skipif(importlib.util.find_spec("harbor") is None,
                       reason="needs Harbor (scripts/test-integrations.sh skyrl runs it in the Harbor venv)"),
]

TASK = Path(__file__).resolve().parent.parent / "examples" / "tasks" / "csv-awk-aggregate"


def skyrl_template(trials: Path) -> dict[str, Any]:
    """The fields of SkyRL's default harbor_trial_config that the oracle and nop agents take,
    with the one change: the environment is sandfleet's."""
    return {
        "trials_dir": str(trials),
        "timeout_multiplier": 1.0,
        "agent": {"override_timeout_sec": 1200, "kwargs": {}},
        "environment": {
            "type": None,
            "import_path": "sandfleet.integrations.harbor:SandfleetEnvironment",
            "override_cpus": 1,
            "override_memory_mb": 1024,
            "override_storage_mb": 1024,
            "kwargs": {"backend": os.environ.get("BACKEND", "bwrap")},
        },
        "verifier": {"disable": False},
    }


async def one_trial(template: dict[str, Any], agent: str) -> Any:
    from harbor.models.trial.config import TrialConfig
    from harbor.trial.trial import Trial

    config = deepcopy(template)  # as HarborGenerator.harbor_agent_loop does, per attempt
    config["task"] = {"path": str(TASK)}
    config["agent"]["name"] = agent
    trial = await Trial.create(TrialConfig.model_validate(config))
    return await trial.run()


def test_skyrl_trial_config_on_sandfleet(tmp_path: Path) -> None:
    os.environ.setdefault("HARBOR_TELEMETRY", "0")
    template = skyrl_template(tmp_path / "trials")

    async def main() -> dict[str, Any]:
        return {agent: await one_trial(template, agent) for agent in ("oracle", "nop")}

    results = asyncio.run(main())
    for agent, res in results.items():
        assert res.exception_info is None, (agent, res.exception_info)
        assert res.verifier_result is not None, agent  # SkyRL retries a trial without one
    assert results["oracle"].verifier_result.rewards["reward"] == 1.0
    assert results["nop"].verifier_result.rewards["reward"] == 0.0
