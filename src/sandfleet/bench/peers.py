"""``sandfleet bench peers``: sandfleet's backends and what users would run instead, measured
side by side in one run, alternating, on the same root filesystem and the same workload.

Systems (:data:`SYSTEMS`): ``raw-bwrap`` (the floor: namespaces, nothing else),
``sandfleet-bwrap``, ``sandfleet-gvisor``, ``sandfleet-microvm``, ``runsc-do``, ``runsc-run``
(an OCI bundle), ``crun`` (the same bundle: the OCI runtime floor) and ``podman``
(``run --rootfs``: a container engine). The root filesystem is one sandfleet base image's root
(``--image``), read-only everywhere. Figures per system:

- ``create_exec_close_p50_ms``/``_p99_ms``: a sandbox made, ``true`` run in it, the sandbox
  gone, one round per system in turn (the order rotates each round);
- ``exec_rtt_p50_ms``/``_p99_ms``: ``true`` in a live sandbox (the runtimes' own ``exec``);
  None for the one-shot systems (raw-bwrap, runsc-do), which have no live sandbox;
- ``cpu16_slowdown``: the wall time of 16 concurrent CPU-bound commands (a shell loop, no
  syscalls) over that of the same 16 as bare host processes, run right before;
- ``idle_pss_mib``: PSS of the host processes that make one idle live sandbox;
- ``ratio_to_raw_bwrap``: create→exec→close p50 over raw bwrap's.

A system that can't run here is listed with ``missing`` and the command that installs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import resource
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sandfleet.bench.procfs import children_map, process_tree, pss_kib
from sandfleet.stats import percentile

SYSTEMS = ("raw-bwrap", "sandfleet-bwrap", "sandfleet-gvisor", "sandfleet-microvm", "runsc-do", "runsc-run",
           "crun", "podman")
INSTALL = {"raw-bwrap": "apt-get install bubblewrap", "sandfleet-bwrap": "apt-get install bubblewrap",
           "sandfleet-gvisor": "apt-get install runsc", "runsc-do": "apt-get install runsc",
           "runsc-run": "apt-get install runsc", "crun": "apt-get install crun", "podman": "apt-get install podman",
           "sandfleet-microvm": "apt-get install qemu-system-x86 linux-image-cloud-amd64 busybox-static"}
CPU_LOOP = "i=0; while [ $i -lt {n} ]; do i=$((i+1)); done"
DEFAULT_IMAGE = "debian-bookworm-amd64"
Progress = Callable[[str], None]


def default_image() -> str:
    """The Debian base when this host has it, else the host's own root ("host": crun and podman
    can't pivot_root into "/", so they fail there, and say so)."""
    from sandfleet.errors import SandfleetError
    from sandfleet.imagestore import resolve_image

    try:
        resolve_image(DEFAULT_IMAGE)
    except SandfleetError:
        return "host"
    return DEFAULT_IMAGE


async def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 120.0, detach: bool = False,
               session: bool = False) -> str:
    """Run ``argv``; its stdout. ``detach``: it leaves a process holding its stdio (a detached
    container), so stdout and stderr go to files, not pipes nobody would close. ``session``: in a
    session of its own (what bwrap --new-session, runsc and the runtimes give their sandboxes)."""
    if detach:
        with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=out_f,
                                                        stderr=err_f)
            async with asyncio.timeout(timeout):
                rc = await proc.wait()
            out_f.seek(0)
            err_f.seek(0)
            out, err = out_f.read(), err_f.read()
        if check and rc != 0:
            raise RuntimeError(f"{' '.join(argv[:4])}... exited {rc}: {err.decode(errors='replace')[-400:]}")
        return out.decode(errors="replace")
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, start_new_session=session,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"{argv[0]} {' '.join(argv[1:4])}... did not finish within {timeout:g} s") from None
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}... exited {proc.returncode}: {err.decode(errors='replace')[-400:]}")
    return out.decode(errors="replace")


def _tree_pss_mib(pids: Sequence[int]) -> float:
    kids = children_map()
    seen = {q for p in pids for q in process_tree(p, kids)}
    return sum(pss_kib(q) for q in seen) / 1024


class Live:
    """One live sandbox of a system: exec ``true``, run a command, its host processes, close."""

    async def exec(self, argv: Sequence[str]) -> None:
        raise NotImplementedError

    def pids(self) -> list[int]:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class System:
    name = ""

    def __init__(self, root: Path, image: str, state: Path):
        self.root, self.image, self.state = root, image, state

    def missing(self) -> str | None:
        """Why the system can't run here (None: it can)."""
        return None

    async def once(self, argv: Sequence[str]) -> None:
        """Create a sandbox, run ``argv`` in it, remove it."""
        raise NotImplementedError

    async def live(self) -> Live | None:
        return None


