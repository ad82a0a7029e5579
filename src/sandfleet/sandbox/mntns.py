"""The mount namespace template a native bwrap sandbox's own is copied from (issue 46).

A sandbox's pid 1 used to copy the launcher's mount namespace (every host mount in it) and
``pivot_root`` into its root, dropping the host's. ``pivot_root`` walks every thread on the
host (the kernel's ``chroot_fs_refs``, under ``tasklist_lock``), two more per idle sandbox:
a start that costs more the more sandboxes the host holds. With the template, a process of
ours pivots once (``sandfleet-agent mntns-template``, agent.c): the template's root is an
empty read-only tmpfs, nothing of the host's is in it. Each launcher then copies the template
(``launch --mntns FD``) and attaches the sandbox's root over that empty one: no walk, and a
copy of three mounts rather than of the host's table.

One template per owner process, made on first use and held by its descriptor (close-on-exec)
until the process ends. Where it can't be made (no pid or mount namespace of its own, a kernel
that refuses the procfs or ``pivot_root``), sandboxes start the old way, and the reason is
logged once.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading

from sandfleet.agent.build import agent_binary
from sandfleet.sandbox.state import state_root

log = logging.getLogger(__name__)

_lock = threading.Lock()
_fd: int | None = None
_why_not: str | None = None


def template_fd() -> int | None:
    """This process's template (an fd of its mount namespace), made on first use; None where
    it can't be made (the sandbox then pivots into its root, as before)."""
    global _fd, _why_not
    with _lock:
        if _fd is None and _why_not is None:
            try:
                _fd = _make()
            except OSError as e:
                _why_not = str(e)
                log.warning("sandboxes start without the mount namespace template: %s", _why_not)
        return _fd


def _make() -> int:
    # DIR only needs to exist: the tmpfs goes over it in the helper's own mount namespace
    proc = subprocess.Popen([str(agent_binary()), "mntns-template", str(state_root())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            raise OSError(f"sandfleet-agent mntns-template made no template: "
                          f"{proc.stderr.read().decode(errors='replace').strip() or 'no output'}")
        return os.open(f"/proc/{int(line)}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        proc.stdin.close()  # its namespace's process ends, the namespace stays held by our fd
        proc.stdout.close()
        proc.wait()
        proc.stderr.close()
