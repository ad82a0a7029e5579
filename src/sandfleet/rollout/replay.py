"""Replay: a rollout run again from its record, in a fresh sandbox of the same image.

:class:`ReplayPolicy` rebuilds the recorded policy (oracle, noop, scripted, or the agent loop
with a :class:`ReplayModel` that answers every request with the recorded reply). Before each
command runs and each request is answered it is compared with the record: the first one that
differs is the rollout's divergence (:class:`ReplayDiverged`), and its replay stops there.
What ran is then compared command by command (:func:`compare`): same exit code, same output
after the normalizers (:mod:`sandfleet.rollout.normalize`), or the first differing lines.

:func:`check_record` says, before anything runs, why a record can't be replayed (its task's
files or its image are not the recorded ones: refused) and which of its items were edited
after recording (tampered: replayed, and the replay diverges at the first of them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from sandfleet.errors import ModelError, RolloutError
from sandfleet.rollout.chat import ChatReply, CompletionOptions, parse_completion
from sandfleet.rollout.loop import AgentConfig, OpenAIPolicy
from sandfleet.rollout.normalize import DEFAULT, first_difference, normalize
from sandfleet.rollout.policy import AgentContext, NoopPolicy, OraclePolicy, Policy, ScriptedPolicy
from sandfleet.rollout.record import (
    RECORD_VERSION,
    cap,
    image_digest,
    item_sha,
    message_digests,
    plain,
    sha,
    tampered,
    task_files,
)
from sandfleet.tasks.model import Task


class ReplayDiverged(RolloutError):
    """A request or command of the replay differs from the record's: the replay stops."""

    def __init__(self, turn: int, what: str):
        super().__init__(f"replay diverged at turn {turn}: {what}", reason="replay_diverged")
        self.turn = turn
        self.what = what


class ReplayStop(Exception):
    """The replay reached ``until_turn``: the policy stops there (the verifier still runs)."""


class ReplayStoppedBeforeVerifier(RolloutError):
    """``--stop-before verifier``: the policy is done, the verifier does not run."""

    def __init__(self) -> None:
        super().__init__("replay stopped before the verifier", reason="replay_stopped_before_verifier")


@dataclass
class ReplayState:
    """What one rollout's replay has consumed of its record, and where it diverged."""

    record: dict[str, Any]
    normalizers: tuple[str, ...] = DEFAULT
    requests: int = 0
    diverged: dict[str, Any] | None = None
    until_turn: int | None = None
    """Stop the policy before its first request or command of a later turn."""
    stopped: bool = False
    stop_before_verifier: bool = False
    """End the rollout when the policy is done, before the verifier."""

    def stop_at(self, turn: int) -> None:
        if self.until_turn is not None and turn > self.until_turn:
            self.stopped = True
            raise ReplayStop(turn)

    def diverge(self, turn: int, what: str) -> ReplayDiverged:
        if self.diverged is None:
            self.diverged = {"turn": turn, "what": what}
        return ReplayDiverged(turn, what)


