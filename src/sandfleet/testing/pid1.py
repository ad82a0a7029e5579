"""``sandfleet serve`` as PID 1 of a pid namespace, under many sandbox lifecycles.

    python -m sandfleet.testing.pid1 --n 10000 --concurrency 8      # a JSON report

Starts ``unshare --pid --fork --mount-proc --kill-child sandfleet serve`` (needs root),
runs ``n`` lifecycles (create, exec, close) through the client, counts failures and the
zombies of the namespace (sampled as it runs, and at the end), then stops the service
with SIGTERM or SIGINT sent to its PID 1 and checks it exits 0 leaving nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandfleet.server.testing import READY, leftovers, write_tokens
from sandfleet.settings import child_env


@dataclass
class Pid1Report:
    n: int
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    zombies_seen_max: int = 0  # in one sample while running (a process between exit and reap)
    zombies_at_end: list[str] = field(default_factory=list)
    processes_at_end: list[str] = field(default_factory=list)  # of the namespace, before the stop
    stop_signal: str = "SIGTERM"
    exit_code: int | None = None
    stop_seconds: float = 0.0
    leftovers: list[str] = field(default_factory=list)


def _ns_processes(init_pid: int) -> list[tuple[int, str, str]]:
    """(host pid, comm, state) of every process in ``init_pid``'s pid namespace."""
    try:
        ns = Path(f"/proc/{init_pid}/ns/pid").readlink()
    except OSError:
        return []
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if (p / "ns/pid").readlink() != ns:
                continue
            st = (p / "stat").read_text()
        except OSError:
            continue
        out.append((int(p.name), st[st.index("(") + 1:st.rindex(")")], st[st.rindex(")") + 2:].split()[0]))
    return out


class Pid1Service:
    """A service started as PID 1 of a new pid namespace; ``init_pid`` is its host pid."""

    def __init__(self, dir: Path, args: list[str] | None = None, ready_timeout: float = 60.0):
        if not shutil.which("unshare"):
            raise RuntimeError("needs unshare (util-linux)")
        dir.mkdir(parents=True, exist_ok=True)
        self.dir = dir
        token_file = dir / "tokens"
        self.token = write_tokens(token_file, 1)[0]
        argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-m", "sandfleet",
                "serve", "--host", "127.0.0.1", "--port", "0", "--token-file", str(token_file), *(args or [])]
        # a cgroup parent of its own: another sandfleet's reaper (other state directory, same
        # parent) removes sandbox cgroups it has no marker for (docs/security.md, known gap)
        self.cgroup_parent = f"sandfleet-pid1-{os.getpid()}"
        self.left: list[str] = []
        env = child_env({"SANDFLEET_CGROUP_PARENT": self.cgroup_parent})
        with open(dir / "serve.log", "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env)
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        buf, end = b"", time.monotonic() + ready_timeout
        try:
            while READY.encode() not in buf or not buf.endswith(b"\n"):
                if time.monotonic() > end or self.proc.poll() is not None:
                    raise RuntimeError(f"serve as PID 1 did not start: {self.log[-2000:]}")
                if sel.select(0.2):
                    buf += os.read(self.proc.stdout.fileno(), 4096)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            sel.close()
        self.url = buf.decode().split(READY, 1)[1].split()[0]
        kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        self.init_pid = int(kids[0])

    @property
    def log(self) -> str:
        return (self.dir / "serve.log").read_text(errors="replace")

    def zombies(self) -> list[str]:
        return [f"{pid} {comm}" for pid, comm, state in _ns_processes(self.init_pid) if state == "Z"]

    def processes(self) -> list[str]:
        return [f"{pid} {comm} {state}" for pid, comm, state in _ns_processes(self.init_pid)]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal PID 1 (not unshare, which ignores it) and wait; SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            os.kill(self.init_pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        from sandfleet.sandbox import cgroups

        for root in set(cgroups.detect().mounts.values()):  # the parent, empty once its sandboxes closed
            d = root / self.cgroup_parent
            with contextlib.suppress(OSError):
                d.rmdir()
            if d.exists():
                self.left.append(f"cgroup {d} (not empty)")
        return self.proc.returncode


async def lifecycles(url: str, token: str, n: int, concurrency: int, report: Pid1Report,
                     sample: Pid1Service | None = None) -> list[str]:
    """``n`` create/exec/close lifecycles, ``concurrency`` at a time; the ids made."""
    from sandfleet.client import connect

    ids: list[str] = []
    todo = iter(range(n))

    async def worker(client: object) -> None:
        for i in todo:
            try:
                sb = await client.create_sandbox(ttl_s=120)  # type: ignore[attr-defined]
                ids.append(sb.id)
                try:
                    r = await sb.exec(f"echo {i}")
                    if r.stdout != f"{i}\n" or r.exit_code != 0:
                        raise AssertionError(f"exec answered {r.exit_code} {r.stdout!r}")
                finally:
                    await sb.close()
                report.ok += 1
            except Exception as e:  # noqa: BLE001 (each failure is counted and shown)
                report.failures.append(f"{i}: {type(e).__name__}: {e}"[:300])

    async def sampler() -> None:
        while sample is not None:
            report.zombies_seen_max = max(report.zombies_seen_max, len(sample.zombies()))
            await asyncio.sleep(0.5)

    async with await connect(url, token) as client:
        s = asyncio.create_task(sampler())
        try:
            await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        finally:
            s.cancel()
    return ids


def run(n: int, concurrency: int = 8, backend: str = "bwrap", stop_signal: int = signal.SIGTERM,
        live_at_stop: int = 2, dir: Path | None = None) -> Pid1Report:
    """The whole check; ``live_at_stop`` sandboxes are left open for the stop to close."""
    tmp = Path(tempfile.mkdtemp(prefix="sandfleet-pid1-")) if dir is None else dir
    report = Pid1Report(n=n, stop_signal=signal.Signals(stop_signal).name)
    svc = Pid1Service(tmp, ["--backend", backend])
    ids: list[str] = []
    try:
        t0 = time.monotonic()
        ids = asyncio.run(lifecycles(svc.url, svc.token, n, concurrency, report, svc))
        report.seconds = round(time.monotonic() - t0, 1)

        async def leave_open() -> list[str]:
            from sandfleet.client import connect

            async with await connect(svc.url, svc.token) as c:
                return [(await c.create_sandbox(ttl_s=120)).id for _ in range(live_at_stop)]

        ids += asyncio.run(leave_open())
        time.sleep(0.5)  # (a process between its exit and its reaping is not a leak)
        report.zombies_at_end = svc.zombies()
        report.processes_at_end = svc.processes()
    finally:
        t1 = time.monotonic()
        report.exit_code = svc.stop(stop_signal)
        report.stop_seconds = round(time.monotonic() - t1, 2)
    report.leftovers = leftovers(ids) + svc.left
    if dir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--backend", default="bwrap")
    ap.add_argument("--signal", default="SIGTERM", choices=["SIGTERM", "SIGINT"])
    a = ap.parse_args()
    r = run(a.n, a.concurrency, a.backend, getattr(signal, a.signal))
    d = asdict(r)
    d["failures"] = {"count": len(r.failures), "first": r.failures[:10]}
    sys.stdout.write(json.dumps(d, indent=1) + "\n")


if __name__ == "__main__":
    main()
