"""slime: sandfleet sandboxes behind slime's ``Sandbox`` protocol, and whole agentic
rollouts as a ``--custom-generate-function-path`` function.

    from sandfleet.integrations.slime import SandfleetSandbox
    async with SandfleetSandbox(image="host", memory_mib=2048) as sb:   # slime.agent.sandbox.Sandbox
        rc, out, err = await sb.exec("make test", user="root", timeout=600)

    --custom-generate-function-path sandfleet.integrations.slime.generate
    --custom-rm-path sandfleet.integrations.slime.reward_func           (reads the pre-filled reward)

:func:`generate` runs one rollout of the task named by ``sample.metadata["sandfleet_task"]``
against slime's SGLang router (``/v1/chat/completions``), then rebuilds the trajectory as
tokens with the model's chat template: the prompt, each reply (``loss_mask`` 1) and each
command output and template glue (``loss_mask`` 0), with ``rollout_log_probs`` where the
server sent per-token logprobs. The reward is pre-filled, so slime's reward model is
skipped. slime itself is never imported (the registry's ``slime`` package is unrelated).

**The mask.** The rollout's ``verdict`` (docs/rollouts.md) is in ``metadata["sandfleet"]``.
An ``infra_fault`` (masked: the agent could not have caused it) comes back in slime's own
status for a rollout that must not train, ``ABORTED``, with every ``loss_mask`` entry 0 (as
slime's own ``_abort_result`` does); slime skips its reward model for it. Pass
``--dynamic-sampling-filter-path sandfleet.integrations.slime.drop_masked_groups`` so that
its group is dropped and sampled again, out of the group statistics too. A policy fault is a
finished rollout at reward 0 (``COMPLETED``): it trains.
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.errors import GuestFileNotFoundError, SandboxClosedError
from sandfleet.integrations._common import LIVE, Aborted, Settings, agent_metrics, resolve_task, run_task
from sandfleet.integrations._session import SessionPolicy, Turn
from sandfleet.rollout.loop import BASH_TOOL, AgentConfig
from sandfleet.rollout.verdict import INFRA, verdict_of
from sandfleet.sandbox import create_sandbox, make_spec
from sandfleet.sandbox.base import Sandbox

TASK_KEY = "sandfleet_task"
ExecResult = tuple[int, str, str]


class SandfleetSandbox:
    """slime's ``Sandbox`` protocol (``slime/agent/sandbox.py``) over one sandfleet sandbox.

    The constructor takes :func:`~sandfleet.sandbox.create_sandbox`'s keyword arguments
    (``image``, ``backend``, ``memory_mib``, ``cpus``, ``network``, ``ttl_s``, ...) and
    ``remote``: the URL of a sandfleet service to make the sandbox on (its token in
    ``$SANDFLEET_TOKEN``; docs/service.md). The sandbox exists between ``__aenter__`` and
    ``__aexit__``; :func:`sandfleet.integrations.miles.abort` closes it too.
    """

    def __init__(self, *, remote: str | None = None, **create_kwargs: Any):
        make_spec(**dict(create_kwargs))  # a misspelt or badly typed option: a ConfigError now, not in a rollout
        self.remote = remote
        self.create_kwargs = create_kwargs
        self.sandbox_id = ""
        self._sandbox: Sandbox | None = None
        self._service: Any = None

    @property
    def sandbox(self) -> Sandbox:
        """The sandfleet sandbox (for what the protocol lacks: uploads, sessions, snapshots)."""
        if self._sandbox is None:
            raise SandboxClosedError("the sandbox is not open: use `async with SandfleetSandbox(...) as sb`")
        return self._sandbox

    async def __aenter__(self) -> SandfleetSandbox:
        if self.remote:
            from sandfleet.client import connect
            from sandfleet.client.remote import token_from_env

            self._service = await connect(self.remote, token_from_env())
            try:
                self._sandbox = await self._service.create_sandbox(**self.create_kwargs)
            except BaseException:
                await self._service.aclose()
                raise
        else:
            self._sandbox = await create_sandbox(**self.create_kwargs)
        self.sandbox_id = self.sandbox.id
        LIVE.add_sandbox(self)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.close()

    async def close(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        service, self._service = self._service, None
        LIVE.drop_sandbox(self)
        try:
            if sandbox is not None:
                await sandbox.close()
        finally:
            if service is not None:
                await service.aclose()

    async def exec(self, cmd: str, *, user: str = "root", env: dict[str, str] | None = None, timeout: int = 120,
                   check: bool = False, idempotent: bool = True) -> ExecResult:
        """``(exit_code, stdout, stderr)`` of ``bash -c cmd`` as ``user``. At ``timeout`` the
        whole process tree is killed and stderr says so. ``check`` raises RuntimeError for a
        non-zero exit or a timeout. ``idempotent`` is accepted and unused: sandfleet never
        re-sends a command (a lost guest is ``SandboxDiedError``, not a retry)."""
        res = await self.sandbox.exec(cmd, user=user, env=env, timeout=timeout)
        stderr = res.stderr + (f"\n[sandfleet: timed out after {timeout}s; process tree killed]\n"
                               if res.timed_out else "")
        if check and not res.ok:
            raise RuntimeError(f"sandfleet exec failed (exit={res.exit_code}{', timed out' if res.timed_out else ''}):"
                               f" {cmd[:120]}\n{stderr[-400:]}")
        return res.exit_code, res.stdout, stderr

    async def write_file(self, sandbox_path: str, content: str | bytes | Path, *, user: str = "root") -> None:
        """Write ``content`` (text, bytes, or a host file's bytes) as ``user``, making the
        parent folders first where they are missing."""
        data = await asyncio.to_thread(content.read_bytes) if isinstance(content, Path) else content
        try:
            await self.sandbox.write_file(sandbox_path, data, user=user)
        except GuestFileNotFoundError:
            parent = str(Path(sandbox_path).parent)
            await self.sandbox.exec(["mkdir", "-p", "--", parent], user=user, cwd="/", timeout=60)
            await self.sandbox.write_file(sandbox_path, data, user=user)

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str:
        """A file's text as ``user``; ``""`` when it does not exist (as slime's E2B sandbox)."""
        try:
            data = await self.sandbox.read_file(sandbox_path, user=user)
        except GuestFileNotFoundError:
            return ""
        return data.decode("utf-8", "replace")


# -- the generate function


class TokenizationError(ValueError):
    """The chat template does not render the conversation as a growing prefix."""


@dataclass
class Trajectory:
    """A rollout as tokens: the prompt, then the response with its masks."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    """1 for the model's tokens, 0 for command output and template glue."""
    log_probs: list[float] | None = None
    """Per response token (0.0 where the mask is 0); None unless every reply had logprobs."""
    turn_ends: list[int] = field(default_factory=list)
    """Per turn, the response's length after it (its glue, its reply and the reply's tail)."""


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=generation_prompt)
    return list(tokenizer.encode(text, add_special_tokens=False))


