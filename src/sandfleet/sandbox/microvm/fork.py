"""Snapshots of running microvm sandboxes, turned into templates that forks restore from.

A running VM maps its template's memory privately, so its own pages can't be referenced
by file: the snapshot first migrates the whole VM (RAM included) to a stream file and
resumes it, then a paused helper VM loads that stream into a *shared* mapping of a new
memory file and saves its device state from there. The result is an ordinary
:class:`Template`: forks restore from it in the same fraction of a second as fresh
sandboxes, and share its untouched pages.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sandfleet.errors import SandboxError
from sandfleet.sandbox.base import new_id
from sandfleet.sandbox.microvm.template import Template
from sandfleet.sandbox.microvm.vm import Vm, VmSpec, log_tail
from sandfleet.sandbox.state import new_snapshot_dir


async def snapshot_vm(vm: Vm, spec: VmSpec, name: str) -> Template:
    """Save the running ``vm`` (memory and its in-memory writable layer; it keeps running)
    as a template of ``spec`` in a fresh snapshot directory, marked with its owner (reaped
    if the owner dies); removing ``template.dir`` deletes it. ``name``: the sandbox, for errors."""
    assert vm.qmp is not None
    snap = new_snapshot_dir()
    full = snap / "full.stream"
    try:
        await vm.set_ignore_shared(False)
        try:
            await vm.save(full)
        finally:
            await vm.qmp.execute("cont")
            await vm.set_ignore_shared(True)
        tpl = Template(snap, spec)
        await _templatize(full, tpl)
    except BaseException as exc:
        shutil.rmtree(snap, ignore_errors=True)
        if isinstance(exc, Exception) and not isinstance(exc, SandboxError):
            raise SandboxError(f"snapshot of {name} failed: {exc}") from exc
        raise
    finally:
        full.unlink(missing_ok=True)
    return tpl


async def _templatize(full: Path, tpl: Template) -> None:
    """Load a full migration stream into ``tpl.mem`` (shared) and save ``tpl.state``."""
    helper = await Vm.start(new_id("microvm-snap"), tpl.spec, tpl.mem, share=True, incoming=full, ignore_shared=False)
    try:
        await helper.wait_running(resume=False)
        await helper.set_ignore_shared(True)
        await helper.save(tpl.state)
    except Exception as exc:
        raise SandboxError(f"saving the snapshot failed: {exc}\n{log_tail(helper.run)}") from exc
    finally:
        await helper.stop()
