"""Reading a verifier's reward: Harbor's reward files and Terminal-Bench-1's pytest output.

Harbor's ``tests/test.sh`` writes ``/logs/verifier/reward.txt`` (one number) or
``/logs/verifier/reward.json`` (an object of numbers), or both. When both exist they must
agree: reward.txt's number must equal what reward.json gives by :data:`DEFAULT_RULE` (to
:data:`AGREE_TOL`), else the reward is 0 (``reward_conflict``) -- code under test that writes
the file test.sh did not write can't raise the reward (a common Harbor pattern writes
reward.json, then copies its value into reward.txt: it agrees). The reward that trains must be
finite and within the task's ``reward_range`` (default [0, 1]), else 0 (``bad_reward_value``).
Which of several named rewards trains is chosen by ``--reward-key NAME`` (that one) or
``--reward-weights a=0.7,b=0.3`` (their weighted sum); by default it is the ``reward`` key,
else the only key, else the mean of all keys (:data:`DEFAULT_RULE`). Every named reward is
kept in ``Reward.details`` whatever trains. Terminal-Bench-1 parses the test
command's output with pytest's short summary (``pytest -rA``): a task is resolved when every
test passed (SKIPPED and XFAIL count as passed, as in TB1) -- and, stricter than TB1, at
least one test ran.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

from sandfleet.errors import RolloutError
from sandfleet.tasks.model import Task, VerifierPlan
from sandfleet.tasks.witness import TESTS_STATUS, read_witness


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
            f"reward.txt must hold one number, got {text.strip()[:80]!r}", reason="bad_reward_value"
        ) from None
    if not math.isfinite(value):
        raise RolloutError(f"reward.txt holds {value}", reason="bad_reward_value")
    return Reward(value, {"reward": value})


DEFAULT_RULE = "the 'reward' key, else the only key, else the mean of all keys"
"""What trains from a reward.json without ``--reward-key``/``--reward-weights``."""


def parse_reward_json(text: str) -> Reward:
    """Harbor ``reward.json``: an object of numbers (a bare number counts as ``reward``). The
    scalar is :data:`DEFAULT_RULE`; :func:`select_reward` chooses otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RolloutError(f"reward.json is not JSON: {e}", reason="bad_reward_value") from None
    if isinstance(data, bool) or not isinstance(data, dict | int | float):
        raise RolloutError("reward.json must be an object of numbers", reason="bad_reward_value")
    if not isinstance(data, dict):
        data = {"reward": data}
    details: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RolloutError(f"reward.json: {key!r} is not a number", reason="bad_reward_value")
        if isinstance(value, int) and abs(value) > 2**53 or not math.isfinite(value):  # 10**400 overflows
            raise RolloutError(f"reward.json: {key!r} is {str(value)[:40]}", reason="bad_reward_value")
        details[str(key)] = float(value)
    if not details:
        raise RolloutError("reward.json is empty", reason="bad_reward_value")
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
    return _read_pytest_output(output)[0]


def _read_pytest_output(output: str) -> tuple[Reward, bool]:
    """:func:`parse_pytest_output`'s reward, and whether it was read test by test from the summary
    (its details are the tests' names) rather than from pytest's last line (they are its counts)."""
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
        return Reward(1.0 if all(v == 1.0 for v in results.values()) else 0.0, results), True
    counts: dict[str, int] = {}
    for line in reversed(output.splitlines()):
        found = _COUNTS.findall(line)
        if found and re.search(r"\bin [\d.]+s\b", line):
            counts = {kind.rstrip("s"): int(n) for n, kind in found}
            break
    ran = counts.get("passed", 0) + counts.get("failed", 0) + counts.get("xpassed", 0)
    bad = counts.get("failed", 0) + counts.get("error", 0) + counts.get("xpassed", 0)
    ok = ran > 0 and bad == 0
    return Reward(1.0 if ok else 0.0, {k: float(v) for k, v in counts.items()}), False


def _shown(details: dict[str, float]) -> str:
    """What the parser read, short: ``test_a=1, test_b=1`` (the first 5)."""
    shown = ", ".join(f"{k}={v:g}" for k, v in list(details.items())[:5])
    return (shown + (f" and {len(details) - 5} more" if len(details) > 5 else "")) or "nothing"


