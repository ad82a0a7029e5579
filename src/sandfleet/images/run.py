"""The command line of one Dockerfile ``RUN`` step: rootless, in the sandbox uid range.

The root launcher (``sandfleet-agent launch``) makes a private mount namespace, a tmpfs
holding the step's writable upper layer (a copy of the task layer), and the overlay root;
then it enters a fresh user namespace P that maps P-uid ``i`` to host uid ``base + i``
(``i`` < 65536) of the step's own uid slot (sandbox/uids.py), owned by the slot's
unprivileged owner uid, as P-uid 0, with every capability in P and none in the initial
namespaces, and runs bubblewrap (as root *in P*: no ``--unshare-user``) over that root. So
the step is root inside its image, like ``docker build``, but on the host it is an
unprivileged uid: it can't mknod, write sysctls, load modules, or write any host file.
The upper layer is stored in the canonical range (slot 0, ``uid_base + i``: how sandfleet
stores its layers); in another slot the step sees it through a shifted idmapped mount.

A debootstrap base (owned by host root on disk) is mounted through an idmapped clone
(``--idmap``), so the step sees a root-owned Debian and ``apt-get install`` works. The host
image (``/``) is not idmapped: the host's files show as ``nobody`` and are read-only.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from sandfleet.agent.build import agent_binary
from sandfleet.errors import ImageBuildError
from sandfleet.sandbox import uids
from sandfleet.sandbox.network import StepNetwork
from sandfleet.sandbox.spec import SANDBOX_UIDS, BwrapConfig

__all__ = ["build_command", "bwrap_path", "layer_next", "mount_point"]


def bwrap_path(config: BwrapConfig) -> str:
    """bubblewrap by absolute path (the launcher does no PATH lookup)."""
    path = shutil.which(config.bwrap)
    if not path:
        raise ImageBuildError(f"bubblewrap ({config.bwrap}) is not installed: apt-get install bubblewrap")
    return str(Path(path).resolve())


def mount_point() -> Path:
    """Where the launcher mounts a step's root, in its private mount namespace: a path that
    root of the step's user namespace (no host uid it could use to pass a 0700 directory such
    as /root, where the image cache usually is) can reach. One empty directory serves every
    build: each mounts over it only in its own mount namespace."""
    for parent in ("/run", "/tmp"):
        p = Path(parent) / "sandfleet-build-root"
        try:
            p.mkdir(mode=0o755, exist_ok=True)
            st = p.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            p.chmod(0o755)
            return p
    raise ImageBuildError("no directory for build roots (/run/sandfleet-build-root or /tmp/sandfleet-build-root)")


def layer_next(layer: Path) -> Path:
    """Where a step's result lands; the caller swaps it in for ``layer``."""
    return layer.with_name(layer.name + ".next")


def build_command(out: Path, layer: Path, lowers: list[Path], argv: list[str], *, env: dict[str, str],
                  cwd: str, config: BwrapConfig, network: StepNetwork | None = None,
                  tmp_files: dict[str, Path] | None = None, slot: uids.Slot | None = None) -> list[str]:
    """argv that runs one image-build step as root of its own user namespace, over ``lowers``
    with ``layer`` on top; what the step leaves is written to :func:`layer_next` (``layer``
    itself is never written). ``lowers`` other than the host's ``/`` are host-root-owned
    debootstrap bases and are seen through idmapped mounts. ``cwd`` must exist in the image
    (the builder makes WORKDIRs in the layer). ``network``: the step runs in a network
    namespace of its own in any case; a :class:`~sandfleet.sandbox.network.StepNetwork`
    gives it the sandboxes' user-mode networking (start it with the process's pid).
    ``tmp_files``: host files bound read-only at ``/tmp/<name>`` (the step's private tmpfs,
    never part of the layer), e.g. the host's CA bundle (:mod:`sandfleet.images.mirrors`).
    ``slot``: the step's host uids (held by the caller until the step is reaped); the
    canonical range when None."""
    base = config.uid_base
    slot = slot or uids.Slot(index=0, base=base, canonical=base)
    root, scratch = mount_point(), out / "scratch"
    scratch.mkdir(exist_ok=True)
    upper = scratch / "upper"
    after = layer_next(layer)
    shutil.rmtree(after, ignore_errors=True)
    after.mkdir()
    a = [str(agent_binary()), "launch", "--tmpfs", str(scratch), "64g", "--userns-owner", str(slot.owner)]
    for name, value in uids.NS_LIMITS.items():
        a += ["--userns-max", name, str(value)]
    a += ["--userns", str(slot.base), str(SANDBOX_UIDS)]
    shown: list[str] = []
    for i, lower in enumerate(lowers):
        if lower == Path("/"):
            shown.append("/")  # the host image: not idmapped, its files are nobody's inside
            continue
        dst = out / f"lower{i}"
        dst.mkdir(exist_ok=True)
        a += ["--idmap", str(lower), str(dst)]
        shown.append(str(dst))
    # The step writes to an upper layer in tmpfs (overlayfs wants upper and work dir on one
    # filesystem, and "/" can't be a lower with the layer below it); the launcher copies the
    # task layer in first and the result out after (as host root, keeping the shifted owners
    # and overlay's whiteouts and opaque marks).
    a += ["--mkdir", str(upper), str(base), str(base), "0755", "--copy", str(layer), str(upper),
          "--copy-after", str(upper), str(after), "--mkdir", str(scratch / "work"), "0", "0", "0700"]
    seen = scratch
    if slot.shifted:  # the step's uids are its slot's; the layer stays in the canonical range
        seen = out / "scratch-shifted"
        a += ["--shift-ns", str(base), str(slot.base), str(SANDBOX_UIDS + 1), "--shift-rw", str(scratch), str(seen)]
    a += ["--overlay", ":".join(shown), str(seen / "upper"), str(seen / "work"), str(root),
          "--pdeathsig", str(os.getpid()), "--",
          bwrap_path(config), "--bind", str(root), "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
          "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent",
          "--new-session", "--clearenv", *(network.bwrap_args if network else [])]
    for name, host_file in (tmp_files or {}).items():
        a += ["--ro-bind", str(host_file), f"/tmp/{name}"]
    for k, v in env.items():
        a += ["--setenv", k, v]
    return [*a, "--chdir", cwd, "--", *argv]
