"""The image's own environments in the workdir, as the agent found them (round XXVI).

An image that makes the project's venv in the workdir (``RUN python3 -m venv /app/.venv &&
/app/.venv/bin/pip install pytest``) hands the tests a runner that is a file of the
workdir's, which the agent may change: a ``bin/pytest`` that prints a pass and exits 0, a
``pytest/__main__.py`` rewritten, a byte-compiled module planted in a ``__pycache__``. By the
time the tests run, every file there is older than the preparation, the image's and the
agent's alike, and the platform's own steps (the workdir handed to the tests' user, unpacked
into a fresh sandbox) leave no earlier time to compare with.

So the record is taken before the agent's first command (:func:`record_envs`, as the
sandbox is made ready): the guest agent's ``envs-record`` names the venvs of the workdir and
a time after every write the platform made there; a change time after it (which no process
can set) is the agent's. The host keeps the record, never the sandbox: on microvm every
command is root, and the agent could rewrite a record kept inside. The verifier's
preparation then lists what of those venvs changed since (``ENVS_SINCE`` and ``v:``
entries; for ``--verify separate`` the list is made in the agent's sandbox before its
workdir is copied, :func:`changed_entries`), removes the changed byte-compiled files, and
leaves the list to the seal: a program or ``-m`` module of such a venv that changed does not
run for the tests (status 126), and the rest is the image's, whose frames the Python guard
takes for the tests' own (agent/seal.c, ``image_env``; docs/security.md, round XXVI).
"""

from __future__ import annotations

import logging
import os
import re
import weakref
from dataclasses import dataclass

from sandfleet.errors import GuestError, SandboxClosedError, SandboxDiedError
from sandfleet.imagestore import resolve_image
from sandfleet.sandbox.base import ExecResult, Sandbox
from sandfleet.sandbox.registry import RUNS_AS_USER, is_isolated
from sandfleet.sandbox.spec import helper_path, is_root
from sandfleet.tasks.model import Task

log = logging.getLogger(__name__)

RECORD_TIMEOUT_S = 30.0
MAX_ENTRIES = 20000
"""Changed entries carried to a fresh sandbox per venv; past it, the venv is the agent's whole."""


@dataclass(frozen=True)
class EnvRecord:
    """The venvs of the workdir before the agent's first command, and the guest's time then."""

    since: str
    """``SEC.NSEC`` on the guest's clock: a change time after it is the agent's."""
    roots: tuple[str, ...]
    """The image's venvs in the workdir (none: the record is taken for the image's programs alone)."""


_records: weakref.WeakKeyDictionary[Sandbox, EnvRecord] = weakref.WeakKeyDictionary()


def recorded(sandbox: Sandbox) -> EnvRecord | None:
    """The record taken as ``sandbox`` was made ready (or as the sandbox it branched from was)."""
    return _records.get(sandbox)


def inherit(child: Sandbox, parent: Sandbox) -> None:
    """A branch of ``parent`` holds what the agent did before the split: it keeps the parent's record."""
    record = _records.get(parent)
    if record is not None:
        _records[child] = record


def _records_of(data: bytes) -> list[str]:
    """NUL-terminated records, decoded as the guest's file names are (surrogateescape)."""
    return [os.fsdecode(r) for r in data.split(b"\0") if r]


_no_envs: set[tuple[str, str, str]] = set()
"""(backend, image hash, workdir) of this host's images whose workdir holds no venv as a sandbox starts."""


def _image_key(task: Task, sandbox: Sandbox) -> tuple[str, str, str] | None:
    """What the workdir a sandbox starts with is a function of: a stored image of this host's (by
    its content hash) and no prepare step; None where it is not (the host's own root, a sandbox
    of a service's, whose images are the service's)."""
    if task.prepare is not None or not type(sandbox).__module__.startswith("sandfleet.sandbox."):
        return None
    try:
        image = resolve_image(sandbox.spec.image)
    except Exception:  # (whatever the store says: no answer kept)
        return None
    return None if image.is_host else (sandbox.backend, image.hash, task.workdir)


def agent_is_root(sandbox: Sandbox) -> bool:
    """The agent's commands are root's in ``sandbox``: its user is, or the backend runs every command
    as root (microvm). Root can change the image's own programs, which the seal takes for the tests'
    unless the record says when the agent's commands began (:func:`record_envs`)."""
    return is_root(sandbox.spec.user) or sandbox.backend not in RUNS_AS_USER


