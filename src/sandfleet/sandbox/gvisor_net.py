"""network=True for the gvisor backend: a network namespace of its own for runsc's Sentry,
served by pasta (docs/security.md, "Backends side by side")."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

from sandfleet.errors import ConfigError, HostUnsupportedError
from sandfleet.sandbox import network, uids
from sandfleet.sandbox.spec import BwrapConfig, Limits
from sandfleet.sandbox.state import proc_start_time, read_meta, write_meta


class NetNamespace:
    """network=True: a network namespace of its own (in a user namespace owned by the network
    helper's uid, as bwrap's P is), held by a sleeping process, with pasta serving eth0 in it
    (sandbox/network.py). runsc's Sentry joins it (``--network=sandbox``), takes eth0's
    address and routes and speaks to pasta through it with gVisor's own TCP/IP stack."""

    def __init__(self, sdir: Path, sid: str, limits: Limits):
        if limits.allow is not None or limits.deny:
            raise ConfigError("the gvisor backend has no allowlisted network (allow=/deny=): "
                              "use --backend bwrap for an allowlist")
        network.check_available()
        tools = {t: shutil.which(t) for t in ("setpriv", "unshare", "sleep")}
        missing = [t for t, path in tools.items() if not path]
        if missing:
            raise HostUnsupportedError(f"network=True on gvisor needs {', '.join(missing)}: "
                                       "apt-get install util-linux")
        # the helper's uid is a uid slot's owner, held for the namespace's life as a bwrap
        # sandbox holds its slot: the firewall judges a helper's sockets by its uid, and an
        # allowlisted bwrap sandbox's rules are keyed by it. Slot 0's owner for every gvisor
        # sandbox (as before 2026-12-05) shared the uid of the bwrap sandbox in slot 0, and
        # starting its helper dropped that sandbox's allowlist (attach() clears a stale entry
        # of the uid it is given): the sandbox reached every address (CI, e2b allow_out).
        self.slot = uids.take_slot(BwrapConfig())
        self.uid = network.helper_uid(slot_base=self.slot.base)
        self.helper: network.Helper | None = None
        try:
            self.holder = subprocess.Popen(
                [str(tools["setpriv"]), "--reuid", str(self.uid), "--regid", str(self.uid), "--clear-groups",
                 str(tools["unshare"]), "--user", "--map-root-user", "--net", "--", str(tools["sleep"]), "infinity"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                start_new_session=True)
        except BaseException:
            self.slot.release()
            raise
        try:
            self.start = proc_start_time(self.holder.pid)
            meta = read_meta(sdir) or {"id": sid}
            write_meta(sdir, {**meta, "pids": [*meta.get("pids", []), self.holder.pid],
                              "pid_starts": {**meta.get("pid_starts", {}), str(self.holder.pid): self.start}})
            network.netns_holder(self.holder.pid)  # (returns once the sleep is in its namespace)
            self.helper = network.attach(self.holder.pid, rundir=sdir / "net", uid=self.uid, forward=limits.forward,
                                         owner=sid, map_gw=True)
            meta = read_meta(sdir) or meta
            write_meta(sdir, {**meta, "pids": [*meta.get("pids", []), self.helper.pid],
                              "pid_starts": {**meta.get("pid_starts", {}), str(self.helper.pid): self.helper.start},
                              **self.helper.meta()})
        except BaseException:
            self.close()
            raise

    @property
    def path(self) -> str:
        return f"/proc/{self.holder.pid}/ns/net"

    def close(self) -> None:
        """End pasta and the holder (and reap it: our child), then free the uid slot."""
        try:
            if self.helper is not None:
                self.helper.close()
        finally:
            try:
                if self.holder.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        self.holder.kill()
                self.holder.wait()
            finally:
                self.slot.release()
