"""A small OpenAI-compatible chat server that plays scripted replies (tests and demos).

It is a real HTTP server on 127.0.0.1 (a port of its own), so the agent loop talks to it
exactly as to SGLang or vLLM. The reply to a request is chosen by its turn: the number of
assistant messages already in the conversation, so concurrent rollouts of one script each
get the whole script. Replies after the script's end say the task is done.

A script entry is one of::

    {"bash": "ls -la"}                  one bash tool call
    {"tool_calls": ["make", "make test"]}   several
    {"text": "```bash\\nls\\n```"}      plain text (fenced blocks for tool-less models)
    "Done."                             plain text
    {"fault": "500" | "429" | "400" | "malformed" | "bad_shape" | "hang" | "cut" | "huge"}   a failure
                                        (400: the conversation is refused, as for one too long)

(``cut``: the headers and half the body, then the connection closes, as a server or proxy
that dies mid-answer; ``huge``: a valid completion of about ``huge_mib`` MiB, for memory
faults on the client's side.)

and may carry ``"delay_s"``. ``{"choices": [entry, entry, ...]}`` answers one of its entries,
picked by the request's ``seed`` (``seed % len``; the first without one): a tree's children
(``--branch``) send their node's seed, so each child of a split gets its own continuation.
``faults`` (a list of fault names) are served first, one per
request, whatever the turn, then the script plays normally: that is how retries are tested.

``strict_sessions=True`` plays a session server (Miles' ``--use-session-server``): each
conversation's history must be an exact extension of its previous request plus the reply
the server sent (messages compared with ``None`` fields dropped, as
``model_dump(exclude_none=True)`` echoes them); anything else is refused with HTTP 400 and
recorded in ``rejections``. A conversation is the URL prefix before ``/v1`` (Miles' base
URLs are ``.../sessions/<id>``; :meth:`FakeModelServer.session_url`), else the
``Authorization`` header.

    with FakeModelServer([{"bash": "echo hi"}]) as server:
        policy = OpenAIPolicy(server.url, "fake")
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

DONE_TEXT = "The task is complete."
FAULTS = ("500", "429", "400", "malformed", "bad_shape", "hang", "cut", "huge")
CUT = -1
"""The status :meth:`reply_for` gives a ``cut`` answer: the handler sends half of it, then closes."""


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


class SessionRules:
    """Strict-session bookkeeping (Miles' ``--use-session-server``): each conversation's
    history must extend its previous request plus the reply sent, message for message."""

    def __init__(self) -> None:
        self.histories: dict[str, list[dict[str, Any]]] = {}
        """Conversation key -> its last history, the reply included."""
        self.rejections: list[str] = []
        """Why each refused request was refused."""
        self._lock = threading.Lock()

    def refusal(self, session: str, messages: list[Any]) -> str | None:
        """Why ``messages`` does not extend the session's last history (recorded in
        :attr:`rejections`), or None if it does."""
        why = self._diverges(session, messages)
        if why is not None:
            with self._lock:
                self.rejections.append(why)
        return why

    def record(self, session: str, messages: list[Any], reply: dict[str, Any]) -> None:
        """The history the session's next request must extend: ``messages`` and the reply."""
        with self._lock:
            self.histories[session] = [*map(_echoed, messages), _echoed(reply)]

    def _diverges(self, session: str, messages: list[Any]) -> str | None:
        with self._lock:
            previous = self.histories.get(session)
        if previous is None:
            return None
        if len(messages) < len(previous):
            return (f"session {session!r}: the history has {len(messages)} messages, fewer than the "
                    f"{len(previous)} of the previous turn (with its reply)")
        for i, (want, got) in enumerate(zip(previous, messages, strict=False)):
            if _echoed(got) != want:
                return (f"session {session!r}: message {i} differs from the previous turn's: "
                        f"sent {json.dumps(got)[:300]}, expected {json.dumps(want)[:300]}")
        return None