_TOKEN_ID = re.compile(r"token_id:(\d+)")


def generated_ids(choice: dict[str, Any]) -> list[int] | None:
    """The reply's token ids where the server sent them (``token_ids``, as vLLM's
    ``return_token_ids``; or ``token_id:N`` logprob tokens, as ``return_tokens_as_token_ids``)."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        return ids
    entries = (choice.get("logprobs") or {}).get("content") or []
    found = [_TOKEN_ID.fullmatch(str(e.get("token", ""))) for e in entries]
    if found and all(found):
        return [int(m.group(1)) for m in found if m]
    return None


def generated_logprobs(choice: dict[str, Any]) -> list[float] | None:
    """The reply's per-token logprobs (``logprobs.content[*].logprob``), or None."""
    entries = (choice.get("logprobs") or {}).get("content")
    if not isinstance(entries, list) or not entries:
        return None
    try:
        return [float(e["logprob"]) for e in entries]
    except (KeyError, TypeError, ValueError):
        return None


def trajectory(tokenizer: Any, messages: list[dict[str, Any]], turns: list[Turn]) -> Trajectory:
    """Tokens of a conversation, turn by turn, with the chat template of ``tokenizer``
    (``apply_chat_template`` and ``encode``, as Hugging Face tokenizers have them).

    Before each request the template renders the history with a generation prompt; what
    it adds since the previous reply is command output and glue (mask 0). A reply is the
    server's token ids where it sent them (the template's rendering past them, an
    end-of-turn newline say, is glue), else the template's rendering of the assistant
    message, of which the first k tokens, k = the number of logprobs the server sent, have
    mask 1 and the rest mask 0. Raises :class:`TokenizationError` where the template does not
    extend its previous rendering."""
    if not turns:
        return Trajectory(_render(tokenizer, messages, None, True))
    tools = [BASH_TOOL] if turns[0].tools else None
    prompt = _render(tokenizer, messages[: turns[0].sent], tools, True)
    out = Trajectory(prompt)
    log_probs: list[float] | None = []
    template = prompt  # the template's own rendering so far
    for i, turn in enumerate(turns):
        before = _render(tokenizer, messages[: turn.sent], tools, True)
        after = _render(tokenizer, messages[: turn.sent + 1], tools, False)
        if before[: len(template)] != template or after[: len(before)] != before:
            raise TokenizationError(f"turn {i}: the chat template does not render the conversation as a "
                                    "growing prefix; this generate function needs one that does")
        glue, rendered = before[len(template):], after[len(before):]
        lps = generated_logprobs(turn.choice)
        gen = generated_ids(turn.choice)
        if gen is not None:
            tail = rendered[len(gen):] if rendered[: len(gen)] == gen else []
        else:
            k = len(lps) if lps is not None and len(lps) <= len(rendered) else len(rendered)
            gen, tail = rendered[:k], rendered[k:]
        out.response_ids += glue + gen + tail
        out.loss_mask += [0] * len(glue) + [1] * len(gen) + [0] * len(tail)
        out.turn_ends.append(len(out.response_ids))
        if log_probs is not None and lps is not None and len(lps) == len(gen):
            log_probs += [0.0] * len(glue) + lps + [0.0] * len(tail)
        else:
            log_probs = None
        template = after
    out.log_probs = log_probs
    return out


