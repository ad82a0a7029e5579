"""Image builds (findings 14, 15, 16, 40): RUN steps hold no host privilege, the builder never
writes through a symlink out of its layer, COPY reads nothing outside the build context, and
dead builds' temporary directories are reaped.

Every RUN step here exits 0 and records what it could do in a file of the layer, so a build
that lets the attack through fails the test by an assertion, not by an error.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from sandfleet.errors import ImageBuildError
from sandfleet.images.bases import resolve_base
from sandfleet.images.debootstrap import _packages, base_digest
from sandfleet.imagestore import Image, arch, images_dir, save_image
from sandfleet.sandbox.spec import BwrapConfig
from sandfleet.tasks import load_task
from sandfleet.tasks.images import build_task_image
from support import dockerfile_task as make_task

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"),
                                reason="image builds need root and bubblewrap")
# (getattr: on 490e57a, which had no uid range, these tests fail by their assertions)
BASE: int = getattr(BwrapConfig(), "uid_base", 1_800_000_000)
AGENT = BASE + 1000


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SANDFLEET_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def snapshot(d: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Every entry below d (and d itself): owner, mode and content."""
    out = {}
    for p in [d, *sorted(d.rglob("*"))]:
        st = p.lstat()
        out[str(p.relative_to(d))] = (st.st_uid, st.st_gid, st.st_mode,
                                      p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
    return out


MODULE = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
          "fd = os.open('/app/not-a-module', os.O_RDONLY); "
          "r = libc.syscall(313, fd, b'', 0); "  # finit_module
          "print('loaded' if r == 0 else os.strerror(ctypes.get_errno()))")
SYSCTL = ('v="$(cat /proc/sys/kernel/core_pattern)"; w() { printf "%s\\n" "$v" > /proc/sys/kernel/core_pattern; }; '
          "if (w || { mount -o remount,bind,rw /proc/sys && w; } || { mount -o remount,rw /proc/sys && w; }) "
          "2>/dev/null; then echo written; else echo refused; fi > /app/sysctl.txt")


def test_run_step_has_no_host_privilege(tmp_path: Path, with_python_base_cache: Path) -> None:
    """Finding 14: mknod, a sysctl write (the current value, written back: never a change)
    and a module load all fail, and the step's capabilities belong to a user namespace of
    its own, mapped onto the sandbox range."""
    task = make_task(tmp_path, "\n".join([
        "FROM python:3.11-slim-bookworm",
        "WORKDIR /app",
        "RUN if mknod /app/null c 1 3 2>/dev/null; then echo made; else echo refused; fi > /app/mknod.txt",
        f"RUN {SYSCTL}",
        f'RUN echo junk > /app/not-a-module && python3 -c "{MODULE}" > /app/module.txt',
        "RUN cat /proc/self/status > /app/status.txt && cat /proc/self/uid_map > /app/uid_map.txt",
        "RUN id -u > /app/id.txt && touch /by-root",
    ]) + "\n")
    img = build_task_image(load_task(task))
    app = img.lowers[0] / "app"
    assert (app / "mknod.txt").read_text() == "refused\n"
    assert not (app / "null").exists()
    assert (app / "sysctl.txt").read_text() == "refused\n"
    # EPERM: no CAP_SYS_MODULE; ENOSYS: a kernel without modules (then the CapEff check
    # below is what shows the capability is gone). Anything else means the check passed.
    assert (app / "module.txt").read_text() in ("Operation not permitted\n", "Function not implemented\n")
    uid_map = (app / "uid_map.txt").read_text().split()
    cap_eff = next(int(line.split()[1], 16) for line in (app / "status.txt").read_text().splitlines()
                   if line.startswith("CapEff:"))
    # capabilities count in the initial namespace only when the map is the identity
    initial_ns = uid_map[:3] == ["0", "0", "4294967295"]
    assert not initial_ns or cap_eff == 0, f"CapEff {cap_eff:x} in the initial user namespace"
    # the step's own uid slot: the canonical range or another slot of 65,538 uids above it
    assert uid_map[0] == "0" and uid_map[2] == "65536" and int(uid_map[1]) >= BASE
    assert (int(uid_map[1]) - BASE) % (65536 + 2) == 0, uid_map
    # root inside the step, and what it wrote is owned by the sandbox's root on the host
    assert (app / "id.txt").read_text() == "0\n"
    assert (img.lowers[0] / "by-root").stat().st_uid == BASE