class _SandfleetLive(Live):
    def __init__(self, sb: Any):
        self.sb = sb

    async def exec(self, argv: Sequence[str]) -> None:
        r = await self.sb.exec(list(argv), cwd="/", timeout=300)
        if r.exit_code != 0:
            raise RuntimeError(f"{argv[0]} exited {r.exit_code}: {r.output[-300:]}")

    def pids(self) -> list[int]:
        cg = getattr(self.sb, "cgroup", None)
        if cg is not None and cg.pids():
            return sorted(cg.pids())
        proc = getattr(getattr(self.sb, "agent", None), "proc", None) or getattr(getattr(self.sb, "vm", None),
                                                                                   "proc", None)
        return [proc.pid] if proc is not None else []

    async def close(self) -> None:
        await self.sb.close()


class Sandfleet(System):
    def __init__(self, backend: str, *a: Any):
        super().__init__(*a)
        self.backend = backend
        self.name = f"sandfleet-{backend}"

    def missing(self) -> str | None:
        from sandfleet.errors import SandfleetError
        from sandfleet.sandbox import get_backend

        try:
            get_backend(self.backend)
        except (SandfleetError, OSError) as e:
            return str(e)
        return None

    async def _create(self, **kw: Any) -> Any:
        from sandfleet.sandbox import create_sandbox

        return await create_sandbox(backend=self.backend, image=self.image, ttl_s=600, **kw)

    async def once(self, argv: Sequence[str]) -> None:
        sb = await self._create()
        try:
            await _SandfleetLive(sb).exec(argv)
        finally:
            await sb.close()

    async def live(self) -> Live:
        return _SandfleetLive(await self._create(cpus=None))


