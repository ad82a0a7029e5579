"""The task's prepare step, and the prepared state a group forks from.

Neither Harbor nor Terminal-Bench 1 has a prepare step that runs to completion (TB1's
compose ``command`` and a Dockerfile's CMD are the container's keep-alive main process,
``sleep infinity``), so sandfleet's is an extension: ``environment/prepare.sh`` in the task
folder (docs/tasks.md). It runs with bash, as root, from the task workdir, after the sandbox
starts and before the agent; then the workdir is handed to the agent's uid, as the image
build does. Without ``--fork`` every rollout runs it in its own fresh sandbox; with
``--fork`` a group runs it once (:func:`prepared_snapshot`) and its members fork from the
snapshot. A fork carries the filesystem on bwrap (memory too on microvm); processes the
script left running are not carried on bwrap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sandfleet.errors import RolloutError
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox, Snapshot
from sandfleet.sandbox.registry import is_isolated
from sandfleet.sandbox.spec import AGENT_UID, SandboxSpec
from sandfleet.tasks.model import Task

log = logging.getLogger(__name__)

SCRIPT_PATH = "/tmp/.sandfleet-prepare.sh"
"""Where the script is put for its run (removed when it ends, so the prepared state holds none)."""
OUTPUT_TAIL = 2000


async def run_prepare(task: Task, sandbox: Sandbox) -> None:
    """Run the task's prepare step in ``sandbox``; raises :class:`RolloutError` with reason
    ``prepare_failed`` (non-zero exit, with the output's tail) or ``prepare_timeout``."""
    plan = task.prepare
    if plan is None:
        return
    isolated = is_isolated(sandbox.backend)  # the process backend has no users: no root, no hand-over
    user = "root" if isolated else None
    await sandbox.write_file(SCRIPT_PATH, plan.script.read_bytes(), mode=0o700, user=user)
    mapper = getattr(sandbox, "_path", None)  # the process backend keeps sandbox paths under its folder
    script = str(mapper(SCRIPT_PATH)) if mapper is not None else SCRIPT_PATH
    res = await sandbox.exec(["sh", "-c", 'bash "$1"; rc=$?; rm -f -- "$1"; exit $rc', "prepare", script],
                             cwd=task.workdir, timeout=plan.timeout_s, user=user)
    where = f"{task.name}: environment/prepare.sh"
    if res.timed_out:
        raise RolloutError(f"{where} timed out after {plan.timeout_s:g} s; output tail:\n"
                           f"{res.output[-OUTPUT_TAIL:]}", reason="prepare_timeout")
    if res.exit_code != 0:
        raise RolloutError(f"{where} exited with {res.exit_code}; output tail:\n{res.output[-OUTPUT_TAIL:]}",
                           reason="prepare_failed")
    if isolated:  # what root made in the workdir is the agent's, as after the image build
        hand = await sandbox.exec(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", "--", task.workdir],
                                  cwd="/", timeout=60, user="root")
        if hand.exit_code != 0:
            raise RolloutError(f"{where}: handing {task.workdir} to the agent failed: "
                               f"{hand.output.strip()[-300:]}", reason="prepare_failed")


async def start_sandbox(make: Callable[[], Awaitable[Sandbox]]) -> Sandbox:
    """Create a sandbox; if cancelled meanwhile, let the creation finish and close it."""
    creating = asyncio.ensure_future(make())
    try:
        return await asyncio.shield(creating)
    except asyncio.CancelledError:
        try:
            sandbox = await creating
        except Exception:  # the creation failed on its own: nothing was made to close
            raise asyncio.CancelledError() from None
        await close_logged(sandbox)
        raise


async def close_logged(sandbox: Sandbox) -> str | None:
    """Close a sandbox; a failure is logged with the sandbox id and returned (never raised:
    the caller is cleaning up), so it can be counted."""
    try:
        await sandbox.close()
    except Exception as e:
        log.error("closing sandbox %s failed (it may have leaked): %s: %s", sandbox.id, type(e).__name__, e)
        return f"{type(e).__name__}: {e}"
    return None


@dataclass
class Prepared:
    """A group's prepared state: the snapshot its members fork from, and what it cost."""

    snapshot: Snapshot
    sandbox_id: str
    seconds: float
    """Wall time of create + prepare + snapshot + close."""
    close_error: str | None = None


async def prepared_snapshot(task: Task, spec: SandboxSpec) -> Prepared:
    """One sandbox of ``spec``, prepared, snapshotted and closed: the state a group forks
    from. A snapshot whose making is cancelled is deleted; the sandbox is always closed."""
    t0 = time.perf_counter()
    sandbox = await start_sandbox(lambda: create_sandbox(spec))
    try:
        await run_prepare(task, sandbox)
        saving = asyncio.ensure_future(sandbox.snapshot())
        try:
            snapshot = await asyncio.shield(saving)
        except asyncio.CancelledError:
            try:
                made = await saving
            except Exception:
                raise asyncio.CancelledError() from None
            await asyncio.to_thread(made.delete)
            raise
    finally:
        error = await asyncio.shield(close_logged(sandbox))
    return Prepared(snapshot, sandbox.id, time.perf_counter() - t0, error)


async def delete_snapshot(snapshot: Snapshot) -> str | None:
    """Delete a snapshot (also when cancelled meanwhile); a failure is logged and returned."""
    deleting = asyncio.ensure_future(asyncio.to_thread(snapshot.delete))
    try:
        await asyncio.shield(deleting)
    except asyncio.CancelledError:
        await asyncio.wait([deleting])
        raise
    except Exception as e:
        log.error("deleting snapshot %s failed: %s: %s", snapshot.id, type(e).__name__, e)
        return f"{type(e).__name__}: {e}"
    return None