def test_builder_never_writes_through_a_symlink_to_the_host(tmp_path: Path, with_python_base_cache: Path) -> None:
    """Finding 15: symlinks an earlier RUN step left (absolute, relative with too many ``..``,
    to a directory and to a file) resolve inside the image for COPY, ADD, WORKDIR and the
    final chown; the host's directory and file stay as they were."""
    host = tmp_path / "host-dir"
    host.mkdir(mode=0o700)
    (host / "secret.txt").write_text("host secret\n")
    (host / "secret.txt").chmod(0o600)
    before = snapshot(host)
    up = "../" * 20
    archive = tmp_path / "payload.tar"
    (tmp_path / "from-tar.txt").write_text("from tar\n")
    with tarfile.open(archive, "w") as tar:
        tar.add(tmp_path / "from-tar.txt", arcname="from-tar.txt")
    task = make_task(tmp_path, "\n".join([
        "FROM python:3.11-slim-bookworm",
        "WORKDIR /app",
        f"RUN ln -s {host} /app/link && ln -s {host}/secret.txt /app/filelink && ln -s {up}{host} /app/rel",
        "COPY evil.txt /app/link/",
        "COPY evil.txt /app/filelink",
        "COPY evil.txt /app/rel/evil-rel.txt",
        "ADD payload.tar /app/link/",
        "WORKDIR /app/link/made-by-workdir",
        "WORKDIR /app/link",
    ]) + "\n", {"evil.txt": "evil\n"})
    shutil.copy(archive, task / "environment" / "payload.tar")
    img = build_task_image(load_task(task))
    assert snapshot(host) == before
    # the writes landed in the image, at the link's target inside it
    inside = img.lowers[0] / str(host).lstrip("/")
    assert (inside / "evil.txt").read_text() == "evil\n"
    assert (inside / "secret.txt").read_text() == "evil\n"
    assert (inside / "evil-rel.txt").read_text() == "evil\n"
    assert (inside / "from-tar.txt").read_text() == "from tar\n"
    assert (inside / "made-by-workdir").is_dir()
    assert inside.stat().st_uid == AGENT  # the final WORKDIR, given to the agent in the image
    assert (img.lowers[0] / "app" / "link").is_symlink()