_tokenizers: dict[str, Any] = {}
_tokenizers_lock = threading.Lock()


def _load_tokenizer(path: str) -> Any:
    with _tokenizers_lock:
        if path not in _tokenizers:
            from transformers import AutoTokenizer  # slime's own dependency

            _tokenizers[path] = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        return _tokenizers[path]


async def tokenizer_for(args: Any) -> Any:
    """``args.sandfleet_tokenizer`` if set, else the tokenizer of ``args.hf_checkpoint``."""
    given = getattr(args, "sandfleet_tokenizer", None)
    if given is not None:
        return given
    return await asyncio.to_thread(_load_tokenizer, str(args.hf_checkpoint))


def router_url(args: Any) -> str:
    """slime's SGLang router as an OpenAI base URL."""
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}/v1"


def request_kwargs(sampling_params: dict[str, Any], *, logprobs: bool = True) -> dict[str, Any]:
    """slime's SGLang sampling parameters as chat-completion fields (``max_new_tokens`` is
    ``max_tokens``; SGLang takes its other names, ``top_k`` and ``min_p`` included, as they are)."""
    out = {("max_tokens" if k == "max_new_tokens" else k): v for k, v in (sampling_params or {}).items()}
    if logprobs:
        out.setdefault("logprobs", True)
    return out


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """One whole agentic rollout of ``sample``'s task; returns ``sample`` filled in: ``tokens``,
    ``response``, ``response_length``, ``loss_mask``, ``rollout_log_probs`` (where the server
    sent logprobs), ``reward`` (the verifier's), ``status`` and ``metadata["sandfleet"]``.

    Status: ``COMPLETED`` (scored, or a policy fault at reward 0); ``TRUNCATED`` when the last
    reply hit its token limit or the rollout its token budget; ``ABORTED`` (masked, every
    ``loss_mask`` entry 0) for an infra fault (model server, sandbox, host), when an abort
    ended it, or when its trajectory can't be tokenized. Options on ``args``: ``sandfleet_max_turns``,
    ``sandfleet_tool_mode``, ``sandfleet_tokenizer``, ``sandfleet_model``."""
    status = type(sample).Status
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    sample.metadata = metadata
    if TASK_KEY not in metadata:
        raise KeyError(f"the sample's metadata has no {TASK_KEY!r} (a task folder or a name under $SANDFLEET_TASKS)")
    task = resolve_task(str(metadata[TASK_KEY]))
    config = AgentConfig(max_turns=int(getattr(args, "sandfleet_max_turns", None) or 30),
                         tool_mode=getattr(args, "sandfleet_tool_mode", None) or "auto")
    model = str(getattr(args, "sandfleet_model", None) or "default")
    policy = SessionPolicy(router_url(args), sample.prompt, model=model, request_kwargs=request_kwargs(sampling_params),
                           config=config)
    try:
        result = await run_task(task, policy, Settings.from_env(), group=task.name)
    except Aborted:
        metadata["sandfleet"] = {"verdict": INFRA, "fault": {"cause": "cancelled", "reason": "aborted"}}
        return _masked(sample, status)
    verdict = verdict_of(result)
    tokenizer = await tokenizer_for(args)
    try:
        traj = trajectory(tokenizer, policy.messages, policy.turns)
    except TokenizationError as e:
        metadata["sandfleet"] = {"error": str(e), "verdict": INFRA, "fault": {"cause": "tokenization", "error": str(e)}}
        return _masked(sample, status)
    sample.tokens = traj.prompt_ids + traj.response_ids
    sample.response = tokenizer.decode(traj.response_ids)
    sample.response_length = len(traj.response_ids)
    sample.loss_mask = traj.loss_mask
    sample.rollout_log_probs = traj.log_probs
    metrics = agent_metrics(result)
    if hasattr(sample, "non_generation_time"):
        sample.non_generation_time = metrics["total_tool_time"]
    metadata["sandfleet"] = {
        "status": result.status, "verdict": verdict, "fault": result.fault, "reason": result.reason,
        "error": result.error, "stop_reason": result.stop_reason, "reward_details": result.reward_details,
        "agent_metrics": metrics, "spans": result.spans, "sandbox_id": result.sandbox_id,
    }  # fmt: skip
    if verdict == INFRA:
        return _masked(sample, status)
    sample.reward = float(result.reward or 0.0)  # a policy fault: 0, and it trains
    last = policy.turns[-1].choice.get("finish_reason") if policy.turns else None
    truncated = last == "length" or result.stop_reason == "max_tokens"
    sample.status = status.TRUNCATED if truncated else status.COMPLETED
    return sample