class ChatHTTPServer:
    """An OpenAI-compatible HTTP server on a thread of its own: ``/v1/chat/completions`` and
    ``/v1/models``, also under a session prefix (``/sessions/<id>/v1/...``). A subclass
    answers :meth:`reply_for`."""

    model: str

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0):
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL to give a client (``http://127.0.0.1:PORT/v1``)."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def session_url(self, session: str) -> str:
        """A Miles-style session base URL (``http://127.0.0.1:PORT/sessions/<session>``);
        a client appends ``/v1``."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/sessions/{session}"

    def reply_for(self, body: dict[str, Any], *, session: str = "") -> tuple[int, bytes]:
        """The HTTP status and JSON body answering one chat request."""
        raise NotImplementedError

    def serve_until_interrupted(self) -> None:
        """Serve on the calling thread until Ctrl-C, then close (the command-line servers);
        also when started in the background, where the shell leaves SIGINT ignored."""
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self._httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, daemon=True, name=f"sandfleet-{type(self).__name__}"
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class FakeModelServer(ChatHTTPServer):
    """Serves ``/v1/chat/completions`` and ``/v1/models`` from a script, on a thread."""

    def __init__(
        self,
        script: Sequence[Any] = (),
        *,
        model: str = "fake-model",
        faults: Sequence[str] = (),
        delay_s: float = 0.0,
        accept_tools: bool = True,
        huge_mib: int = 256,
        strict_sessions: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        for fault in faults:
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        self.script = list(script)
        self.model = model
        self.delay_s = delay_s
        self.huge_mib = huge_mib
        self.accept_tools = accept_tools
        """False answers requests offering ``tools`` with HTTP 400, as servers without tool
        support do (llama.cpp's server without ``--jinja``)."""
        self.faults: deque[str] = deque(faults)
        self.strict_sessions = strict_sessions
        """Refuse (HTTP 400) a history that is not an exact extension of the conversation's
        previous request and reply."""
        self.sessions = SessionRules()
        self.histories = self.sessions.histories
        """Conversation key -> its last history, the reply included (``strict_sessions``)."""
        self.rejections = self.sessions.rejections
        """Why each refused request was refused (``strict_sessions``)."""
        self.requests: list[dict[str, Any]] = []
        """Every request body received, in order."""
        self._lock = threading.Lock()
        super().__init__(host=host, port=port)

    # -- replies
    def reply_for(self, body: dict[str, Any], *, session: str = "") -> tuple[int, bytes]:
        """The HTTP status and body for one request (may sleep, for delays and hangs);
        ``session`` names its conversation (``strict_sessions``)."""
        with self._lock:
            self.requests.append(body)
            fault = self.faults.popleft() if self.faults else None
        if body.get("tools") and not self.accept_tools:
            return 400, b'{"error": {"message": "tools are not supported by this server"}}'
        messages = body.get("messages") or []
        if self.strict_sessions:
            why = self.sessions.refusal(session, messages)
            if why is not None:
                return 400, json.dumps({"error": {"message": why}}).encode()
        turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        entry: Any = pick(self.script[turn] if turn < len(self.script) else DONE_TEXT, body.get("seed"))
        if isinstance(entry, dict):
            fault = fault or entry.get("fault")
            delay = float(entry.get("delay_s", self.delay_s))
        else:
            delay = self.delay_s
        if delay:
            self._stop.wait(delay)
        if fault == "hang":
            self._stop.wait(3600)
            return 503, b'{"error": "server shut down"}'
        if fault == "500":
            return 500, b'{"error": {"message": "scripted internal error"}}'
        if fault == "429":
            return 429, b'{"error": {"message": "scripted rate limit"}}'
        if fault == "400":
            return 400, b'{"error": {"message": "scripted: the prompt is longer than the context window"}}'
        if fault == "malformed":
            return 200, b'{"id": "x", "choices": [{"message": {"content": "trunc'
        if fault == "bad_shape":
            return 200, json.dumps({"id": "x", "object": "chat.completion"}).encode()
        if fault == "cut":
            return CUT, json.dumps(self._completion(entry, messages, turn)).encode()
        if fault == "huge":
            return 200, json.dumps(self._completion({"text": "x" * (self.huge_mib << 20)}, messages, turn)).encode()
        completion = self._completion(entry, messages, turn)
        if self.strict_sessions:
            self.sessions.record(session, messages, completion["choices"][0]["message"])
        return 200, json.dumps(completion).encode()

    def _completion(self, entry: Any, messages: list[Any], turn: int) -> dict[str, Any]:
        return completion_for(entry, messages, turn, self.model)


def pick(entry: Any, seed: Any) -> Any:
    """The entry a ``{"choices": [...]}`` entry answers for a request's ``seed`` (any other entry: itself)."""
    if isinstance(entry, dict) and isinstance(entry.get("choices"), list) and entry["choices"]:
        index = seed % len(entry["choices"]) if isinstance(seed, int) else 0
        return pick(entry["choices"][index], None)
    return entry


def completion_for(entry: Any, messages: list[Any], turn: int, model: str) -> dict[str, Any]:
    """The ``chat.completion`` a script entry answers at ``turn`` (tokens counted as ~4 characters)."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if isinstance(entry, str):
        message["content"] = entry
    elif "text" in entry:
        message["content"] = entry["text"]
    else:
        commands = entry.get("tool_calls") or [entry["bash"]]
        message["tool_calls"] = [
            {"id": f"call_{turn}_{i}", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"command": c})}}
            for i, c in enumerate(commands)
        ]  # fmt: skip
    generated = json.dumps(message)
    prompt = _tokens(json.dumps(messages))
    completion = _tokens(generated)
    return {
        "id": f"chatcmpl-fake-{turn}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }  # fmt: skip


def _echoed(message: Any) -> Any:
    """A message as a client echoes it back: its ``None`` fields dropped."""
    if isinstance(message, dict):
        return {k: v for k, v in message.items() if v is not None}
    return message


def _split_path(path: str) -> tuple[str, str]:
    """``/sessions/s1/v1/chat/completions`` -> (``/sessions/s1``, ``/v1/chat/completions``)."""
    path = path.split("?", 1)[0].rstrip("/")
    for tail in ("/v1/chat/completions", "/v1/models"):
        if path.endswith(tail):
            return path[: -len(tail)], tail
    return "", path


def _handler(server: ChatHTTPServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            pass

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _cut(self, body: bytes) -> None:
            """Promise the whole body, send half of it, close the connection."""
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
            except OSError:
                pass
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if _split_path(self.path)[1] in ("/v1/models", "/models"):
                data = {"object": "list", "data": [{"id": server.model, "object": "model"}]}
                self._send(200, json.dumps(data).encode())
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            prefix, tail = _split_path(self.path)
            if tail not in ("/v1/chat/completions", "/chat/completions"):
                self._send(404, b'{"error": "not found"}')
                return
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                self._send(400, b'{"error": "request is not JSON"}')
                return
            session = prefix or self.headers.get("Authorization") or ""
            status, payload = server.reply_for(body, session=session)
            if status == CUT:
                self._cut(payload)
                return
            try:
                self._send(status, payload)
            except OSError:  # the client went away (a hang it gave up on)
                pass

    return Handler