def parse_reward_weights(text: str) -> dict[str, float]:
    """``a=0.7,b=0.3`` into weights; ValueError naming what is wrong."""
    weights: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        name, eq, value = part.partition("=")
        if not part or not eq or not name.strip():
            raise ValueError(f"expected NAME=WEIGHT[,NAME=WEIGHT...], got {part!r}")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"weight of {name.strip()!r} is not a number: {value!r}") from None
        if not math.isfinite(weight):
            raise ValueError(f"weight of {name.strip()!r} is {weight}")
        weights[name.strip()] = weight
    return weights


def select_reward(reward: Reward, key: str | None = None, weights: dict[str, float] | None = None) -> Reward:
    """The reward that trains: ``key``'s value, or the ``weights``-weighted sum of the named
    rewards, or (neither) ``reward`` as parsed. A named reward that is missing raises
    :class:`RolloutError` (``reason="reward_key_missing"``) naming it and those present."""
    if key is None and not weights:
        return reward
    wanted = [key] if key is not None else list(weights or {})
    missing = [k for k in wanted if k not in reward.details]
    if missing:
        have = ", ".join(sorted(reward.details)) or "none"
        flag = "--reward-key" if key is not None else "--reward-weights"
        raise RolloutError(f"the verifier's rewards have no {', '.join(map(repr, missing))} ({flag}); "
                           f"they have: {have}", reason="reward_key_missing")
    if key is not None:
        return Reward(reward.details[key], reward.details)
    assert weights
    return Reward(sum(w * reward.details[k] for k, w in weights.items()), reward.details)


def with_reward_selection(task: Task, key: str | None = None, weights: dict[str, float] | None = None) -> Task:
    """``task`` with ``--reward-key``/``--reward-weights`` applied (Harbor reward files only:
    a TB1 task's reward is its pytest verdict, unchanged)."""
    if key is not None and weights:
        raise ValueError("choose --reward-key or --reward-weights, not both")
    if task.verifier.reward != "reward-file" or (key is None and not weights):
        return task
    plan = task.verifier.model_copy(update={"reward_key": key, "reward_weights": weights or None})
    return task.model_copy(update={"verifier": plan})


AGREE_TOL = 1e-6
"""How far reward.txt and reward.json may differ (absolute, or relative to the larger)."""


def check_range(plan: VerifierPlan, reward: Reward) -> Reward:
    """``reward`` when its value is finite and within the plan's ``reward_range``; else
    :class:`RolloutError` (``reason="bad_reward_value"``)."""
    lo, hi = plan.reward_range
    if not math.isfinite(reward.value) or not lo <= reward.value <= hi:
        raise RolloutError(f"the reward {reward.value!r} is outside the task's range [{lo:g}, {hi:g}]",
                           reason="bad_reward_value")
    return reward


def file_reward(plan: VerifierPlan, reward_text: str | None, reward_json: str | None) -> Reward:
    """The reward of Harbor's reward files: one of them, or both when they agree (module doc)."""
    if reward_json is None and reward_text is None:
        raise RolloutError(f"the verifier wrote neither {plan.reward_text_path} nor {plan.reward_json_path}",
                           reason="no_reward_file")
    if reward_json is None:
        assert reward_text is not None
        return select_reward(parse_reward_text(reward_text), plan.reward_key, plan.reward_weights)
    parsed = parse_reward_json(reward_json)
    if reward_text is not None:
        text = parse_reward_text(reward_text).value
        if not math.isclose(text, parsed.value, rel_tol=AGREE_TOL, abs_tol=AGREE_TOL):
            raise RolloutError(f"reward.txt holds {text!r} but reward.json gives {parsed.value!r}: both files "
                               "exist and disagree", reason="reward_conflict")
    return select_reward(parsed, plan.reward_key, plan.reward_weights)


SCAN_MAX_BYTES = 1 << 20
"""Test files larger than this are not searched for the reward files' names."""


