"""A minimal client for OpenAI-compatible chat servers (SGLang, vLLM, llama.cpp, hosted APIs).

Every httpx and JSON failure is translated here, at one boundary, into :class:`ModelError`
with a short ``reason``: ``model_unreachable``, ``model_timeout``, ``model_http_<status>``,
``model_malformed``. Pass ``transport`` (an ``httpx.AsyncBaseTransport``) to talk to
anything without a network, e.g. ``httpx.MockTransport``.
"""

from __future__ import annotations

import functools
import json
import ssl
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

import httpx

from sandfleet.errors import ModelError


@dataclass
class ToolCall:
    """One function call the model asked for."""

    id: str
    name: str
    arguments: str
    """The raw JSON string of arguments, as the model wrote it."""


@dataclass
class ChatReply:
    """One parsed chat completion."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    raw_message: dict[str, Any] = field(default_factory=dict)
    """The assistant message as returned, to append to the conversation."""
    raw_choice: dict[str, Any] = field(default_factory=dict)
    """The whole choice as the server sent it (its message verbatim, ``finish_reason``,
    ``logprobs``, any token ids)."""


def parse_completion(data: Any) -> ChatReply:
    """Read a ``chat.completion`` object; raise ModelError(reason="model_malformed") if it isn't."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        if not isinstance(message, dict):
            raise TypeError("message is not an object")
        content = message.get("content") or ""
        if not isinstance(content, str):  # some servers send a list of parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        calls = []
        for i, call in enumerate(message.get("tool_calls") or []):
            fn = call["function"]
            args = fn.get("arguments", "")
            calls.append(
                ToolCall(
                    id=str(call.get("id") or f"call_{i}"),
                    name=str(fn["name"]),
                    arguments=args if isinstance(args, str) else json.dumps(args),
                )
            )
        usage = data.get("usage") or {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise ModelError(
            f"not a chat completion ({type(e).__name__}: {e})", reason="model_malformed"
        ) from None
    return ChatReply(
        content=content,
        tool_calls=calls,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=prompt if isinstance(prompt, int) else None,
        completion_tokens=completion if isinstance(completion, int) else None,
        raw_message={k: v for k, v in message.items() if k in ("role", "content", "tool_calls")},
        raw_choice=choice,
    )


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context per process: building one (loading CA certificates) takes 50-300 ms,
    which every rollout would otherwise pay as overhead."""
    try:
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - httpx depends on certifi
        return ssl.create_default_context()


@functools.cache
def warm_up() -> None:
    """Pay httpx's one-time set-up (~0.2 s: imports, a TLS context) now, outside any rollout."""
    httpx.AsyncHTTPTransport(verify=False)


class CompletionOptions(TypedDict, total=False):
    """What a :class:`~sandfleet.rollout.policy.Model`'s ``complete`` takes besides the
    messages (every model: the HTTP client, the taping and replaying ones, the scripted one):
    a new sampling option is one line here. Each is None when left out."""

    tools: list[dict[str, Any]] | None  # OpenAI's chat format; offered last
    max_tokens: int | None  # None: the model's
    temperature: float | None  # None: the model's
    extra: dict[str, Any] | None  # a trainer's sampling settings, which win over both


class ChatClient:
    """``POST {base_url}/chat/completions`` with one model name; async, reusable, closeable."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
        extra_body: dict[str, Any] | None = None,
    ):
        base = base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.extra_body = extra_body or {}
        verify: ssl.SSLContext | bool = _tls() if base.startswith("https:") else False
        self._http = httpx.AsyncClient(
            verify=verify,
            base_url=base,
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
        )

    async def complete(self, messages: list[dict[str, Any]], **opts: Unpack[CompletionOptions]) -> ChatReply:
        """One completion. ``extra`` fields go into the body over ``max_tokens`` and
        ``temperature`` (a trainer's sampling settings win); ``tools`` are set last."""
        tools, max_tokens, temperature, extra = (opts.get("tools"), opts.get("max_tokens"), opts.get("temperature"),
                                                 opts.get("extra"))
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.extra_body}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if temperature is not None:
            body["temperature"] = temperature
        body.update(extra or {})
        if tools:
            body["tools"] = tools
        try:
            resp = await self._http.post("/chat/completions", json=body)
        except httpx.TimeoutException as e:
            raise ModelError(f"model server timed out: {e!r}", reason="model_timeout") from None
        except httpx.HTTPError as e:
            raise ModelError(
                f"model server unreachable: {e!r}", reason="model_unreachable"
            ) from None
        if resp.status_code >= 400:
            raise ModelError(
                f"model server answered HTTP {resp.status_code}: {resp.text[:300]}",
                reason=f"model_http_{resp.status_code}",
            )
        try:
            data = resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelError(
                f"model server sent invalid JSON: {e}", reason="model_malformed"
            ) from None
        return parse_completion(data)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
