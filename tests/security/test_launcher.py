"""The launcher enters a sandbox's namespaces itself (``BwrapConfig.namespaces="launcher"``, the
default): the sandbox it builds is the one bubblewrap built, and a link in the root (a
snapshot's layer holds what a sandbox wrote) never leads one of its mounts out to the host."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandfleet.agent.build import agent_binary
from sandfleet.sandbox import mntns
from sandfleet.sandbox.bwrap import AGENT_CAPS, BwrapBackend
from sandfleet.sandbox.spec import BwrapConfig, make_spec

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"),
                                reason="needs root and bubblewrap")
BUSYBOX = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).exists()), None)
CAP_BITS = {"CAP_DAC_OVERRIDE": 1, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21,
            "CAP_SETFCAP": 31}
LOOK = ("hostname; ls -la /dev /dev/pts /dev/shm | awk '{print $1, $NF}'; "
        "cut -d' ' -f4- /proc/self/mountinfo | sed -E 's#sf-bwrap-[0-9a-f]+#SB#g; s#-musl-[0-9a-f]+#-AGENT#' | sort; "
        "grep -E '^(NoNewPrivs|CapPrm|CapEff|Uid)' /proc/1/status; readlink /proc/1/exe; ls -d /.sandfleet*")


async def _look(namespaces: str) -> tuple[str, str]:
    box = await BwrapBackend(BwrapConfig(namespaces=namespaces)).create(make_spec(backend="bwrap", ttl_s=120))
    try:
        r = await box.exec(["sh", "-c", LOOK])
        bnd = await box.exec(["sh", "-c", "grep CapBnd /proc/1/status"])
        assert r.exit_code == 0, r.stderr
        return r.stdout, bnd.stdout
    finally:
        await box.close()


async def test_the_launcher_builds_the_sandbox_bwrap_built() -> None:
    """The same mounts (each with its options; in mount order, the launcher's device nodes come
    first: cloned ahead of the template, mntns.py), /dev, hostname and pid 1 (the agent: no_new_privs,
    no capability once it has made S), one after the other; the launcher also narrows the
    agent's bounding set to the capabilities it keeps, where bwrap left it whole."""
    ours, bnd = await _look("launcher")
    theirs, _ = await _look("bwrap")
    assert ours == theirs
    assert "NoNewPrivs:\t1" in ours and "CapEff:\t0000000000000000" in ours
    assert int(bnd.split()[-1], 16) == sum(1 << CAP_BITS[c] for c in AGENT_CAPS)


def _launch(root: Path, *args: str, template: bool = False) -> subprocess.CompletedProcess[str]:
    fd = mntns.template_fd() if template else None
    if template:
        assert fd is not None, "no mount namespace template on this host"
    return subprocess.run([str(agent_binary()), "launch", *(["--mntns", str(fd)] if fd is not None else []),
                           "--sandbox", str(root), *args],
                          capture_output=True, text=True, timeout=60, pass_fds=(fd,) if fd is not None else ())


@pytest.mark.skipif(BUSYBOX is None, reason="needs a static busybox (apt-get install busybox-static)")
@pytest.mark.parametrize("template", [False, True], ids=["pivot", "template"])
def test_a_link_in_the_root_keeps_each_mount_inside_it(tmp_path: Path, template: bool) -> None:
    """A bind's mount point is made once the root is the sandbox's (after the pivot, or over the
    template's empty root): a link in its path resolves in the sandbox's root (to the sandbox's
    /var), and one that leads nowhere there fails the start, naming the path, rather than
    making a file in the host's directory of that name. /dev and /proc refuse a link outright
    (made before the pivot without the template)."""
    assert BUSYBOX is not None
    launch = functools.partial(_launch, template=template)
    host = tmp_path / "host-etc"  # what an absolute link in the root names, as the host sees it
    host.mkdir()
    src = tmp_path / "resolv.conf"
    src.write_text("nameserver 192.0.2.53\n")
    root = tmp_path / "root"
    for d in ("bin", "dev", "proc", "var"):
        (root / d).mkdir(parents=True)
    shutil.copy(BUSYBOX, root / "bin/busybox")
    sh = ["--", "/bin/busybox", "sh", "-c"]

    (root / "etc").symlink_to("/var")  # inside the root: the bind follows it there
    p = launch(root, "--sandbox-ro-bind", str(src), "/etc/resolv.conf", *sh,
                "/bin/busybox cat /var/resolv.conf; /bin/busybox hostname")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["nameserver 192.0.2.53", "sandbox"]
    assert (root / "var/resolv.conf").read_text() == ""  # the mount point, made in the root

    (root / "etc").unlink()
    (root / "etc").symlink_to(host)  # outside the root, as the host sees it: nowhere in the root
    p = launch(root, "--sandbox-ro-bind", str(src), "/etc/resolv.conf", *sh, "/bin/busybox true")
    assert p.returncode != 0
    assert "sandbox /etc/resolv.conf: No such file or directory" in p.stderr
    assert list(host.iterdir()) == []  # nothing made on the host

    for name in ("dev", "proc"):
        (root / name).rmdir()
        (root / name).symlink_to(host)
        p = launch(root, *sh, "/bin/busybox true")
        assert p.returncode != 0 and f"sandbox /{name}: " in p.stderr, p.stderr
        assert list(host.iterdir()) == []
        (root / name).unlink()
        (root / name).mkdir()


