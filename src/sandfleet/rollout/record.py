"""The record of a rollout: what ``sandfleet replay`` needs to run it again (docs/replay.md).

A :class:`Tape` rides in the :class:`~sandfleet.rollout.policy.AgentContext`: every command
the policy runs (:meth:`AgentContext.run`) and every model request (the model wrapped by
:meth:`Tape.model`) is taped at that one point, whatever the policy. When the rollout ends,
:func:`build_record` adds what the sandbox was (task files' digests, image digest, spec,
backend, sandfleet's version, the host) and what the verifier said, and the run writes it to
``records.jsonl`` beside ``rollouts.jsonl``.

Modes: ``none`` (no record), ``commands`` (the default: everything but the model's messages,
which are kept as digests), ``full`` (the messages too). Each taped item carries a digest of
its own content (``sha``), so that a record edited afterwards is told apart from one that
drifted (:func:`tampered`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from sandfleet import __version__
from sandfleet.rollout.chat import ChatReply, CompletionOptions
from sandfleet.rollout.normalize import DEFAULT, normalize
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.tasks.model import Task

if TYPE_CHECKING:
    from sandfleet.agent.client import ExecResult
    from sandfleet.rollout.policy import Model, Policy
    from sandfleet.rollout.result import RolloutResult

log = logging.getLogger(__name__)

RECORD_MODES = ("none", "commands", "full")
RECORD_VERSION = 1
OUTPUT_CAP = 8192
"""Characters of a command's output a record keeps (head and tail); the full output's length
and digest are kept too."""
HEAD = ("task", "task_dir", "task_digest", "image", "spec", "verify", "policy", "verifier", "result")
"""The parts of a record whose digests its ``head`` keeps (its taped items carry their own)."""
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def sha(value: Any) -> str:
    """The SHA-256 of a JSON value (canonical: sorted keys) or of a string, 16 hex digits."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def plain(value: Any) -> Any:
    """``value`` as JSON reads it back (a trainer's numpy numbers and token arrays as text)."""
    return json.loads(json.dumps(value, default=str))


def cap(text: str, limit: int = OUTPUT_CAP) -> str:
    """Head and tail of ``text`` within ``limit`` characters, the cut marked."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters not recorded ...]\n{text[-tail:]}"


def message_digests(message: dict[str, Any], normalizers: Sequence[str] = DEFAULT) -> dict[str, Any]:
    """A message's role, and the digests of it as it is (``sha``) and after ``normalizers`` (``norm``)."""
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True, default=str)
    rest = {k: v for k, v in message.items() if k != "content"}
    return {"role": message.get("role"), "sha": sha([text, rest]), "norm": sha([normalize(text, normalizers), rest])}