def _masked(sample: Any, status: Any) -> Any:
    """slime's abort result: ``ABORTED``, nothing of it in the loss (its reward slot 0.0:
    slime's Sample holds a number; the status is the mask)."""
    sample.status, sample.reward = status.ABORTED, 0.0
    sample.loss_mask = [0] * sample.response_length if sample.response_length else [0]
    return sample


@dataclass
class FilterOutput:
    """slime's ``DynamicFilterOutput`` fields (used where slime is not importable)."""

    keep: bool
    reason: str | None = None


def drop_masked_groups(args: Any, samples: Any, **kwargs: Any) -> Any:
    """``--dynamic-sampling-filter-path``: drop a group with a masked (``ABORTED``) member, so
    that slime samples it again and the masked rollout weighs in no group statistic."""
    flat: list[Any] = []
    for s in samples:
        flat.extend(s if isinstance(s, list) else [s])
    masked = any(getattr(getattr(s, "status", None), "name", "") == "ABORTED"
                 or ((getattr(s, "metadata", None) or {}).get("sandfleet") or {}).get("verdict") == INFRA
                 for s in flat)
    try:
        from slime.rollout.filter_hub.base_types import DynamicFilterOutput  # slime's own type, where installed
    except ImportError:
        return FilterOutput(keep=not masked, reason="group_has_masked" if masked else None)
    return DynamicFilterOutput(keep=not masked, reason="group_has_masked" if masked else None)


async def reward_func(args: Any, samples: Any, **kwargs: Any) -> float | list[float]:
    """``--custom-rm-path``: the reward :func:`generate` pre-filled (0.0 if none)."""
    if isinstance(samples, list):
        return [float(s.reward or 0.0) for s in samples]
    return float(samples.reward or 0.0)
