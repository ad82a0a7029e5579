"""Replay's parts that need no sandbox: the normalizers, the tamper check, the comparison."""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from typing import Any

import pytest

from sandfleet.rollout.chat import ChatReply
from sandfleet.rollout.normalize import DEFAULT, NORMALIZERS, check_names, first_difference, normalize
from sandfleet.rollout.record import HEAD, Tape, item_sha, sha, tampered
from sandfleet.rollout.replay import compare


@pytest.mark.parametrize(("text", "want"), [
    ("Thu Dec  3 21:44:54 UTC 2026", "<date>"),
    ("2026-12-03T21:44:54.123Z done", "<date> done"),
    ("at 21:44:54.5", "at <time>"),
    ("stamp 1764798294", "stamp <epoch>"),
    ("6 passed in 0.27s", "6 passed in <duration>"),
    ("real\t0m0.003s", "real\t<duration>"),
    ("wrote /tmp/tmp.AbCdEf1234/x", "wrote /tmp/<temp>/x"),
    ("tmpk3j_2x9q", "<temp>"),
    ("[main 95e5288] Add discount", "[main <hash>] Add discount"),
    ("*   9697678 Merge branch 'feature/i18n'", "*   <hash> Merge branch 'feature/i18n'"),  # digits alone
    ("| * 1234567 fix", "| * <hash> fix"),
    ("[main (root-commit) 7654321] init", "[main (root-commit) <hash>] init"),
    ("HEAD is now at 1020304 seed", "HEAD is now at <hash> seed"),
    ("<method count of str object at 0x2801ffc0>", "<method count of str object at 0x<addr>>"),
    ("pid 1234 [5678]", "pid <pid> [<pid>]"),
    ("===== 3 passed in 0.27s =====  ", "=== 3 passed in <duration> ==="),
    ("ok 3 tests, 42 rows", "ok 3 tests, 42 rows"),  # plain numbers stay
])
def test_normalizers(text: str, want: str) -> None:
    assert normalize(text) == want


def test_each_normalizer_can_be_turned_off() -> None:
    text = "took 0.5s at 21:44:54 pid 7"
    assert normalize(text, ()) == text
    assert normalize(text, [n for n in DEFAULT if n != "durations"]) == "took 0.5s at <time> pid <pid>"
    assert check_names(["dates"]) == ("dates",)
    with pytest.raises(ValueError, match="unknown normalizer nope; known: " + ", ".join(NORMALIZERS)):
        check_names(["nope"])


def test_first_difference() -> None:
    assert first_difference("a\nb\n", "a\nb\n") is None
    assert first_difference("a\nb", "a\nc") == {"line": 2, "recorded": "b", "replayed": "c"}
    assert first_difference("a", "a\nextra") == {"line": 2, "recorded": None, "replayed": "extra"}


def _record() -> dict[str, Any]:
    cmd = {"i": 0, "turn": 1, "command": "make", "shell": True, "exit_code": 0, "output": "built in 0.3s\n",
           "output_sha": sha("built in 0.3s\n"), "cap": 8192}
    cmd["sha"] = item_sha(cmd)
    rec: dict[str, Any] = {k: {"x": k} for k in HEAD}
    rec.update(rollout_id="t#0", task="t", commands=[cmd], requests=[], result={"reward": 1.0})
    rec["head"] = {k: sha(rec[k]) for k in HEAD}
    return rec


def test_tampered_names_what_was_edited() -> None:
    rec = _record()
    assert tampered(rec) == []
    edited = copy.deepcopy(rec)
    edited["commands"][0]["exit_code"] = 1
    edited["image"] = {"ref": "other"}
    assert tampered(edited) == ["the record's image was changed after recording",
                                "commands[0] (turn 1): its output or exit code was changed after recording"]
    del edited["head"]
    assert tampered(edited)[0].startswith("the record's head has no digests")


def test_compare_identical_drifted_diverged() -> None:
    rec = _record()
    same = {"commands": [dict(rec["commands"][0], output="built in 0.4s\n", output_sha=sha("built in 0.4s\n"))]}
    row = compare(rec, same, 1.0, None)
    assert row["status"] == "identical" and row["command_rows"][0]["output"] == "same after normalizers"
    row = compare(rec, same, 1.0, None, normalizers=())
    assert row["status"] == "drifted" and row["command_rows"][0]["output"]["line"] == 1
    assert compare(rec, same, 0.0, None)["status"] == "drifted"  # the reward flipped
    row = compare(rec, {"commands": []}, None, {"turn": 1, "what": "command 1 is `x`"})
    assert row["status"] == "diverged" and not row["same_reward"] and row["command_rows"][0]["ran"] is False


class _Engine:
    """A trainer's engine as the agent loop sees it: its reply carries what JSON can't hold."""

    model = "engine"

    async def complete(self, messages: list[dict[str, Any]], **kw: Any) -> ChatReply:
        return ChatReply(content="done", raw_message={"role": "assistant", "content": "done"},
                         raw_choice={"message": {"role": "assistant", "content": "done"}, "token_ids": {1, 2}})


async def test_taping_takes_what_json_cannot_hold() -> None:
    tape = Tape("full")
    model = tape.model(_Engine())
    await model.complete([{"role": "user", "content": "hi"}], extra={"seed": Decimal("1.5")})
    (entry,) = tape.requests
    assert tape.error is None and entry["reply"]["token_ids"] == "{1, 2}" and entry["params"]["extra"]["seed"] == "1.5"
    assert json.loads(json.dumps(entry)) == entry and entry["sha"] == item_sha(entry)
