"""The record of a SandboxFusion ``run_code`` call, and its replay (docs/replay.md, issue 45).

verl reaches sandfleet through ``sandfleet serve``'s SandboxFusion dialect: one ``run_code``
call per test case of a response, no task, no rollout. So verl's record is the call's: a
service started with ``SANDFLEET_RECORD_DIR=DIR`` appends one line per answered call to
``DIR/records.jsonl`` (``kind: "sandbox-fusion"``): the request as verl sent it (code,
language, stdin, timeouts, memory, files, fetch_files), the program sandfleet ran for it (the
source file, the compile and run argv), the sandbox spec and image (its digest), the backend,
sandfleet's version and host, each command's exit code and output (capped, with the cap and
the whole output's digest) and the answer's status. ``sandfleet replay DIR`` runs each call
again in a fresh sandbox of the same image and compares the status (``same_reward``: verl
scores a case by it and the output) and each command's exit code and output.

Nothing of the call identifies verl's sample, so the record can't: find a call by its code
(``request.code``) or its time (``start``).
"""

from __future__ import annotations

import base64
import logging
import os
import posixpath
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sandfleet.rollout.normalize import DEFAULT
from sandfleet.rollout.record import RECORD_VERSION, cap, environment, image_digest, plain, sha
from sandfleet.sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)

KIND = "sandbox-fusion"
HEAD = ("request", "program", "image", "spec", "result", "commands")
FILES_CAP = 1 << 20
"""Bytes of ``files`` a record keeps; over it the files are left out and replay refuses the record."""
RECORD_ENV = "SANDFLEET_RECORD_DIR"


def is_fusion(record: dict[str, Any]) -> bool:
    return record.get("kind") == KIND


def _command(i: int, argv: Sequence[str], result: dict[str, Any] | None) -> dict[str, Any]:
    res = result or {}
    out = f"{res.get('stdout') or ''}{res.get('stderr') or ''}"
    return {"i": i, "turn": 1, "command": " ".join(argv), "argv": list(argv), "exit_code": res.get("return_code"),
            "run_status": res.get("status"), "output": cap(out), "output_sha": sha(out), "output_chars": len(out),
            "cap": len(cap(out))}  # fmt: skip


def build(request: dict[str, Any], program: dict[str, Any], spec: SandboxSpec, backend: str | None,
          answer: dict[str, Any], seconds: float, start: float, *, rollout_id: str | None = None) -> dict[str, Any]:
    """One call's record (a line of ``records.jsonl``). ``request``: the fields of verl's body
    that decide what runs; ``program``: ``source``, ``compile`` (argv or None), ``run`` (argv),
    ``workdir``; ``answer``: SandboxFusion's answer as sent."""
    req = plain(request)
    files = req.get("files") or {}
    size = sum(len(str(v or "")) for v in files.values())
    if size > FILES_CAP:
        req["files"] = None
        req["files_omitted"] = f"{size} bytes of files, over the record's {FILES_CAP}"
    commands = []
    if program.get("compile"):
        commands.append(_command(0, program["compile"], answer.get("compile_result")))
    if answer.get("run_result") is not None or not program.get("compile"):
        commands.append(_command(len(commands), program["run"], answer.get("run_result")))
    language = str(req.get("language"))
    rec: dict[str, Any] = {
        "record": RECORD_VERSION, "kind": KIND, "mode": "commands",
        "rollout_id": rollout_id or f"run_code-{uuid.uuid4().hex[:12]}", "run_id": "sandbox-fusion",
        "task": f"run_code:{language}", "start": start, "request": req, "program": plain(program),
        "image": {"ref": spec.image, "digest": image_digest(spec.image)}, "spec": spec.model_dump(mode="json"),
        "backend": backend, "environment": environment(), "normalizers": list(DEFAULT), "commands": commands,
        "result": {"status": answer.get("status"), "message": answer.get("message") or "",
                   "reward": answer.get("status"), "duration_s": round(seconds, 4),
                   "files": sorted(answer.get("files") or {})},
    }  # fmt: skip
    rec["head"] = {k: sha(rec[k]) for k in HEAD}
    return rec


def tampered(record: dict[str, Any]) -> list[str]:
    """The parts of a call's record changed after recording (replay refuses it)."""
    head = record.get("head")
    if not isinstance(head, dict):
        return ["the record's head has no digests (it was changed, or made by an older sandfleet)"]
    return [f"the record's {k} was changed after recording" for k in HEAD if head.get(k) != sha(record.get(k))]


def check(record: dict[str, Any], *, local_image: bool = True) -> list[str]:
    """Why a call's record can't be replayed (empty: it can)."""
    why = tampered(record)
    if record.get("record") != RECORD_VERSION:
        why.append(f"record version {record.get('record')!r} (this sandfleet reads {RECORD_VERSION})")
    if (record.get("request") or {}).get("files_omitted"):
        why.append(f"its files were not kept ({record['request']['files_omitted']})")
    image = record.get("image") or {}
    if local_image and image.get("ref") != "host":
        now = image_digest(str(image.get("ref")))
        if now != image.get("digest"):
            why.append(f"image {image.get('ref')} is {now or 'not found'} here, recorded {image.get('digest')}")
    return why