def test_copy_refuses_a_context_symlink_that_leads_out(tmp_path: Path, with_python_base_cache: Path) -> None:
    """Finding 16: a context symlink to a host file outside the context is refused (Docker
    refuses it too), naming the Dockerfile line; a link inside a copied directory is copied
    as a link, not followed."""
    secret = tmp_path / "outside.txt"
    secret.write_text("TOPSECRET\n")
    task = make_task(tmp_path, "FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY data /app/data\n")
    (task / "environment" / "data").symlink_to(secret)
    with pytest.raises(ImageBuildError, match=r"Dockerfile:3: COPY source 'data' resolves outside the build context"):
        build_task_image(load_task(task))
    (task / "environment" / "data").unlink()
    (task / "environment" / "data").mkdir()
    (task / "environment" / "data" / "link").symlink_to(secret)
    img = build_task_image(load_task(task))
    copied = img.lowers[0] / "app" / "data" / "link"
    assert copied.is_symlink() and copied.readlink() == secret
    (task / "environment" / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\nCOPY d/ /app/\n")
    (task / "environment" / "d").symlink_to(tmp_path)
    with pytest.raises(ImageBuildError, match=r"Dockerfile:2: COPY source 'd/' resolves outside"):
        build_task_image(load_task(task))


def test_run_can_not_change_the_host_base(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the host's own / (what stands in for a base where debootstrap can't run: here, no
    debootstrap on PATH) a step can't write the host's files (they are nobody's inside);
    installing into system directories fails with an error that names the line and says
    what to do instead."""
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")  # debootstrap is in /usr/sbin
    task = make_task(tmp_path, "FROM python:3.11-slim-bookworm\nWORKDIR /app\nRUN touch /usr/local/made-by-run\n")
    with pytest.raises(ImageBuildError, match=r"Dockerfile:3: RUN exited with 1 .*Debian base.*sandfleet image build"):
        build_task_image(load_task(task))
    assert not Path("/usr/local/made-by-run").exists()


def _mini_debian(cache: Path) -> Image:
    """A tiny root filesystem owned by host root, registered as a bookworm debootstrap base
    (no network here for a real one): merged /usr, a shell and coreutils with their libraries."""
    rootfs = images_dir() / "mini-bookworm" / "rootfs"
    for d in ("usr/bin", "usr/lib", "usr/lib64", "usr/local/lib", "etc", "tmp", "dev", "proc", "var/lib/dpkg", "root"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        (rootfs / link).symlink_to(f"usr/{'bin' if link == 'sbin' else link}")
    tools = ["sh", "mkdir", "touch", "chown", "cat", "id", "ls", "stat", "rm"]
    for tool in tools:
        path = Path(shutil.which(tool) or f"/usr/bin/{tool}").resolve()
        shutil.copy2(path, rootfs / "usr/bin" / tool)
        for word in subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout.split():
            if word.startswith("/"):
                real = Path(word).resolve()
                dst = rootfs / str(real).lstrip("/")
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(real, dst)
                inside = word if word.startswith("/usr/") else "/usr" + word  # merged /usr: /lib is usr/lib
                alias = rootfs / inside.lstrip("/")
                if not os.path.lexists(alias):
                    alias.parent.mkdir(parents=True, exist_ok=True)
                    alias.symlink_to(real)
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rootfs / "var/lib/misc").mkdir()
    (rootfs / "var/lib/misc/data").write_text("")
    (rootfs / "etc/motd").write_text("base\n")
    # registered under the hash a debian:bookworm-slim base is looked up by
    ref = resolve_base("debian:bookworm-slim")
    digest = base_digest(ref.suite, _packages(ref.packages, ref.flavour), arch(), flavour=ref.flavour)
    image = Image(name="debian-bookworm-mini", lowers=[rootfs], arch=arch(), page_size=os.sysconf("SC_PAGE_SIZE"),
                  hash=digest, base="debootstrap",
                  meta={"kind": "debian-base", "suite": "bookworm", "packages": list(ref.packages)})
    save_image(image)
    return image


def test_run_writes_into_a_debootstrap_base_own_dirs(tmp_path: Path, cache: Path) -> None:
    """Over a debootstrap base (host-root-owned on disk, idmapped in the build) a step is the
    image's root: it writes under /usr/local and /var/lib like apt-get or pip would and chowns
    to image users; the result is stored shifted, and the base on disk is untouched."""
    base = _mini_debian(cache)
    before = snapshot(base.root / "usr/local")
    task = make_task(tmp_path, "\n".join([
        "FROM debian:bookworm-slim",
        "COPY tool.txt /usr/local/share/tool/",
        "RUN mkdir -p /usr/local/lib/python3/dist-packages/pkg && touch /usr/local/lib/python3/dist-packages/pkg/x.py"
        " && touch /var/lib/dpkg/lock && mkdir /usr/local/lib/mine && chown 1000:1000 /usr/local/lib/mine"
        " && stat -c %u /usr/local > /usr/local/owner.txt",
        # deleted base entries stay deleted, also when the builder writes there again
        "RUN rm -r /var/lib/misc /etc/motd",
        "COPY tool.txt /var/lib/misc/new/",
        "RUN ls /var/lib/misc > /listing.txt && ls /etc > /etc-listing.txt",
        "WORKDIR /app",
    ]) + "\n", {"tool.txt": "t\n"})
    img = build_task_image(load_task(task))
    assert img.base == base.name
    assert (img.lowers[0] / "listing.txt").read_text() == "new\n"
    assert "motd" not in (img.lowers[0] / "etc-listing.txt").read_text().split()
    layer = img.lowers[0]
    assert (layer / "usr/local/lib/python3/dist-packages/pkg/x.py").stat().st_uid == BASE
    assert (layer / "var/lib/dpkg/lock").stat().st_uid == BASE
    assert (layer / "usr/local/lib/mine").stat().st_uid == BASE + 1000
    assert (layer / "usr/local/owner.txt").read_text() == "0\n"  # the base's /usr/local is root's inside
    # the builder's own copy of the base's directories shows the same owner and mode
    st = (layer / "usr/local/share").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (BASE, 0o755)
    assert (layer / "usr/local/share/tool/tool.txt").stat().st_uid == BASE
    assert snapshot(base.root / "usr/local") == before


def test_dead_builds_temp_dirs_are_reaped(tmp_path: Path, with_python_base_cache: Path) -> None:
    """Finding 40: temporary build directories of a killed build are removed at the next
    build; a live process's are kept."""
    dead = subprocess.Popen(["sleep", "30"])
    started = Path(f"/proc/{dead.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    dead.kill()
    dead.wait()
    d = images_dir()
    leftovers = [d / f".build-{dead.pid}-{started}-1", d / f".debootstrap-{dead.pid}-{started}-2",
                 d / f".debootstrap-{dead.pid}"]
    me = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    live = d / f".build-{os.getpid()}-{me}-3"
    for p in [*leftovers, live]:
        (p / "layer").mkdir(parents=True)
    task = make_task(tmp_path, "FROM python:3.11-slim-bookworm\nWORKDIR /app\nRUN true\n")
    build_task_image(load_task(task))
    assert [p for p in leftovers if p.exists()] == []
    assert live.exists()
    shutil.rmtree(live)  # (this process's own: the shared cache's next user would keep it)