class ReplayModel:
    """A :class:`~sandfleet.rollout.policy.Model` that answers from the record: request i gets
    the reply recorded for request i, if it is the recorded request (the same sampling
    parameters and tools, the same messages after the normalizers)."""

    def __init__(self, state: ReplayState):
        self.state = state
        self.model = state.record.get("policy", {}).get("model")

    async def complete(self, messages: list[dict[str, Any]], **opts: Unpack[CompletionOptions]) -> ChatReply:
        tools, max_tokens, temperature, extra = (opts.get("tools"), opts.get("max_tokens"), opts.get("temperature"),
                                                 opts.get("extra"))
        st = self.state
        i = st.requests
        st.stop_at(i + 1)
        st.requests += 1
        recorded = st.record.get("requests") or []
        if i >= len(recorded):
            raise st.diverge(i + 1, f"request {i + 1} is not in the record (the original made {len(recorded)})")
        rec = recorded[i]
        if rec.get("sha") != item_sha(rec):
            raise st.diverge(i + 1, f"the recorded reply to request {i + 1} was changed after recording")
        params = plain({"max_tokens": max_tokens, "temperature": temperature, "extra": extra or {}})
        for key, value in params.items():
            if rec.get("params", {}).get(key) != value:
                raise st.diverge(i + 1, f"request {i + 1}: {key} is {value!r}, recorded {rec['params'].get(key)!r}")
        if (sha(tools) if tools else None) != rec.get("tools_sha"):
            raise st.diverge(i + 1, f"request {i + 1}: the tools offered differ from the recorded ones")
        what = self._messages_differ(messages, rec)
        if what is not None:
            raise st.diverge(i + 1, f"request {i + 1}: {what}")
        if "error" in rec:  # the original request failed (a server that refused tools): the same again
            err = rec["error"]
            raise ModelError(str(err.get("message", "")), reason=str(err.get("reason") or "model_error"))
        return parse_completion({"choices": [rec["reply"]], "usage": rec.get("usage") or {}})

    def _messages_differ(self, messages: list[dict[str, Any]], rec: dict[str, Any]) -> str | None:
        m = rec.get("messages") or {}
        if len(messages) != m.get("n"):
            return f"{len(messages)} messages, recorded {m.get('n')}"
        start = int(m.get("from", 0))
        # the norm digests were made with the record's normalizers: usable where the replay allows them all
        made_with = tuple(self.state.record.get("normalizers") or DEFAULT)
        use_norm = set(made_with) <= set(self.state.normalizers)
        full = rec.get("new_messages") or []
        for j, digest in enumerate(m.get("new") or []):
            msg = messages[start + j]
            now = message_digests(msg, made_with)
            if now["sha"] == digest.get("sha") or (use_norm and now["norm"] == digest.get("norm")):
                continue
            content = msg.get("content")
            text = content if isinstance(content, str) else str(content)
            where = f"message {start + j + 1} ({msg.get('role')}) differs from the recorded one"
            if j < len(full):  # a full record says how
                old = full[j].get("content")
                diff = first_difference(old if isinstance(old, str) else str(old), text)
                if diff is not None:
                    where += f" at line {diff['line']}: recorded {diff['recorded']!r}, now {diff['replayed']!r}"
            return where
        return None


class _RecordedCommands:
    """Runs the recorded commands again as they were run: for a policy replay can't rebuild."""

    def __init__(self, name: str, commands: Sequence[dict[str, Any]]):
        self.name = name
        self.commands = list(commands)

    async def act(self, ctx: AgentContext) -> str:
        for c in self.commands:
            ctx.turns = int(c.get("turn") or ctx.turns)
            argv = c.get("argv")
            await ctx.run(argv if argv else str(c["command"]), env=c.get("env"), shell=bool(c.get("shell", True)),
                          timeout=float(c.get("timeout_s") or 0) or None)
        return "done"


Rebuilder = Callable[[dict[str, Any], "ReplayModel", AgentConfig], Policy]
REBUILDERS: dict[str, Rebuilder] = {}
"""Agent-loop policies of other layers (an integration's session policy), by their recorded
``class``: each makes the policy again from its record's ``policy`` (with the ``args`` its
``replay_args()`` gave), over the replay's model and recorded config. Registered with
:func:`register_rebuilder` where the class is defined; ``sandfleet replay`` imports them."""


def register_rebuilder(cls_name: str, build: Rebuilder) -> None:
    REBUILDERS[cls_name] = build


def rebuild_policy(record: dict[str, Any], state: ReplayState) -> Policy:
    """The recorded policy, its model (if any) answering from the record."""
    desc = record.get("policy") or {}
    name = str(desc.get("name", ""))
    build = REBUILDERS.get(str(desc.get("class")))
    if build is not None and "config" in desc:
        fields = set(AgentConfig.__dataclass_fields__)
        return build(desc, ReplayModel(state), AgentConfig(**{k: v for k, v in desc["config"].items() if k in fields}))
    if name == "oracle":
        return OraclePolicy()
    if name == "noop":
        return NoopPolicy()
    if name == "scripted" and "commands" in desc:
        return ScriptedPolicy(desc["commands"])
    if "config" in desc:  # the agent loop over a model
        fields = set(AgentConfig.__dataclass_fields__)
        config = AgentConfig(**{k: v for k, v in desc["config"].items() if k in fields})
        policy = OpenAIPolicy(model=ReplayModel(state), config=config, extra_body=desc.get("extra_body"))
        policy.name = name or policy.name
        return policy
    if record.get("requests"):
        raise ValueError(f"policy {name!r} ({desc.get('class')}) asked a model, and replay can't rebuild it")
    return _RecordedCommands(name, record.get("commands") or [])


