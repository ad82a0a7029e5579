"""The real-model server's text side (no model needed): a conversation with tool calls as
text for a template that knows no tools, and tool calls read back out of a reply. The
server itself runs in the opt-in suite (tests/test_rollout_model.py)."""

from __future__ import annotations

import json

import pytest

from sandfleet.rollout.loop import BASH_TOOL
from sandfleet.testing.hf_server import parse_tool_calls, template_messages


def test_tool_calls_and_results_are_written_as_text_and_the_tools_listed() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls -a"}'}}
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Look."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "exit code: 0\n."},
            {"role": "assistant", "content": [{"type": "text", "text": "Done"}, {"type": "text", "text": "."}]}]
    out = template_messages(msgs, [BASH_TOOL])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant"]
    assert out[0]["content"].startswith("Be brief.\n\n# Tools") and '"name": "bash"' in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -a"}}\n</tool_call>'
    assert out[3]["content"] == "<tool_response>\nexit code: 0\n.\n</tool_response>"
    assert out[4]["content"] == "Done."
    # no tools offered: nothing added; no system message: the tool list makes one
    assert template_messages(msgs[:2], None) == msgs[:2]
    assert template_messages(msgs[1:2], [BASH_TOOL])[0]["role"] == "system"
    for bad, why in [([{"content": "x"}], "message 0"), ([{"role": "user", "content": 3}], "content must be"),
                     ([{"role": "assistant", "tool_calls": [{"function": {}}]}], "no function name")]:
        with pytest.raises(ValueError, match=why):
            template_messages(bad, None)


def test_tool_calls_are_read_back_only_when_valid_and_offered() -> None:
    text = ('Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "cat out.txt"}}\n</tool_call>\n'
            '<tool_call>{"name": "python", "arguments": {}}</tool_call>\n<tool_call>{not json}</tool_call>')
    rest, calls = parse_tool_calls(text, {"bash"})
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("function", "bash", {"command": "cat out.txt"})]
    assert calls[0]["id"].startswith("call_")
    assert rest.startswith("Let me look.") and '"python"' in rest and "{not json}" in rest
    # an unclosed block at the end of the reply (cut by max_tokens or a stop) still counts
    rest, calls = parse_tool_calls('<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}', {"bash"})
    assert rest == "" and json.loads(calls[0]["function"]["arguments"]) == {"command": "ls"}
    assert parse_tool_calls("plain text", {"bash"}) == ("plain text", [])
