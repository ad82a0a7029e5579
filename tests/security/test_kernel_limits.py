"""Per-user kernel limits are per sandbox (issue 25, classes 8 and 9).

The kernel counts many resources by host uid: inotify instances and watches, fanotify
groups, namespaces of each kind (charged to the host uid that owns the sandbox's user
namespace P), POSIX message-queue bytes, and the key quota (the key owner's host uid). On
921be35, host root owned every P and every sandbox's users were the same host uids, so one
sandbox that filled a count took it from host root and from every other sandbox, and
sandboxes could reach each other's keys.

Each test fills one resource in sandbox A (from inside, as an attacker would, with the
seccomp filter off), keeps it full, and asserts that host root and a second live sandbox B
can still get that resource, and that A was held to a bound of its own. On 921be35 they fail
by their assertions."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox
from sandfleet.sandbox.spec import BwrapConfig, SandboxSpec

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"),
                                reason="the bwrap backend needs root and bubblewrap")

# Makes up to CAP of one kernel resource, prints {"made": n, "errno": e, ...} and, with
# "hold", keeps them until killed. Runs inside sandboxes and on the host alike.
FILL = r'''
import ctypes, errno, json, os, platform, sys, tempfile, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
kind, cap, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "hold"
held, extra = [], {}
if hold:  # an attacker first tries to raise its namespace's limits (root of S may write S's own)
    for f in os.listdir("/proc/sys/user"):
        try:
            with open("/proc/sys/user/" + f, "w") as out:
                out.write("2147483647")
        except OSError:
            pass
ARM = platform.machine() in ("aarch64", "arm64")
ADD_KEY, KEYCTL = (217, 219) if ARM else (248, 250)
NS = {"user": (0x10000000, "user"), "mnt": (0x20000, "mnt"), "pid": (0x20000000, "pid_for_children"),
      "ipc": (0x08000000, "ipc"), "net": (0x40000000, "net"), "uts": (0x04000000, "uts")}

def ns_one(flag, name):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        e = 0 if libc.unshare(flag) == 0 else ctypes.get_errno()
        if e == 0 and name.startswith("pid"):  # a pid namespace can be opened once its init was born
            g = os.fork()
            if g == 0:
                os._exit(0)
            os.waitpid(g, 0)
        os.write(w, b"%8d" % e)
        time.sleep(60)
        os._exit(0)
    os.close(w)
    e = int(os.read(r, 8))
    os.close(r)
    if e == 0:
        held.append(os.open("/proc/%d/ns/%s" % (pid, name), os.O_RDONLY))
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return e

def watches():
    d = tempfile.mkdtemp()
    files = []
    for j in range(600):
        p = os.path.join(d, str(j)).encode()
        open(p, "w").close()
        files.append(p)
    for i in range(120):
        fd = libc.inotify_init1(0)
        if fd < 0:
            yield ctypes.get_errno()
            return
        held.append(fd)
        for p in files:
            yield 0 if libc.inotify_add_watch(fd, p, 2) >= 0 else ctypes.get_errno()

def make_all():
    if kind in NS:
        while True:
            yield ns_one(*NS[kind])
    if kind == "watches":
        yield from watches()
        return
    n = 0
    while True:
        n += 1
        if kind == "inotify":
            r = libc.inotify_init1(0)
        elif kind == "fanotify":
            r = libc.fanotify_init(0x200, 0)  # FAN_CLASS_NOTIF | FAN_REPORT_FID: allowed unprivileged
        elif kind == "mqueue":
            name = b"/sf-%d-%d" % (os.getpid(), n)
            r = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
            if r >= 0 and not hold:
                libc.mq_unlink(name)
        elif kind == "keys":
            r = libc.syscall(ADD_KEY, b"user", b"sf-%d" % n, b"x" * 64, 64, ctypes.c_int(-2))  # process keyring
            if r >= 0:
                extra.setdefault("first_key", r)
        else:
            raise SystemExit("unknown kind " + kind)
        yield 0 if r >= 0 else ctypes.get_errno()
        if r >= 0 and kind != "keys":
            held.append(r)

made = e = 0
for e in make_all():
    if e or made >= cap:
        break
    made += 1
print(json.dumps({"made": made, "errno": errno.errorcode.get(e, e) if e else 0, **extra}), flush=True)
if hold:
    time.sleep(600)
'''

# (resource, user in the sandbox, bound A must hit, how many B and host root must still get)
RESOURCES = [
    ("inotify", "agent", 128, 5),
    ("watches", "root", 65536, 50),
    ("fanotify", "root", 32, 3),
    ("keys", "agent", 200, 5),
    ("mqueue", "root", 64, 1),
    ("user", "agent", 64, 3),
    ("mnt", "root", 256, 3),
    ("pid", "root", 64, 3),
    ("ipc", "root", 64, 3),
    ("net", "root", 64, 3),
    ("uts", "root", 64, 3),
]
LIMIT_ERRNOS = {"EMFILE", "ENOSPC", "EDQUOT", "EUSERS"}


# The bound must hold with the default seccomp filter off (it refuses keyctl, unshare,
# fanotify_init: a second line of defence, and one a task may opt out of).
NO_FILTER: dict[str, Any] = {"seccomp_allow": "unconfined"} if "seccomp_allow" in SandboxSpec.model_fields else {}


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Sandbox, Sandbox]]:
    a = await create_sandbox(backend="bwrap", ttl_s=300, **NO_FILTER)
    try:
        b = await create_sandbox(backend="bwrap", ttl_s=300, **NO_FILTER)
        try:
            yield a, b
        finally:
            await b.close()
    finally:
        await a.close()


async def _fill(sb: Sandbox, kind: str, cap: int, user: str, *, hold: bool) -> tuple[dict[str, Any], Any]:
    """Run FILL in ``sb``; with ``hold``, return once it reported (its task keeps running)."""
    first: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    def out(stream: str, data: bytes) -> None:
        if stream != "stdout":
            return
        seen.append(data.decode(errors="replace") if isinstance(data, bytes) else str(data))
        text = "".join(seen)
        if "\n" in text and not first.done():
            first.set_result(text.split("\n")[0])

    argv = ["python3", "-c", FILL, kind, str(cap), "hold" if hold else "once"]
    if not hold:
        r = await sb.exec(argv, user=user, timeout=120)
        assert r.exit_code == 0 and r.stdout, f"{kind} in the sandbox: {r}"
        return json.loads(r.stdout.splitlines()[0]), None
    task = asyncio.ensure_future(sb.exec(argv, user=user, timeout=600, on_output=out))
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # it ends with its sandbox
    done, _ = await asyncio.wait({task, first}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
    if first.done():
        return json.loads(first.result()), task
    res = task.result() if task in done else None
    task.cancel()
    raise AssertionError(f"{kind} fill in the sandbox reported nothing: {res}")


def _host(kind: str, n: int) -> dict[str, Any]:
    """The same, as host root (this test's own process tree)."""
    p = subprocess.run([sys.executable, "-c", FILL, kind, str(n), "once"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return dict(json.loads(p.stdout.splitlines()[0]))


@pytest.mark.parametrize(("kind", "user", "bound", "probe"), RESOURCES, ids=[r[0] for r in RESOURCES])
async def test_filling_a_kernel_limit_leaves_host_and_other_sandboxes_unaffected(
        pair: tuple[Sandbox, Sandbox], kind: str, user: str, bound: int, probe: int) -> None:
    a, b = pair
    cap = bound * 2 + 200  # far above the sandbox's bound, well below the host's own per-user limits
    if kind == "watches":
        cap = 120 * 600
    filled, task = await _fill(a, kind, cap, user, hold=True)
    try:
        assert filled["errno"] in LIMIT_ERRNOS, (
            f"sandbox A made {filled['made']} {kind} without reaching a bound of its own: {filled}")
        assert 0 < filled["made"] <= bound, f"sandbox A made {filled['made']} {kind}, more than {bound}: {filled}"
        host = _host(kind, probe)
        assert host == {**host, "made": probe, "errno": 0}, f"host root lost {kind} to sandbox A: {host}"
        other, _ = await _fill(b, kind, probe, user, hold=False)
        assert other["made"] == probe and other["errno"] == 0, f"sandbox B lost {kind} to sandbox A: {other}"
        if kind == "keys":  # B can't read A's key, or make it readable, by its serial
            serial = int(filled["first_key"])
            probe_key = ("import ctypes, platform; l = ctypes.CDLL(None, use_errno=True); "
                         "l.syscall.restype = ctypes.c_long; b = ctypes.create_string_buffer(256); "
                         "K = 219 if platform.machine() in ('aarch64', 'arm64') else 250; "
                         f"print(l.syscall(K, 5, {serial}, 0x3f3f3f3f), ctypes.get_errno(), "
                         f"l.syscall(K, 11, {serial}, b, 256), ctypes.get_errno(), b.raw[:8].hex())")
            for who in ("agent", "root"):
                r = await b.exec(["python3", "-c", probe_key], user=who)
                setperm, _, read, _, data = r.stdout.split(" ", 4)
                assert setperm == "-1" and read == "-1" and data.strip() != "78" * 8, \
                    f"sandbox B ({who}) reached sandbox A's key {serial}: {r.stdout} {r.stderr}"
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


def _ns_owner(pid: int) -> int:
    fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
    try:
        buf = bytearray(4)
        fcntl.ioctl(fd, 0xB704, buf)  # NS_GET_OWNER_UID
        return int(struct.unpack("I", buf)[0])
    finally:
        os.close(fd)


def _uid_map(pid: int) -> tuple[int, int, int]:
    inner, outer, count = Path(f"/proc/{pid}/uid_map").read_text().split()[:3]
    return int(inner), int(outer), int(count)


async def _bwrap_pid(sb: Sandbox) -> int:
    return int(sb.agent.proc.pid)  # type: ignore[attr-defined]


async def test_each_live_sandbox_has_host_uids_of_its_own(pair: tuple[Sandbox, Sandbox]) -> None:
    """Distinct ranges, P owned by an unprivileged uid outside both, slots reused after close."""
    a, b = pair
    maps = [_uid_map(await _bwrap_pid(sb)) for sb in pair]
    owners = [_ns_owner(await _bwrap_pid(sb)) for sb in pair]
    (_, base_a, n_a), (_, base_b, n_b) = maps
    assert base_a + n_a <= base_b or base_b + n_b <= base_a, f"sandboxes share host uids: {maps}"
    for (_, base, n), owner in zip(maps, owners, strict=True):
        assert owner != 0, "the sandbox's user namespace is owned by host root"
        assert not base <= owner < base + n, f"P's owner {owner} is a uid inside the sandbox {base}+{n}"
    assert len(set(owners)) == 2, f"the two sandboxes' namespaces have one owner: {owners}"
    # the agent's files are the slot's uids inside, and the canonical ones on disk
    for sb in pair:
        r = await sb.exec("echo hi > /work/mine && stat -c %u /work/mine && id -u")
        assert r.stdout.split() == ["1000", "1000"], r
        on_disk = (sb.upper / "work/mine").stat().st_uid  # type: ignore[attr-defined]
        assert on_disk == BwrapConfig().host_uid(1000), f"stored as {on_disk}, not in the canonical range"
    await b.close()
    c = await create_sandbox(backend="bwrap", ttl_s=60)
    try:
        (_, base_c, _) = _uid_map(await _bwrap_pid(c))
        assert base_c != base_a, "a new sandbox got the host uids of a live one"
    finally:
        await c.close()