class Tape:
    """What a rollout's policy did, taped as it happens: commands and model requests."""

    def __init__(self, mode: str = "commands", output_cap: int = OUTPUT_CAP):
        if mode not in ("commands", "full"):
            raise ValueError(f"a tape records commands or full, not {mode!r}")
        self.mode = mode
        self.output_cap = output_cap
        self.commands: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.expect: Callable[[dict[str, Any]], None] | None = None
        """Called with each command before it runs (replay: raises where it differs from the record)."""
        self.seconds = 0.0
        """Time spent taping (the record's cost to the rollout)."""
        self._seen_messages = 0
        self._tools_sha: str | None = None
        self.error: str | None = None
        """Why taping stopped (it never fails the rollout; replay refuses such a record)."""

    def failed(self, e: Exception) -> None:
        if self.error is None:
            log.warning("taping stopped: %s: %s", type(e).__name__, e)
            self.error = f"{type(e).__name__}: {e}"[:500]

    # -- commands
    def before_command(self, command: str, *, turn: int, shell: bool, env: dict[str, str] | None) -> None:
        if self.expect is not None:
            self.expect({"i": len(self.commands), "turn": turn, "command": command, "shell": shell, "env": env})

    def command(
        self, command: str, res: ExecResult, *, turn: int, shell: bool, env: dict[str, str] | None, timeout: float,
        argv: list[str] | None = None,
    ) -> None:
        try:
            self._command(command, res, turn=turn, shell=shell, env=env, timeout=timeout, argv=argv)
        except Exception as e:
            self.failed(e)

    def _command(
        self, command: str, res: ExecResult, *, turn: int, shell: bool, env: dict[str, str] | None, timeout: float,
        argv: list[str] | None,
    ) -> None:
        if self.error is not None:
            return
        t0 = time.perf_counter()
        output = res.output
        entry: dict[str, Any] = {
            "i": len(self.commands), "turn": turn, "command": command, "shell": shell,
            **({"argv": argv} if argv is not None else {}), **({"env": env} if env else {}),
            "timeout_s": round(timeout, 3), "exit_code": res.exit_code,
            **({"timed_out": True} if res.timed_out else {}), "duration_s": round(res.duration_s, 4),
            "output": cap(output, self.output_cap), "output_chars": len(output), "output_sha": sha(output),
            "cap": self.output_cap,
        }  # fmt: skip
        entry["sha"] = item_sha(entry)
        self.commands.append(entry)
        self.seconds += time.perf_counter() - t0

    # -- model requests
    def model(self, model: Model) -> Model:
        """``model`` with every request and reply taped."""
        return _TapedModel(model, self)

    def request(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
        """The taped form of a request (also what replay compares a new request with)."""
        new = messages[self._seen_messages:] if len(messages) >= self._seen_messages else messages
        tools = params.get("tools")
        tools_sha = sha(tools) if tools else None
        entry: dict[str, Any] = {
            "i": len(self.requests),
            "params": plain({k: v for k, v in params.items() if k != "tools"}),
            "tools_sha": tools_sha,
            "messages": {"n": len(messages), "sha": sha(messages), "from": len(messages) - len(new),
                         "new": [message_digests(m) for m in new]},
        }
        if tools and tools_sha != self._tools_sha:
            entry["tools"] = plain(tools)  # in full where they change (the first request, mostly)
        if self.mode == "full":
            entry["new_messages"] = plain(new)
        return entry

    def reply(self, entry: dict[str, Any], reply: ChatReply | None, error: Exception | None, n_messages: int) -> None:
        if reply is not None:
            entry["reply"] = plain(reply.raw_choice or {"message": reply.raw_message,
                                                        "finish_reason": reply.finish_reason})
            entry["usage"] = {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens}
        else:
            entry["error"] = {"type": type(error).__name__, "reason": getattr(error, "reason", None),
                              "message": str(error)[:500]}
        entry["sha"] = item_sha(entry)
        self._tools_sha = entry["tools_sha"]
        self._seen_messages = n_messages + (1 if reply is not None else 0)  # the reply is appended next
        self.requests.append(entry)


def item_sha(entry: dict[str, Any]) -> str:
    """The digest of a taped item's content (all but ``sha``)."""
    return sha({k: v for k, v in entry.items() if k != "sha"})


class _TapedModel:
    """A :class:`~sandfleet.rollout.policy.Model` that tapes what passes through it."""

    def __init__(self, inner: Model, tape: Tape):
        self.inner = inner
        self.tape = tape
        self.model = getattr(inner, "model", None)

    async def complete(self, messages: list[dict[str, Any]], **opts: Unpack[CompletionOptions]) -> ChatReply:
        tape = self.tape
        t0 = time.perf_counter()
        params = {"tools": opts.get("tools"), "max_tokens": opts.get("max_tokens"),
                  "temperature": opts.get("temperature"), "extra": opts.get("extra") or {}}
        entry: dict[str, Any] | None = None
        if tape.error is None:
            try:
                entry = tape.request(messages, params)
            except Exception as e:  # taping never fails the rollout
                tape.failed(e)
        tape.seconds += time.perf_counter() - t0
        try:
            reply = await self.inner.complete(messages, **opts)
        except Exception as e:
            self._reply(entry, None, e, len(messages))
            raise
        self._reply(entry, reply, None, len(messages))
        return reply

    def _reply(self, entry: dict[str, Any] | None, reply: ChatReply | None, error: Exception | None, n: int) -> None:
        if entry is None or self.tape.error is not None:
            return
        t0 = time.perf_counter()
        try:
            self.tape.reply(entry, reply, error, n)
        except Exception as e:
            self.tape.failed(e)
        self.tape.seconds += time.perf_counter() - t0


# -- what the sandbox was


_FILE_DIGESTS: dict[tuple[str, int, int], str] = {}
"""(path, mtime_ns, size) -> digest: a task's files are hashed once per process, not per rollout."""


def task_files(task: Task, *, cached: bool = True) -> dict[str, str]:
    """Every file of the task folder (and of its tests, where they live elsewhere), by path
    relative to the folder: its SHA-256 (16 hex digits). ``cached``: a file whose path,
    modification time and size are unchanged since this process hashed it is not read again
    (recording; replay's check reads every file)."""
    out: dict[str, str] = {}
    roots = [(task.path, "")]
    try:
        task.tests_dir.relative_to(task.path)
    except ValueError:
        roots.append((task.tests_dir, "@tests/"))
    for root, prefix in roots:
        _hash_tree(str(root), prefix, out, cached)
    return dict(sorted(out.items()))


def _hash_tree(folder: str, prefix: str, out: dict[str, str], cached: bool) -> None:
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in SKIP_DIRS:
                    _hash_tree(entry.path, f"{prefix}{entry.name}/", out, cached)
                continue
            st = entry.stat()
            if not stat.S_ISREG(st.st_mode):
                continue
            key = (entry.path, st.st_mtime_ns, st.st_size)
            digest = _FILE_DIGESTS.get(key) if cached else None
            if digest is None:
                if len(_FILE_DIGESTS) > 100_000:
                    _FILE_DIGESTS.clear()
                digest = _FILE_DIGESTS[key] = hashlib.sha256(Path(entry.path).read_bytes()).hexdigest()[:16]
            out[prefix + entry.name] = digest


def tests_prefix(task: Task) -> str:
    """How the task's test files' paths begin in :func:`task_files`."""
    try:
        rel = task.tests_dir.relative_to(task.path).as_posix()
    except ValueError:
        return "@tests/"
    return "" if rel == "." else rel + "/"


def image_digest(image: str) -> str | None:
    """The content hash of an image (None where it can't be resolved)."""
    from sandfleet.imagestore import resolve_image

    try:
        return resolve_image(image).hash
    except Exception as e:  # an unknown image: the record says so, replay refuses it
        log.debug("no digest for image %s: %s", image, e)
        return None


_ENVIRONMENT: dict[str, Any] = {}


def environment() -> dict[str, Any]:
    """sandfleet's version and commit, the host and its kernel (read once per process)."""
    if not _ENVIRONMENT:
        from sandfleet.provenance import commit, host

        _ENVIRONMENT.update(sandfleet=__version__, commit=commit(), host=host())
    return _ENVIRONMENT


def describe_policy(policy: Policy) -> dict[str, Any]:
    """What replay needs to rebuild the policy: its name and settings."""
    from sandfleet.rollout.loop import OpenAIPolicy
    from sandfleet.rollout.policy import ScriptedPolicy

    out: dict[str, Any] = {"name": policy.name, "class": type(policy).__qualname__}
    if isinstance(policy, OpenAIPolicy):
        out.update(model=policy.model, config=dataclasses.asdict(policy.config), extra_body=policy.extra_body)
    args = getattr(policy, "replay_args", None)
    if callable(args):  # what a policy of its own needs to be made again (rollout/replay.py, REBUILDERS)
        out["args"] = plain(args())
    elif isinstance(policy, ScriptedPolicy):
        out["commands"] = list(policy.commands)
    return out


def build_record(
    tape: Tape, *, task: Task, spec: SandboxSpec, policy: Policy, result: RolloutResult,
    reward_source: dict[str, Any] | None = None, verify: str = "shared",
) -> dict[str, Any]:
    """The rollout's record (one line of ``records.jsonl``)."""
    t0 = time.perf_counter()
    files = task_files(task)
    record: dict[str, Any] = {
        "record": RECORD_VERSION, "mode": tape.mode, "rollout_id": result.rollout_id, "run_id": result.run_id,
        "task": task.name, "group": result.group, "sample": result.sample, "attempt": result.attempt,
        "task_dir": str(task.path), "tests_prefix": tests_prefix(task),
        "task_digest": {"sha": sha(files), "files": files,
                        "reward_key": task.verifier.reward_key, "reward_weights": task.verifier.reward_weights},
        "image": {"ref": spec.image, "digest": image_digest(spec.image)},
        "spec": spec.model_dump(mode="json"), "backend": result.backend, "verify": verify, "environment": environment(),
        "policy": describe_policy(policy), "normalizers": list(DEFAULT),
        "requests": tape.requests, "commands": tape.commands,
        "verifier": {"exit_code": result.verifier_exit_code, "output": cap(result.verifier_output, tape.output_cap),
                     "reward": result.reward, "details": result.reward_details,
                     "reward_source": reward_source or {"kind": task.verifier.reward,
                                                        "text": task.verifier.reward_text_path,
                                                        "json": task.verifier.reward_json_path,
                                                        "parser": task.verifier.parser_name}},
        "result": {"status": result.status, "reason": result.reason, "stop_reason": result.stop_reason,
                   "reward": result.reward, "verdict": result.verdict, "turns": result.turns,
                   "duration_s": round(result.duration, 4)},
    }  # fmt: skip
    if tape.error is not None:
        record["tape_error"] = tape.error
    record["head"] = {k: sha(record[k]) for k in HEAD}
    record["cost"] = {"tape_ms": round(tape.seconds * 1000, 3),
                      "build_ms": round((time.perf_counter() - t0) * 1000, 3)}
    return record


def tampered(record: dict[str, Any]) -> list[str]:
    """What no longer matches its digest, edited after recording: a part of the head
    (``the record's image ...``: replay refuses it), or a taped item (``commands[2] ...``:
    replayed, and the replay diverges there)."""
    out = []
    head = record.get("head")
    if not isinstance(head, dict):
        return ["the record's head has no digests (it was changed, or made by an older sandfleet)"]
    for k in HEAD:
        if head.get(k) != sha(record.get(k)):
            out.append(f"the record's {k} was changed after recording")
    for kind in ("requests", "commands"):
        for entry in record.get(kind) or []:
            if not isinstance(entry, dict) or entry.get("sha") != item_sha(entry):
                what = "reply" if kind == "requests" else "output or exit code"
                i = entry.get("i") if isinstance(entry, dict) else "?"
                out.append(f"{kind}[{i}] (turn {_turn_of(kind, entry)}): its {what} was changed after recording")
    return out


def _turn_of(kind: str, entry: Any) -> Any:
    if not isinstance(entry, dict):
        return "?"
    return entry.get("turn") if kind == "commands" else int(entry.get("i", 0)) + 1


def read_records(path: Path) -> list[dict[str, Any]]:
    """The complete records of a ``records.jsonl`` (a torn last line, from a kill, is dropped)."""
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and "record" in item:
            out.append(item)
    return out


def make_tape(mode: str) -> Tape | None:
    """A tape for ``mode`` (None for ``none``)."""
    if mode not in RECORD_MODES:
        raise ValueError(f"record mode must be one of {', '.join(RECORD_MODES)}, not {mode!r}")
    return None if mode == "none" else Tape(mode)


def policy_commands(record: dict[str, Any]) -> Sequence[str]:
    return [str(c.get("command", "")) for c in record.get("commands") or []]