class ReplayPolicy:
    """The recorded policy, acting again under the record's eye (one instance per rollout)."""

    def __init__(self, record: dict[str, Any], normalizers: Sequence[str] = DEFAULT, until_turn: int | None = None,
                 stop_before_verifier: bool = False):
        self.state = ReplayState(record, tuple(normalizers), until_turn=until_turn,
                                 stop_before_verifier=stop_before_verifier)
        self.inner = rebuild_policy(record, self.state)
        self.name = str(record.get("policy", {}).get("name") or self.inner.name)

    async def act(self, ctx: AgentContext) -> str:
        if ctx.tape is None:
            raise RolloutError("a replay needs its rollout taped (record mode commands or full)", reason="no_tape")
        recorded = self.state.record.get("commands") or []
        ctx.tape.expect = lambda entry: self._expect(entry, recorded)
        try:
            stop = await self.inner.act(ctx)
        except ReplayStop:
            ctx.info["replay_until_turn"] = self.state.until_turn
            if self.state.stop_before_verifier:
                raise ReplayStoppedBeforeVerifier() from None
            return "until_turn"
        self._check_done(ctx)
        if self.state.stop_before_verifier:
            raise ReplayStoppedBeforeVerifier()
        return stop

    def _check_done(self, ctx: AgentContext) -> None:
        """A replay that made fewer commands or requests than the record diverges at the first it did not."""
        assert ctx.tape is not None
        recorded = self.state.record.get("commands") or []
        ran, made = len(ctx.tape.commands), self.state.requests
        if ran < len(recorded):
            self.state.diverge(int(recorded[ran].get("turn") or 0),
                               f"the replay stopped after {ran} of {len(recorded)} recorded commands")
        elif made < len(self.state.record.get("requests") or []) and "config" in self.state.record.get("policy", {}):
            self.state.diverge(made + 1, f"the replay stopped after {made} of "
                               f"{len(self.state.record.get('requests') or [])} recorded requests")

    def _expect(self, entry: dict[str, Any], recorded: list[dict[str, Any]]) -> None:
        i, turn = int(entry["i"]), int(entry["turn"])
        self.state.stop_at(turn)
        if i >= len(recorded):
            raise self.state.diverge(turn, f"command {i + 1} `{entry['command'][:200]}` is not in the record "
                                           f"(the original ran {len(recorded)})")
        rec = recorded[i]
        if rec.get("sha") != item_sha(rec):
            raise self.state.diverge(int(rec.get("turn") or turn), f"the recorded exit code or output of command "
                                                                    f"{i + 1} was changed after recording")
        if rec.get("command") != entry["command"] or bool(rec.get("shell")) != entry["shell"] \
                or (rec.get("env") or None) != (entry["env"] or None):
            raise self.state.diverge(turn, f"command {i + 1} is `{entry['command'][:200]}`, recorded "
                                           f"`{str(rec.get('command'))[:200]}`")


# -- before anything runs


@dataclass
class Check:
    """What a record's check found: why it is refused, and what of it was edited."""

    refused: list[str] = field(default_factory=list)
    tampered: list[str] = field(default_factory=list)
    task: Task | None = None


def check_record(record: dict[str, Any], tasks_dir: Path | None = None, *, local_image: bool = True) -> Check:
    """Refuse a record whose task files or image are not the recorded ones (naming what
    differs; an edited test file by name), and list its items edited after recording.
    ``local_image=False``: the image is not looked for here (a replay on a service checks it there)."""
    from sandfleet.tasks import load_task
    from sandfleet.tasks.reward import with_reward_selection

    out = Check(tampered=tampered(record))
    if record.get("tape_error"):
        out.refused.append(f"the record is incomplete: taping stopped ({record['tape_error']})")
    if isinstance(tree := record.get("tree"), dict):  # --branch (rollout/tree.py; docs/replay.md)
        out.refused.append(f"a leaf of a branched rollout (tree {tree.get('tree_id')}, node {tree.get('node_id')}): "
                           "replay runs straight rollouts, and this one's path was played by several sandboxes "
                           "with its nodes' seeds")
    out.refused += [t for t in out.tampered if t.startswith("the record's")]  # what to run can't be trusted
    if record.get("record") != RECORD_VERSION:
        out.refused.append(f"record version {record.get('record')!r} (this sandfleet reads {RECORD_VERSION})")
        return out
    path = Path(str(record.get("task_dir", "")))
    if tasks_dir is not None:
        path = tasks_dir / path.name
    if not path.is_dir():
        out.refused.append(f"task folder {path} is gone")
        return out
    try:
        task = load_task(path)
    except Exception as e:
        out.refused.append(f"task {path} no longer loads: {e}")
        return out
    digest = record.get("task_digest") or {}
    recorded, now = dict(digest.get("files") or {}), task_files(task, cached=False)
    tests = str(record.get("tests_prefix") or "tests/")
    for name in sorted(set(recorded) | set(now)):
        if recorded.get(name) == now.get(name):
            continue
        how = "added" if name not in recorded else "removed" if name not in now else "edited"
        kind = "test file" if tests and name.startswith(tests) else "task file"
        out.refused.append(f"{kind} {name} was {how} after the record ({recorded.get(name)} -> {now.get(name)})")
    image = record.get("image") or {}
    current = image_digest(str(image.get("ref"))) if local_image else image.get("digest")
    if current != image.get("digest"):
        out.refused.append(f"image {image.get('ref')} is {current or 'not found'} here, recorded {image.get('digest')}")
    try:
        rebuild_policy(record, ReplayState(record))
    except (ValueError, TypeError) as e:
        out.refused.append(str(e))
    if not out.refused:
        out.task = with_reward_selection(task, digest.get("reward_key"), digest.get("reward_weights"))
    return out


