"""slime's Sandbox protocol and generate function, against duck-typed stand-ins that follow
slime's documented ``Sample`` fields (slime/utils/types.py), ``Sandbox`` protocol
(slime/agent/sandbox.py) and generate signature, and the scripted server."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import pytest

from sandfleet.integrations import miles, slime
from sandfleet.integrations._session import Turn
from sandfleet.testing.fake_server import FakeModelServer
from test_rollout_support import make_task, needs_bwrap


@runtime_checkable
class SlimeSandbox(Protocol):
    """slime.agent.sandbox.Sandbox, as documented."""

    sandbox_id: str

    async def __aenter__(self) -> Any: ...
    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...
    async def exec(self, cmd: str, *, user: str = "root", env: dict[str, str] | None = None, timeout: int = 120,
                   check: bool = False, idempotent: bool = True) -> tuple[int, str, str]: ...
    async def write_file(self, sandbox_path: str, content: str | bytes | Path, *, user: str = "root") -> None: ...
    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str: ...


@dataclass
class Sample:
    """The fields of slime's Sample a generate function reads and fills."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    non_generation_time: float = 0.0


class CharChatML:
    """A Hugging Face-shaped tokenizer: ChatML template, one token per character."""

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, tokenize: bool = True,
                            add_generation_prompt: bool = False) -> str:
        assert not tokenize
        text = f"<|im_start|>system\n# Tools\n{json.dumps(tools)}<|im_end|>\n" if tools else ""
        for m in messages:
            body = m.get("content") or ""
            for call in m.get("tool_calls") or []:
                body += f"<tool_call>{json.dumps(call['function'])}</tool_call>"
            text += f"<|im_start|>{m['role']}\n{body}<|im_end|>\n"
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


PROMPT = [{"role": "user", "content": "Write the word hello into /app/out.txt."}]


def router_args(server: FakeModelServer, **extra: Any) -> SimpleNamespace:
    where = urlsplit(server.url)
    return SimpleNamespace(sglang_router_ip=where.hostname, sglang_router_port=where.port,
                           sandfleet_tokenizer=CharChatML(), **extra)


@needs_bwrap()
async def test_sandfleet_sandbox_is_a_slime_sandbox(tmp_path: Path) -> None:
    box = slime.SandfleetSandbox(backend="bwrap", memory_mib=256, ttl_s=120)
    assert isinstance(box, SlimeSandbox)
    async with box as sb:
        assert sb.sandbox_id.startswith("sf-bwrap-")
        assert await sb.exec("id -u") == (0, "0\n", "")
        rc, out, err = await sb.exec("id -u; echo $X >&2; exit 3", user="agent", env={"X": "y"})
        assert (rc, out, err) == (3, "1000\n", "y\n")
        rc, _, err = await sb.exec("sleep 30", timeout=1)
        assert rc != 0 and "timed out after 1s" in err
        with pytest.raises(RuntimeError, match="exit=3"):
            await sb.exec("exit 3", check=True)
        host = tmp_path / "f.bin"
        host.write_bytes(b"\x00bytes")
        await sb.write_file("/work/a/b/text.txt", "text", user="agent")
        await sb.write_file("/work/bytes.bin", b"raw")
        await sb.write_file("/work/host.bin", host)
        assert await sb.read_file("/work/a/b/text.txt") == "text"
        assert await sb.exec("stat -c %u /work/a/b/text.txt /work/bytes.bin && cat /work/host.bin | od -c | head -1") \
            == (0, "1000\n0\n0000000  \\0   b   y   t   e   s\n", "")
        assert await sb.read_file("/work/missing") == ""
        inner = sb.sandbox
    assert not inner.alive and box.sandbox_id


@needs_bwrap()
async def test_abort_closes_open_sandboxes() -> None:
    box = slime.SandfleetSandbox(backend="bwrap", memory_mib=256, ttl_s=120)
    async with box:
        inner = box.sandbox
        await miles.abort()
        assert not inner.alive


@needs_bwrap()
async def test_generate_runs_a_whole_rollout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_BACKEND", "bwrap")
    task = make_task(tmp_path)
    tok = CharChatML()
    with FakeModelServer([{"bash": "echo hello > /app/out.txt"}, "Done."]) as server:
        sample = Sample(prompt=PROMPT, metadata={"sandfleet_task": str(task.path)})
        out = await slime.generate(router_args(server), sample, {"max_new_tokens": 64, "temperature": 1.0})
        bodies = server.requests
    assert out is sample and out.status is Sample.Status.COMPLETED and out.reward == 1.0
    assert bodies[0]["max_tokens"] == 64 and bodies[0]["logprobs"] is True and bodies[0]["messages"] == PROMPT
    # tokens = prompt + response; masks and lengths line up; the text is the conversation
    final = [*bodies[-1]["messages"], {"role": "assistant", "content": "Done."}]
    assert tok.decode(out.tokens) == tok.apply_chat_template(final, tools=bodies[0]["tools"], tokenize=False)
    assert out.response_length == len(out.loss_mask or []) and len(out.tokens) > out.response_length
    model = "".join(chr(t) for t, m in zip(out.tokens[-out.response_length:], out.loss_mask or [], strict=True) if m)
    env = "".join(chr(t) for t, m in zip(out.tokens[-out.response_length:], out.loss_mask or [], strict=True) if not m)
    assert "echo hello > /app/out.txt" in model and "Done." in model and "exit code" not in model
    assert "exit code: 0" in env and out.response == tok.decode(out.tokens[-out.response_length:])
    assert out.rollout_log_probs is None  # the scripted server sends none
    assert out.non_generation_time > 0 and out.metadata["sandfleet"]["agent_metrics"]["commands"] == 1
    assert await slime.reward_func(None, [out, Sample()]) == [1.0, 0.0]