def named_reward_files(plan: VerifierPlan) -> set[str] | None:
    """Which of the plan's reward files (their paths) the task's test files name; None when
    they name neither (the name is made some other way, or the tests are baked into an
    image) and nothing can be said. A reward file the tests never name, found beside one they
    do, was written by something else: code under test."""
    names = {plan.reward_text_path: posixpath.basename(plan.reward_text_path).encode(),
             plan.reward_json_path: posixpath.basename(plan.reward_json_path).encode()}
    found: set[str] = set()
    files: list[Path] = []
    for up in plan.uploads:
        src = Path(up.source)
        files += sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src]
    for f in files[:5000]:
        try:
            if f.stat().st_size > SCAN_MAX_BYTES:
                continue
            data = f.read_bytes()
        except OSError:
            continue
        found |= {path for path, name in names.items() if name in data}
        if len(found) == len(names):
            break
    return found or None


def reward_from(
    plan: VerifierPlan,
    *,
    output: str = "",
    reward_text: str | None = None,
    reward_json: str | None = None,
    test_status: str | None = None,
    witness: str | None = None,
    exit_code: int | None = None,
) -> Reward:
    """The reward of one verifier run, read the way the task's format reads it.

    ``output`` is the verifier command's stdout+stderr; ``reward_text`` / ``reward_json`` are
    the contents of the plan's reward files (None when absent); ``test_status`` the test command's
    exit status as a SWE-bench eval.sh kept it (None: an older eval.sh, the log's own line is read);
    ``witness`` the outcomes the tests' pytest wrote to the kept witness file (None: none ran under the
    guard), which a pass read from the output must not contradict; ``exit_code`` the test command's
    own (a TB1 pass read from its output needs 0: ``tests_status``, naming both);
    when both reward files exist they must agree
    (module doc). Whatever the agent could have caused raises :class:`RolloutError` with a
    reason the verifier scores 0 with: ``no_reward_file`` (neither file), ``reward_conflict``,
    ``bad_reward_value`` (not a number / an object of numbers, not finite, outside
    ``reward_range``), ``reward_key_missing``. The plan's
    ``reward_key``/``reward_weights`` choose what trains (:func:`select_reward`).
    """
    if plan.reward == "swebench":  # graded by the swebench package (tasks/swebench.py)
        from sandfleet.tasks.swebench import grade_log

        status = test_status.strip() if test_status is not None else ""
        if test_status is not None and not status.lstrip("-").isdigit():
            raise RolloutError(f"the test command's kept exit status is not a number: {status[:40]!r}",
                               reason="bad_reward_value")
        return Reward(*grade_log(output, plan.grading or {}, int(status) if status else None,
                                 read_witness(witness)))
    if plan.reward == "pytest-output":
        if plan.parser_name not in (None, "pytest"):
            raise RolloutError(f"parser {plan.parser_name!r} is not supported", reason="parser")
        parsed, by_summary = _read_pytest_output(output)
        if parsed.value > 0 and exit_code not in (None, 0):
            # the output is a stream the code under test shares with pytest (it prints there, swaps pytest's
            # writer, kills pytest after its own summary of passes): the tests decided a pass only if the
            # test command that printed it ended with 0 as well, which the seal and the guard keep theirs
            raise RolloutError(f"the tests' output reads as a pass ({plan.parser_name or 'pytest'} parser: "
                               f"{_shown(parsed.details)}), but the test command exited {exit_code}: the code "
                               "under test writes to that output too, so it decides nothing alone (a task whose "
                               "run-tests.sh ends with something else than its tests ends with their status "
                               "instead)", reason=TESTS_STATUS)
        seen = read_witness(witness)
        if seen is not None and parsed.value > 0:
            # each test the summary names passing; by pytest's last line alone (no summary), every test
            wrong = seen.contradicts(list(parsed.details) if by_summary else sorted(seen.failed), by_name=True)
            if wrong:
                raise RolloutError(f"the tests' output reads as a pass, but pytest itself did not report it to "
                                   f"sandfleet's witness ({'; '.join(wrong[:3])}): the output is not what the "
                                   "tests decided", reason=TESTS_STATUS)
        return parsed
    return check_range(plan, file_reward(plan, reward_text, reward_json))