# -- after it ran


def compare(
    record: dict[str, Any], replayed: dict[str, Any] | None, reward: float | None, diverged: dict[str, Any] | None,
    normalizers: Sequence[str] = DEFAULT, until_turn: int | None = None, scored: bool = True,
) -> dict[str, Any]:
    """One rollout's comparison: reward, per command exit code and output (only the commands
    of turns up to ``until_turn``, where given: then the reward is shown, not compared), and the
    verifier's exit code and output."""
    old = [c for c in record.get("commands") or [] if until_turn is None or int(c.get("turn") or 0) <= until_turn]
    new = (replayed or {}).get("commands") or []
    rows, identical = command_rows(old, new, normalizers)
    recorded_reward = (record.get("result") or {}).get("reward")
    same_reward = diverged is None and reward == recorded_reward
    reward_counts = same_reward or until_turn is not None or not scored
    status = "diverged" if diverged else "identical" if reward_counts and identical == len(old) else "drifted"
    return {"rollout_id": record.get("rollout_id"), "task": record.get("task"), "status": status,
            "same_reward": same_reward, "reward": {"recorded": recorded_reward, "replayed": reward},
            "commands": len(old), "commands_identical": identical, "diverged_at": diverged, "command_rows": rows,
            "verifier": _verifier_same(record, replayed, normalizers)}


def command_rows(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]], normalizers: Sequence[str],
                 turn: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """Recorded commands OLD beside replayed NEW, one row each (its exit code and output: the same,
    or both; ``ran: False`` past the replay's end), and how many are identical. ``turn``: every
    row's turn (a record without turns), else each recorded command's own."""
    rows: list[dict[str, Any]] = []
    identical = 0
    for i, rec in enumerate(old):
        row: dict[str, Any] = {"i": i, "turn": rec.get("turn") if turn is None else turn,
                               "command": str(rec.get("command"))[:200]}
        if i >= len(new):
            row["ran"] = False
            rows.append(row)
            continue
        got = new[i]
        row["exit_code"] = "same" if got.get("exit_code") == rec.get("exit_code") else \
            {"recorded": rec.get("exit_code"), "replayed": got.get("exit_code")}
        row["output"] = _output_same(rec, got, normalizers)
        if row["exit_code"] == "same" and row["output"] in ("same", "same after normalizers"):
            identical += 1
        rows.append(row)
    return rows, identical


def _verifier_same(record: dict[str, Any], replayed: dict[str, Any] | None, normalizers: Sequence[str]) -> Any:
    """The verifier's exit code and output against the record's (shown; the reward decides)."""
    old, new = record.get("verifier") or {}, (replayed or {}).get("verifier") or {}
    if not new or new.get("exit_code") is None:
        return None  # it did not run
    a, b = str(old.get("output", "")), str(new.get("output", ""))
    out = _output_same({"output": a, "output_sha": sha(a)}, {"output": b, "output_sha": sha(b)}, normalizers)
    code = "same" if old.get("exit_code") == new.get("exit_code") else \
        {"recorded": old.get("exit_code"), "replayed": new.get("exit_code")}
    return {"exit_code": code, "output": out}


def _output_same(rec: dict[str, Any], got: dict[str, Any], normalizers: Sequence[str]) -> Any:
    if rec.get("output_sha") == got.get("output_sha"):
        return "same"
    limit = int(rec.get("cap") or len(str(rec.get("output", ""))))
    a, b = str(rec.get("output", "")), cap(str(got.get("output", "")), limit)
    if normalizers and normalize(a, normalizers) == normalize(b, normalizers):
        return "same after normalizers"
    diff = first_difference(normalize(a, normalizers), normalize(b, normalizers))
    return diff or "differs"