@needs_bwrap()
async def test_a_masked_rollout_is_an_aborted_sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model server answering 500 is an infra fault: slime gets ABORTED with nothing in the
    loss, and the group filter drops its group; a group without one is kept."""
    monkeypatch.setenv("SANDFLEET_BACKEND", "bwrap")
    task = make_task(tmp_path)
    with FakeModelServer([{"fault": "500"}]) as server:
        sample = Sample(prompt=PROMPT, metadata={"sandfleet_task": str(task.path)})
        out = await slime.generate(router_args(server), sample, {})
    assert out.status is Sample.Status.ABORTED and not any(out.loss_mask or [])
    assert out.metadata["sandfleet"]["reason"] == "model_http_500"
    assert out.metadata["sandfleet"]["verdict"] == "infra_fault"
    assert out.metadata["sandfleet"]["fault"]["cause"] == "model_overloaded"
    done = Sample(status=Sample.Status.COMPLETED, reward=1.0)
    assert slime.drop_masked_groups(None, [done, out]).keep is False
    assert slime.drop_masked_groups(None, [[done], [Sample(status=Sample.Status.COMPLETED)]]).keep is True


def test_trajectory_masks_and_logprobs() -> None:
    tok = CharChatML()
    a1 = {"role": "assistant", "content": "ab"}
    a2 = {"role": "assistant", "content": "c"}
    messages = [{"role": "user", "content": "hi"}, a1, {"role": "user", "content": "out"}, a2]
    lp = lambda *xs: {"logprobs": {"content": [{"token": "?", "logprob": x} for x in xs]}}  # noqa: E731
    # logprobs for the written text: those tokens mask 1, the template's end of turn mask 0
    traj = slime.trajectory(tok, messages, [Turn(1, a1, lp(-0.1, -0.2)), Turn(3, a2, lp(-0.3))])
    assert tok.decode(traj.prompt_ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    text = tok.decode(traj.response_ids)
    assert text == ("ab<|im_end|>\n<|im_start|>user\nout<|im_end|>\n<|im_start|>assistant\nc<|im_end|>\n")
    written = "".join(c for c, m in zip(text, traj.loss_mask, strict=True) if m)
    assert written == "abc"
    assert traj.log_probs is not None and len(traj.log_probs) == len(traj.response_ids)
    assert [x for x, m in zip(traj.log_probs, traj.loss_mask, strict=True) if m] == [-0.1, -0.2, -0.3]
    # the server's token ids are taken as they are; a reply without logprobs drops them all
    ids = {"token_ids": [ord("a"), ord("b"), ord("<")]}
    traj = slime.trajectory(tok, messages, [Turn(1, a1, ids), Turn(3, a2, {})])
    assert "".join(c for c, m in zip(tok.decode(traj.response_ids), traj.loss_mask, strict=True) if m) \
        == "ab<" + "c<|im_end|>\n"
    assert traj.log_probs is None
    # a template that rewrites history is refused
    class Forgetful(CharChatML):
        def apply_chat_template(self, messages: list[dict[str, Any]], **kw: Any) -> str:
            return super().apply_chat_template(messages[-1:], **kw)
    with pytest.raises(slime.TokenizationError):
        slime.trajectory(Forgetful(), messages, [Turn(1, a1), Turn(3, a2)])


def test_router_and_sampling_params() -> None:
    args = SimpleNamespace(sglang_router_ip="10.0.0.1", sglang_router_port=3000)
    assert slime.router_url(args) == "http://10.0.0.1:3000/v1"
    assert slime.request_kwargs({"max_new_tokens": 8, "top_k": 5, "stop": ["x"]}) == \
        {"max_tokens": 8, "top_k": 5, "stop": ["x"], "logprobs": True}


def test_a_misspelt_or_badly_typed_option_is_refused_up_front() -> None:
    from sandfleet.errors import ConfigError
    from sandfleet.integrations._common import Settings

    with pytest.raises(ConfigError, match="backnd"):
        slime.SandfleetSandbox(backnd="bwrap")
    with pytest.raises(ConfigError, match="memory_mib"):
        slime.SandfleetSandbox(memory_mib="lots")
    with pytest.raises(ConfigError, match=r"unknown backend 'bwarp' \(\$SANDFLEET_BACKEND\)"):
        Settings.from_env({"SANDFLEET_BACKEND": "bwarp"})