async def record_envs(task: Task, sandbox: Sandbox, *, programs: bool = True) -> EnvRecord | None:
    """Take the record (run as root, just before the agent's first command); None where the
    backend has no guest agent to take it or the workdir holds no venv and the agent is not root
    (an image found with none is not asked again: :func:`_image_key`). Where the agent is root the
    record is kept for its time alone: a program of the image's system folders changed after it
    (and before the verifier's preparation) is the agent's (agent/seal.c, ``agent_changed``). A
    failure is logged: the rollout goes on as before this round (judged by the older rules).
    ``programs``: the record's time is wanted for the image's programs too (the tests will run in this
    sandbox: not where a fresh one verifies, --verify separate, whose programs are the image's)."""
    native = helper_path(sandbox.backend)
    if not is_isolated(sandbox.backend) or not task.workdir.startswith("/"):
        return None
    root = programs and agent_is_root(sandbox)
    if native is None:  # (SANDFLEET_NATIVE_HELPERS=0: the scripts prepare) the time alone, for a root agent
        if not root:
            return None
        res = await _helper(sandbox, ["date", "+%s.%N"], "no record of when the agent's commands began")
        since = res.stdout.strip() if res is not None else ""
        if not re.fullmatch(r"[0-9]+\.[0-9]{9}", since):
            return None
        record = EnvRecord(since=since, roots=())
        _records[sandbox] = record
        return record
    key = _image_key(task, sandbox)
    if key is not None and key in _no_envs and not root:
        return None
    res = await _helper(sandbox, [native, "envs-record", task.workdir],
                        "no record of the image's venvs (they are judged as before)")
    records = _records_of(res.stdout_bytes) if res is not None else []
    if res is None or not records or not records[0].startswith("s"):
        return None
    roots = tuple(r[1:] for r in records[1:] if r.startswith("v/"))
    if not roots:
        if key is not None and not res.stderr.strip():  # (a venv left out for its clock is asked again)
            _no_envs.add(key)
        if not root:
            return None
    record = EnvRecord(since=records[0][1:], roots=roots)
    _records[sandbox] = record
    return record


def walk_entries(record: EnvRecord) -> tuple[list[str], dict[str, str]]:
    """The preparation's entries and environment where it runs in the agent's own sandbox: it
    walks the venvs itself."""
    return [f"v:{r}" for r in record.roots], {"ENVS_SINCE": record.since}


async def changed_entries(record: EnvRecord, sandbox: Sandbox) -> list[str]:
    """What of the record's venvs changed in the agent's ``sandbox`` (``--verify separate``,
    before its workdir is copied out), as the fresh sandbox's preparation takes it: ``v:``
    each venv, ``c:`` each changed entry, ``a:`` a venv the agent made whole. A venv whose
    list can't be had or carried (the helper failed, a name that is not text, past
    ``MAX_ENTRIES``) is the agent's whole."""
    whole = [e for r in record.roots for e in (f"v:{r}", f"a:{r}")]
    native = helper_path(sandbox.backend)
    if native is None or not record.roots:  # (a record for the time alone: a fresh sandbox's programs are the image's)
        return whole
    res = await _helper(sandbox, [native, "envs-changes", record.since, *record.roots],
                        "the image's venvs could not be listed (taken for the agent's)")
    if res is None:
        return whole
    listed: dict[str, list[str] | None] = {}  # each venv's entries; None: the agent's whole
    root = None
    for r in _records_of(res.stdout_bytes):
        kind, path = r[:1], r[1:]
        if kind == "v":
            root = path
            listed[root] = []
            continue
        entries = listed.get(root) if root is not None else None
        if root is None or entries is None:  # (no venv named yet, or the agent's whole already)
            continue
        if kind not in ("c", "a") or not path.startswith("/") or not _text(path) or len(entries) >= MAX_ENTRIES:
            listed[root] = None
        else:
            entries.append(f"{kind}:{path}")
    return [e for r, entries in listed.items() for e in (f"v:{r}", *(entries if entries is not None else [f"a:{r}"]))]


async def _helper(sandbox: Sandbox, argv: list[str], failed: str) -> ExecResult | None:
    """A guest agent's helper run as root; None (logged, with FAILED's words) where it could not
    run or failed. A sandbox that died or closed is the rollout's failure, raised."""
    try:
        res = await sandbox.exec(argv, cwd="/", user="root", timeout=RECORD_TIMEOUT_S)
    except (SandboxDiedError, SandboxClosedError):
        raise
    except GuestError as e:
        log.warning("%s: %s in %s", failed, e, sandbox.id)
        return None
    if res.exit_code != 0:
        log.warning("%s: exit %s in %s: %s", failed, res.exit_code, sandbox.id, res.stderr.strip()[-300:])
        return None
    return res


def _text(path: str) -> bool:
    try:
        path.encode()
    except UnicodeEncodeError:
        return False
    return True
