"""Root's default state directory: /run/sandfleet on a tmpfs /run, else /dev/shm/sandfleet
where that is a tmpfs that allows exec and nobody else made it first (each case in a mount
namespace of its own, so the host's /run and /dev/shm are left alone)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="mounts in a private mount namespace need root and unshare")

PROBE = "from sandfleet.sandbox.state import state_root; print(state_root())"


def _in_namespace(setup: str) -> subprocess.CompletedProcess[str]:
    """Run ``setup`` (shell) then print the state root, in a private mount namespace."""
    env = {k: v for k, v in os.environ.items() if k != "SANDFLEET_STATE"}
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-ec",
         f'{setup}\nexec "{sys.executable}" -c "{PROBE}"'],
        capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(("setup", "want", "warned"), [
    # a systemd host: /run is a tmpfs
    ("mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /dev/shm", "/run/sandfleet", False),
    # /run not a tmpfs (on the development VM it is the root's ext4; ramfs stands in): the tmpfs /dev/shm
    ("mount -t ramfs ramfs /run; mount -t tmpfs tmpfs /dev/shm", "/dev/shm/sandfleet", False),
    # ... unless it is noexec (the agent's copy for bwrap is kept there)
    ("mount -t ramfs ramfs /run; mount -t tmpfs -o noexec tmpfs /dev/shm", "/run/sandfleet", False),
    # ... or not a tmpfs
    ("mount -t ramfs ramfs /run; mount -t ramfs ramfs /dev/shm", "/run/sandfleet", False),
    # ... or someone else made /dev/shm/sandfleet first: left alone, and said
    ("mount -t ramfs ramfs /run; mount -t tmpfs tmpfs /dev/shm; mkdir /dev/shm/sandfleet; "
     "chown 65534 /dev/shm/sandfleet", "/run/sandfleet", True),
    # ... or made it writable by others
    ("mount -t ramfs ramfs /run; mount -t tmpfs tmpfs /dev/shm; mkdir -m 0777 /dev/shm/sandfleet",
     "/run/sandfleet", True),
])
def test_root_state_directory_is_on_a_tmpfs(setup: str, want: str, warned: bool) -> None:
    res = _in_namespace(setup)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == want, res.stderr
    assert ("is not a private directory" in res.stderr) == warned, res.stderr