async def replay(record: dict[str, Any], *, backend: str | None = None,
                 normalizers: Sequence[str] = DEFAULT) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run a call's program again in a fresh sandbox of the recorded spec (on ``backend``, or
    the service in force); its comparison row (the shape of replay's rows) and its own record."""
    from sandfleet.errors import GuestExecError, SandfleetError
    from sandfleet.rollout.replay import command_rows
    from sandfleet.sandbox import create_sandbox

    data = dict(record["spec"])
    if backend:
        data["backend"] = backend
    spec = SandboxSpec.model_validate(data)
    req, prog = record.get("request") or {}, record.get("program") or {}
    workdir = str(prog.get("workdir") or spec.workdir or "/work")
    compile_t, run_t = float(req.get("compile_timeout") or 10.0), float(req.get("run_timeout") or 10.0)
    t0, start = time.perf_counter(), time.time()
    answer: dict[str, Any] = {"status": "SandboxError", "compile_result": None, "run_result": None, "files": {}}
    used = None
    try:
        sb = await create_sandbox(spec)
    except SandfleetError as e:
        answer["message"] = f"the sandbox could not be made: {e}"
    else:
        used = sb.backend
        try:
            answer = await _run(sb, req, prog, workdir, compile_t, run_t)
        except GuestExecError as e:  # the image can't run the language (the dialect answers 400)
            answer = {"status": "Failed", "compile_result": None, "run_result": None, "files": {},
                      "message": f"could not start: {e}"}
        except SandfleetError as e:
            answer["message"] = f"the sandbox failed during the call: {e}"
        finally:
            await sb.close()
    seconds = time.perf_counter() - t0
    again = build(req, prog, spec, used, answer, seconds, start, rollout_id=str(record.get("rollout_id")))
    old, new = record.get("commands") or [], again["commands"]
    rows, identical = command_rows(old, new, normalizers, turn=1)
    recorded, replayed = (record.get("result") or {}).get("status"), answer.get("status")
    same = recorded == replayed
    out = {"rollout_id": record.get("rollout_id"), "task": record.get("task"),
           "status": "identical" if same and identical == len(old) == len(new) else "drifted",
           "same_reward": same, "reward": {"recorded": recorded, "replayed": replayed}, "commands": len(old),
           "commands_identical": identical, "diverged_at": None, "command_rows": rows, "verifier": None,
           "seconds": {"recorded": (record.get("result") or {}).get("duration_s"), "replayed": round(seconds, 4)}}
    if used is not None and used != record.get("backend"):
        out["backend"] = {"recorded": record.get("backend"), "replayed": used}
    return out, again


async def _run(sb: Any, req: dict[str, Any], prog: dict[str, Any], workdir: str, compile_t: float,
               run_t: float) -> dict[str, Any]:
    """The dialect's steps (server/dialects/sandboxfusion): files, the source, compile, run, fetch."""
    files: dict[str, bytes] = {}
    for path, b64 in (req.get("files") or {}).items():
        if b64 is not None:
            files[posixpath.normpath(posixpath.join(workdir, path))] = base64.b64decode(b64)
    files[posixpath.normpath(posixpath.join(workdir, str(prog["source"])))] = str(req.get("code") or "").encode()
    dirs = sorted({posixpath.dirname(p) for p in files} - {workdir})
    if dirs:
        await sb.exec(["mkdir", "-p", "--", *dirs], cwd=workdir)
    for path, data in files.items():
        await sb.write_file(path, data)
    compiled = None
    if prog.get("compile"):
        res = await sb.exec(list(prog["compile"]), cwd=workdir, timeout=compile_t)
        compiled = _result(res)
        if not res.ok:
            return {"status": "Failed", "compile_result": compiled, "run_result": None, "files": {}}
    res = await sb.exec(list(prog["run"]), cwd=workdir, stdin=str(req.get("stdin") or "").encode(), timeout=run_t)
    got = {}
    for p in req.get("fetch_files") or []:
        try:
            got[p] = base64.b64encode(await sb.read_file(posixpath.join(workdir, p))).decode()
        except Exception as e:  # missing: left out, as the dialect does
            log.debug("replay: fetch_files %s: %s", p, e)
    return {"status": "Success" if res.ok else "Failed", "compile_result": compiled, "run_result": _result(res),
            "files": got}


def _result(res: Any) -> dict[str, Any]:
    return {"status": "TimeLimitExceeded" if res.timed_out else "Finished",
            "return_code": None if res.timed_out else res.exit_code, "stdout": res.stdout, "stderr": res.stderr}


class Recorder:
    """Appends each answered call's record to ``folder``/records.jsonl (one write of one line:
    a kill loses only the calls in flight). A record never fails a call."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.folder = Path(folder)
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Recorder | None:
        """A recorder when ``$SANDFLEET_RECORD_DIR`` is set (None otherwise)."""
        from sandfleet.settings import environment as env_of

        folder = (env if env is not None else env_of()).get(RECORD_ENV)
        return cls(folder) if folder else None

    def write(self, record: dict[str, Any]) -> None:
        import json

        line = (json.dumps(record, default=str) + "\n").encode()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with self._lock:
                fd = os.open(self.folder / "records.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
        except OSError as e:
            log.warning("no record of %s written to %s: %s", record.get("rollout_id"), self.folder, e)