class RawBwrap(System):
    name = "raw-bwrap"

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["bwrap", "--ro-bind", str(self.root), "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                "--unshare-all", "--die-with-parent", "--new-session", *argv]

    def missing(self) -> str | None:
        return None if shutil.which("bwrap") else "bwrap not found"

    async def once(self, argv: Sequence[str]) -> None:
        await _run(self.argv(argv))

    async def live(self) -> Live:
        return await _ProcessLive.start(self.argv(["sleep", "infinity"]))


class _ProcessLive(Live):
    """A one-shot system held open by a sleeping command: only its memory is measured."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc

    @classmethod
    async def start(cls, argv: list[str]) -> _ProcessLive:
        dev = asyncio.subprocess.DEVNULL
        proc = await asyncio.create_subprocess_exec(*argv, stdin=dev, stdout=dev, stderr=dev)
        return cls(proc)

    async def exec(self, argv: Sequence[str]) -> None:
        raise NotImplementedError("a one-shot system has no exec")

    def pids(self) -> list[int]:
        return [self.proc.pid]

    async def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()


def _platform() -> str:
    from sandfleet.sandbox.gvisor import choose_platform
    from sandfleet.sandbox.spec import GvisorConfig

    return choose_platform(GvisorConfig())[0]


class RunscDo(System):
    name = "runsc-do"

    def missing(self) -> str | None:
        return None if shutil.which("runsc") else "runsc not found"

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["runsc", "--root", str(self.state / "runsc-do"), "--network=none", f"--platform={_platform()}",
                "do", "-root", str(self.root), "-cwd", "/", *argv]

    async def once(self, argv: Sequence[str]) -> None:
        await _run(self.argv(argv))

    async def live(self) -> Live:
        return await _ProcessLive.start(self.argv(["sleep", "infinity"]))


def bundle(root: Path, where: Path, args: Sequence[str]) -> Path:
    """An OCI bundle over ``root`` (read-only) running ``args``: the one runsc run and crun share."""
    where.mkdir(parents=True, exist_ok=True)
    cfg = {"ociVersion": "1.0.0",
           "process": {"user": {"uid": 0, "gid": 0}, "args": list(args), "cwd": "/", "terminal": False,
                       "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                       "noNewPrivileges": True},
           "root": {"path": str(root), "readonly": True}, "hostname": "peer",
           "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                      {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
                      {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]}],
           "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]}}
    (where / "config.json").write_text(json.dumps(cfg))
    return where


class _OciLive(Live):
    def __init__(self, runtime: list[str], cid: str, pids: list[int], remove: list[str]):
        self.runtime, self.cid, self._pids, self.remove = runtime, cid, pids, remove

    async def exec(self, argv: Sequence[str]) -> None:
        await _run([*self.runtime, "exec", self.cid, *argv])

    def pids(self) -> list[int]:
        return self._pids

    async def close(self) -> None:
        await _run([*self.runtime, *self.remove, self.cid], check=False)


class _OciRuntime(System):
    """An OCI runtime run on a bundle over the same root: one-shot ``run``, or ``run --detach``."""

    def runtime(self) -> list[str]:
        raise NotImplementedError

    async def once(self, argv: Sequence[str]) -> None:
        cid = f"peer-{uuid.uuid4().hex[:10]}"
        b = bundle(self.root, self.state / "b" / cid, argv)
        try:
            await _run([*self.runtime(), "run", "--bundle", str(b), cid])
        finally:
            shutil.rmtree(b, ignore_errors=True)

    async def _run_detached(self) -> str:
        cid = f"peer-{uuid.uuid4().hex[:10]}"
        b = bundle(self.root, self.state / "b" / cid, ["sleep", "infinity"])
        await _run([*self.runtime(), "run", "--detach", "--bundle", str(b), cid], detach=True)
        return cid


class RunscRun(_OciRuntime):
    name = "runsc-run"

    def missing(self) -> str | None:
        return None if shutil.which("runsc") else "runsc not found"

    def runtime(self) -> list[str]:
        return ["runsc", "--root", str(self.state / "runsc"), "--network=none", f"--platform={_platform()}",
                "--ignore-cgroups"]

    async def live(self) -> Live:
        cid = await self._run_detached()
        # the sandbox and gofer processes name the container in their command lines
        mine = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, cid)]
        return _OciLive(self.runtime(), cid, mine, ["delete", "-force"])


def _cmdline_has(p: Path, text: str) -> bool:
    try:
        return text.encode() in (p / "cmdline").read_bytes()
    except OSError:
        return False


def _without_hybrid_v2(name: str) -> list[str]:
    """A prefix that runs a crun-based command where crun 1.8.1 starts: on a cgroup v1/v2
    hybrid with a controller enabled in the v2 tree, under ``unshare -m`` with that tree
    unmounted (its processes stay in the host's v1 cgroups); elsewhere nothing."""
    unified = Path("/sys/fs/cgroup/unified/cgroup.controllers")
    if unified.exists() and unified.read_text().strip():
        return ["unshare", "-m", "sh", "-c", 'umount -l /sys/fs/cgroup/unified && exec "$@"', name]
    return []


class Crun(_OciRuntime):
    """crun on the same bundle. On a cgroup v1/v2 hybrid with a controller enabled in the v2
    tree (this host: hugetlb) crun 1.8.1 refuses to start ("cgroups in hybrid mode not
    supported"): it then runs under ``unshare -m`` with that tree unmounted, and its cgroup
    manager disabled (no limits: as runsc --ignore-cgroups)."""

    name = "crun"

    def missing(self) -> str | None:
        return None if shutil.which("crun") else "crun not found"

    def runtime(self) -> list[str]:
        return [*_without_hybrid_v2("crun"), "crun", "--cgroup-manager=disabled", "--root", str(self.state / "crun")]

    async def live(self) -> Live:
        cid = await self._run_detached()
        state = json.loads(await _run([*self.runtime(), "state", cid]))
        return _OciLive(self.runtime(), cid, [int(state["pid"])], ["delete", "-f"])


class Podman(System):
    """``podman run --rootfs`` with its defaults (crun, conmon, cgroups on), two things aside:
    the open-file and process limits are asked for explicitly (podman 4.3 otherwise asks crun for
    RLIMIT_NOFILE 1048576, which a root without CAP_SYS_RESOURCE above its hard limit can't set:
    "setrlimit RLIMIT_NOFILE: Operation not permitted"), and on a cgroup v1/v2 hybrid it runs as
    crun does (:func:`_without_hybrid_v2`). ``--rootfs`` is a flag: the root is the first
    argument after the options, the command after it."""

    name = "podman"

    def missing(self) -> str | None:
        return None if shutil.which("podman") else "podman not found"

    def podman(self) -> list[str]:
        return [*_without_hybrid_v2("podman"), "podman"]

    def argv(self, *args: str) -> list[str]:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nofile = 1048576 if hard == resource.RLIM_INFINITY else min(hard, 1048576)
        return [*self.podman(), "run", *args, "--read-only", "--network=none", "--ulimit", f"nofile={nofile}:{nofile}",
                "--ulimit", "nproc=32768:32768", "--rootfs", str(self.root)]

    async def once(self, argv: Sequence[str]) -> None:
        await _run([*self.argv("--rm"), *argv])

    async def live(self) -> Live:
        cid = (await _run([*self.argv("-d", "--rm"), "sleep", "infinity"], detach=True)).strip()
        pids = (await _run([*self.podman(), "inspect", "-f", "{{.State.Pid}} {{.State.ConmonPid}}", cid])).split()
        return _OciLive(self.podman(), cid, [int(p) for p in pids if p.isdigit() and int(p) > 0],
                        ["rm", "-f", "-t", "0"])


def systems(root: Path, image: str, state: Path, only: Sequence[str] = ()) -> list[System]:
    made: list[System] = [RawBwrap(root, image, state), Sandfleet("bwrap", root, image, state),
                          Sandfleet("gvisor", root, image, state), Sandfleet("microvm", root, image, state),
                          RunscDo(root, image, state), RunscRun(root, image, state), Crun(root, image, state),
                          Podman(root, image, state)]
    return [s for s in made if not only or s.name in only]


def _ms(xs: list[float], q: float) -> float | None:
    return round(percentile(xs, q) * 1e3, 2) if xs else None


async def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    await fn()
    return time.perf_counter() - t


async def _cpu16(run_one: Callable[[], Any], n: int = 16) -> float:
    t = time.perf_counter()
    await asyncio.gather(*(run_one() for _ in range(n)))
    return time.perf_counter() - t


async def run_peers(*, image: str | None = None, rounds: int = 15, rtt: int = 30, loop: int = 100_000,
                    only: Sequence[str] = (), progress: Progress | None = None) -> dict[str, Any]:
    """Measure every system (:data:`SYSTEMS`, or ``only``) alternating; the results dict."""
    from sandfleet.imagestore import resolve_image
    from sandfleet.provenance import provenance

    say = progress or (lambda m: None)
    image = image or default_image()
    img = resolve_image(image)
    if not img.is_host and len(img.lowers) > 1:
        raise ValueError(f"bench peers needs a base image or the host image (one root directory), not {image!r}")
    root = img.root
    state = Path(tempfile.mkdtemp(prefix="sandfleet-peers-"))
    t_start = time.monotonic()
    rows: dict[str, dict[str, Any]] = {}
    ready: list[System] = []
    try:
        for s in systems(root, image, state, only):
            why = s.missing()
            if why:
                rows[s.name] = {"name": s.name, "missing": why, "install": INSTALL[s.name]}
                say(f"{s.name}: missing ({why}); install: {INSTALL[s.name]}")
                continue
            try:  # a warm-up (images, caches, a microVM's template), not timed
                await s.once(["true"])
            except Exception as e:
                rows[s.name] = {"name": s.name, "error": f"{type(e).__name__}: {e}"[:500]}
                say(f"{s.name}: failed: {rows[s.name]['error']}")
                continue
            rows[s.name] = {"name": s.name}
            ready.append(s)
        times: dict[str, list[float]] = {s.name: [] for s in ready}
        for r in range(rounds):
            order = ready[r % len(ready):] + ready[:r % len(ready)] if ready else []
            for s in order:
                times[s.name].append(await _timed(functools.partial(s.once, ["true"])))
            say(f"create->exec->close round {r + 1}/{rounds}")
        lives: dict[str, Live] = {}
        rtts: dict[str, list[float]] = {}
        for s in ready:
            try:
                live = await s.live()
            except Exception as e:
                rows[s.name]["live_error"] = f"{type(e).__name__}: {e}"[:500]
                continue
            if live is not None:
                lives[s.name] = live
        try:
            await asyncio.sleep(1.0)  # settle, then the idle memory of each
            for name, live in lives.items():
                rows[name]["idle_pss_mib"] = round(_tree_pss_mib(live.pids()), 1)
            rtts = {n: [] for n, lv in lives.items() if not isinstance(lv, _ProcessLive)}
            for _ in range(rtt):
                for name in rtts:
                    rtts[name].append(await _timed(functools.partial(lives[name].exec, ["true"])))
            say("exec round trips done")
            cpu = ["sh", "-c", CPU_LOOP.format(n=loop)]
            # bare: the same shell binary and libraries (chroot into the root), no namespaces,
            # each in a session of its own as every sandbox is (with sched_autogroup, a session
            # is a scheduling group: 16 bare processes sharing one session took 2.4-3.6x as long
            # as 16 one-shot sandboxes, at load 11); measured right before and right after each
            bare_cpu = ["chroot", str(root), *cpu]
            for s in ready:
                before = await _cpu16(functools.partial(_run, bare_cpu, session=True))
                live = lives.get(s.name)
                if live is not None and not isinstance(live, _ProcessLive):
                    wall = await _cpu16(functools.partial(live.exec, cpu))
                else:  # one-shot systems: 16 at once, each made for its command
                    wall = await _cpu16(functools.partial(s.once, cpu))
                bare = (before + await _cpu16(functools.partial(_run, bare_cpu, session=True))) / 2
                rows[s.name].update(cpu16_bare_s=round(bare, 3), cpu16_s=round(wall, 3),
                                    cpu16_slowdown=round(wall / bare, 3))
                say(f"{s.name}: 16 CPU-bound commands {wall:.2f} s, bare {bare:.2f} s")
        finally:
            for live in lives.values():
                with contextlib.suppress(Exception):
                    await live.close()
        for s in ready:
            xs = times[s.name]
            rows[s.name].update(create_exec_close_p50_ms=_ms(xs, 50), create_exec_close_p99_ms=_ms(xs, 99),
                                n=len(xs))
        for name, xs in rtts.items():
            rows[name].update(exec_rtt_p50_ms=_ms(xs, 50), exec_rtt_p99_ms=_ms(xs, 99))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    raw = rows.get("raw-bwrap", {}).get("create_exec_close_p50_ms")
    out = []
    for name in SYSTEMS:
        if name not in rows:
            continue
        row = rows[name]
        for k in ("create_exec_close_p50_ms", "create_exec_close_p99_ms", "exec_rtt_p50_ms", "exec_rtt_p99_ms",
                  "cpu16_slowdown", "idle_pss_mib"):
            row.setdefault(k, None)
        p50 = row.get("create_exec_close_p50_ms")
        row["ratio_to_raw_bwrap"] = round(p50 / raw, 2) if p50 and raw else None
        out.append(row)
    result = {"systems": out, "image": image, "rounds": rounds, "rtt_samples": rtt,
              "duration_s": round(time.monotonic() - t_start, 1), "loadavg": os.getloadavg(),
              "targets": targets(out), "provenance": provenance({"bench": "peers", "image": image, "rounds": rounds})}
    return result


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, as ratios from this run (None where a side is missing)."""
    by = {r["name"]: r for r in rows}

    def get(name: str, key: str) -> float | None:
        v = by.get(name, {}).get(key)
        return float(v) if v else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    checks = [
        ("sandfleet-bwrap create->exec->close / raw-bwrap", ratio(get("sandfleet-bwrap", "create_exec_close_p50_ms"),
                                                                 get("raw-bwrap", "create_exec_close_p50_ms")), 2.0),
        ("sandfleet-bwrap create->exec->close / podman", ratio(get("sandfleet-bwrap", "create_exec_close_p50_ms"),
                                                              get("podman", "create_exec_close_p50_ms")), 0.1),
        ("sandfleet-gvisor create->exec->close / runsc-do", ratio(get("sandfleet-gvisor", "create_exec_close_p50_ms"),
                                                                 get("runsc-do", "create_exec_close_p50_ms")), 1.2),
        ("sandfleet-gvisor exec RTT / runsc exec (runsc-run)", ratio(get("sandfleet-gvisor", "exec_rtt_p50_ms"),
                                                                    get("runsc-run", "exec_rtt_p50_ms")), 1.5),
    ]
    return [{"target": t, "ratio": r, "at_most": limit, "held": None if r is None else r <= limit}
            for t, r, limit in checks]


COLUMNS = (("create_exec_close_p50_ms", "c-e-c p50 ms", ".1f"), ("create_exec_close_p99_ms", "p99 ms", ".1f"),
           ("exec_rtt_p50_ms", "exec p50 ms", ".2f"), ("exec_rtt_p99_ms", "p99 ms", ".2f"),
           ("cpu16_slowdown", "cpu16 x", ".2f"), ("idle_pss_mib", "idle PSS MiB", ".1f"),
           ("ratio_to_raw_bwrap", "x raw bwrap", ".2f"))


def table_lines(result: dict[str, Any]) -> list[str]:
    head = f"{'system':18}" + "".join(f"{label:>13}" for _, label, _ in COLUMNS)
    out = [head]
    for row in result["systems"]:
        if "missing" in row or "error" in row:
            why = f"missing: {row['install']}" if "missing" in row else f"failed: {row['error'][:90]}"
            out.append(f"{row['name']:18} {why}")
            continue
        out.append(f"{row['name']:18}" + "".join(
            f"{'-' if row.get(k) is None else format(row[k], spec):>13}" for k, _, spec in COLUMNS))
    for t in result.get("targets", []):
        held = "n/a" if t["held"] is None else ("held" if t["held"] else "MISSED")
        out.append(f"target: {t['target']} = {t['ratio']} (at most {t['at_most']}): {held}")
    return out
