"""Reading a verifier's reward: Harbor's reward files and Terminal-Bench-1's pytest output.

Harbor's ``tests/test.sh`` writes ``/logs/verifier/reward.txt`` (one number) or
``/logs/verifier/reward.json`` (an object of numbers). Terminal-Bench-1 parses the test
command's output with pytest's short summary (``pytest -rA``): a task is resolved when every
test passed (SKIPPED and XFAIL count as passed, as in TB1) -- and, stricter than TB1, at
least one test ran.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from sandfleet.errors import RolloutError
from sandfleet.tasks.model import VerifierPlan


@dataclass(frozen=True)
class Reward:
    """A verifier's verdict."""

    value: float
    """The scalar reward."""
    details: dict[str, float] = field(default_factory=dict)
    """Named parts (Harbor reward.json keys; TB1 test name -> 1.0 passed / 0.0 failed)."""


def parse_reward_text(text: str) -> Reward:
    """Harbor ``reward.txt``: one finite number."""
    try:
        value = float(text.strip())
    except ValueError:
        raise RolloutError(
            f"reward.txt must hold one number, got {text.strip()[:80]!r}", reason="reward_malformed"
        ) from None
    if not math.isfinite(value):
        raise RolloutError(f"reward.txt holds {value}", reason="reward_malformed")
    return Reward(value, {"reward": value})


def parse_reward_json(text: str) -> Reward:
    """Harbor ``reward.json``: an object of numbers. The scalar is its ``reward`` key, else
    its only value, else the mean of its values."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RolloutError(f"reward.json is not JSON: {e}", reason="reward_malformed") from None
    if isinstance(data, bool) or not isinstance(data, dict | int | float):
        raise RolloutError("reward.json must be an object of numbers", reason="reward_malformed")
    if not isinstance(data, dict):
        data = {"reward": data}
    details: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RolloutError(f"reward.json: {key!r} is not a number", reason="reward_malformed")
        if not math.isfinite(value):
            raise RolloutError(f"reward.json: {key!r} is {value}", reason="reward_malformed")
        details[str(key)] = float(value)
    if not details:
        raise RolloutError("reward.json is empty", reason="reward_malformed")
    if "reward" in details:
        scalar = details["reward"]
    else:
        scalar = sum(details.values()) / len(details)
    return Reward(scalar, details)


_SUMMARY_HEADER = re.compile(r"=+\s*short test summary info\s*=+", re.IGNORECASE)
_STATUS_LINE = re.compile(r"^(PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)\s+(?:\[\d+\]\s+)?(\S+)")
_COUNTS = re.compile(
    r"(\d+) (passed|failed|error|errors|skipped|xfailed|xpassed|deselected|warnings?)\b"
)
_GOOD = {"PASSED", "SKIPPED", "XFAIL"}


def parse_pytest_output(output: str) -> Reward:
    """TB1's pytest parser, plus a fallback on pytest's final ``N passed, M failed`` line.

    The reward is 1.0 when at least one test ran and none failed, else 0.0 (also when the
    output holds no pytest result at all)."""
    parts = _SUMMARY_HEADER.split(output, maxsplit=1)
    results: dict[str, float] = {}
    if len(parts) == 2:
        for line in parts[1].splitlines():
            match = _STATUS_LINE.match(line.strip())
            if match:
                status, test = match.groups()
                name = test.split("::", 1)[-1]
                # a name seen twice keeps its worst status
                results[name] = min(results.get(name, 1.0), 1.0 if status in _GOOD else 0.0)
    if results:
        return Reward(1.0 if all(v == 1.0 for v in results.values()) else 0.0, results)
    counts: dict[str, int] = {}
    for line in reversed(output.splitlines()):
        found = _COUNTS.findall(line)
        if found and re.search(r"\bin [\d.]+s\b", line):
            counts = {kind.rstrip("s"): int(n) for n, kind in found}
            break
    ran = counts.get("passed", 0) + counts.get("failed", 0) + counts.get("xpassed", 0)
    bad = counts.get("failed", 0) + counts.get("error", 0) + counts.get("xpassed", 0)
    ok = ran > 0 and bad == 0
    return Reward(1.0 if ok else 0.0, {k: float(v) for k, v in counts.items()})


def reward_from(
    plan: VerifierPlan,
    *,
    output: str = "",
    reward_text: str | None = None,
    reward_json: str | None = None,
) -> Reward:
    """The reward of one verifier run, read the way the task's format reads it.

    ``output`` is the verifier command's stdout+stderr; ``reward_text`` / ``reward_json`` are
    the contents of the plan's reward files (None when absent). A Harbor verifier that wrote
    neither file raises :class:`RolloutError` (``reason="reward_missing"``), as Harbor does.
    """
    if plan.reward == "pytest-output":
        if plan.parser_name not in (None, "pytest"):
            raise RolloutError(f"parser {plan.parser_name!r} is not supported", reason="parser")
        return parse_pytest_output(output)
    if reward_text is not None:
        return parse_reward_text(reward_text)
    if reward_json is not None:
        return parse_reward_json(reward_json)
    raise RolloutError(
        f"the verifier wrote neither {plan.reward_text_path} nor {plan.reward_json_path}",
        reason="reward_missing",
    )