def test_the_launcher_names_a_bad_sandbox_option(tmp_path: Path) -> None:
    for args, message in ((["--sandbox", "relative"], "--sandbox needs an absolute path"),
                          (["--keep-cap", "CAP_NET_RAW"], "unknown --keep-cap"),
                          (["--sandbox-bind", "/tmp", "relative"], "bad --sandbox-bind"),
                          (["--mntns", "fd3"], "bad --mntns"),
                          (["--mntns", "987"], "--mntns 987: Bad file descriptor")):
        p = subprocess.run([str(agent_binary()), "launch", *args, "--", "/bin/true"], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 125 and message in p.stderr, (args, p.stderr)


def test_the_template_holds_nothing_of_the_hosts() -> None:
    """What every sandbox's mount namespace is copied from (mntns.py): an empty read-only root
    but for a procfs of a pid namespace nobody is left in (the one the kernel wants visible
    before a user namespace mounts its own), and none of the host's mounts."""
    fd = mntns.template_fd()
    assert fd is not None
    code = """
import ctypes, errno, os, sys
assert ctypes.CDLL(None, use_errno=True).setns(int(sys.argv[1]), 0x20000) == 0, ctypes.get_errno()
print(sorted(os.listdir("/")), [p for p in os.listdir("/proc") if p.isdigit()])
print(open("/proc/self/mountinfo").read() if os.path.exists("/proc/self/mountinfo") else "no self")
try:
    os.mkdir("/x")
except OSError as e:
    print(errno.errorcode[e.errno])
"""
    p = subprocess.run([sys.executable, "-c", code, str(fd)], capture_output=True, text=True, timeout=30,
                       pass_fds=(fd,))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:3] == ["['proc'] []", "no self", "EROFS"], p.stdout


ESCAPE = r"""
import os
os.makedirs("/tmp/jail", exist_ok=True)
top = os.open("/", os.O_RDONLY)
os.chroot("/tmp/jail")
os.fchdir(top)
for _ in range(40):
    os.chdir("..")
os.chroot(".")
print(sorted(os.listdir("/")))
"""


async def test_a_command_that_leaves_its_chroot_is_still_in_the_sandboxs_root() -> None:
    """Root of S may chroot (the filter allows it, as Docker's does) and climb out of that chroot
    by the old way: its folder outside the new root, ``..`` up. What it reaches is the sandbox's
    root again (the kernel follows the mounts stacked where a ``..`` lands), never the
    template's empty root under it, nor the kernel's rootfs under that."""
    box = await BwrapBackend().create(make_spec(backend="bwrap", ttl_s=120))
    try:
        r = await box.exec(["python3", "-c", ESCAPE], user="root")
        assert r.exit_code == 0, r.stderr
        ls = await box.exec(["python3", "-c", "import os; print(sorted(os.listdir('/')))"], user="root")
        assert r.stdout == ls.stdout and "'.sandfleet'" in r.stdout, (r.stdout, ls.stdout)
    finally:
        await box.close()
