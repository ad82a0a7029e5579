"""A real ``sandfleet serve`` in a subprocess, on loopback, for tests and ``bench service``.

    with running_service(tmp_path) as svc:          # an ephemeral port, a 0600 token file
        client = await connect(svc.url, svc.token)
        ...
    # stopped with SIGTERM (drained) on exit; svc.kill() is the SIGKILL of a crash

Nothing here imports the server's dependencies: it starts the command line.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sandfleet.settings import child_env

READY = "sandfleet serve: listening on "


@dataclass
class RunningService:
    url: str
    tokens: list[str]
    proc: subprocess.Popen[bytes]
    dir: Path
    args: list[str] = field(default_factory=list)

    @property
    def token(self) -> str:
        return self.tokens[0]

    @property
    def log(self) -> str:
        """What the service wrote to stderr so far."""
        try:
            return (self.dir / "serve.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the service and wait for it; SIGKILL if it outlives ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def kill(self) -> int:
        """SIGKILL, as a crash: its sandboxes are left for the next service to reap."""
        return self.stop(signal.SIGKILL)


def write_tokens(path: Path, n: int = 2) -> list[str]:
    tokens = [secrets.token_urlsafe(24) for _ in range(n)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# sandfleet test tokens\n" + "\n".join(tokens) + "\n")
    return tokens


def start_service(dir: Path, *, args: Sequence[str] = (), tokens: list[str] | None = None, port: int = 0,
                  env: dict[str, str] | None = None, ready_timeout: float = 60.0) -> RunningService:
    """Start ``sandfleet serve`` on 127.0.0.1 and wait until it is ready (its tokens are in
    ``dir/tokens``, its stderr in ``dir/serve.log``)."""
    dir.mkdir(parents=True, exist_ok=True)
    token_file = dir / "tokens"
    if tokens is None:
        tokens = write_tokens(token_file)
    argv = [sys.executable, "-m", "sandfleet", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--token-file", str(token_file), *args]
    with open(dir / "serve.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                env=child_env(env))
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    end = time.monotonic() + ready_timeout
    buf = b""
    try:
        while READY.encode() not in buf or not buf.endswith(b"\n"):
            left = end - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise RuntimeError(f"sandfleet serve did not start: {(dir / 'serve.log').read_text()[-2000:]}")
            if sel.select(min(left, 0.2)):
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    continue
                buf += chunk
    except BaseException:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise
    finally:
        sel.close()
    line = buf.decode().split(READY, 1)[1]
    url = line.split()[0]
    return RunningService(url=url, tokens=tokens, proc=proc, dir=dir, args=list(args))


def leftovers(ids: Iterable[str]) -> list[str]:
    """What is left on this host of the sandboxes ``ids``: markers, cgroups, and processes
    whose command line names them (launchers, bwrap); empty when nothing is."""
    from sandfleet.sandbox import cgroups
    from sandfleet.sandbox.state import state_root

    wanted = set(ids)
    root = state_root()
    found = [f"marker {i}" for i in sorted(wanted) if (root / i).exists()]
    found += [f"cgroup {parent}/{name}" for name, parent in sorted(cgroups.leftover_groups()) if name in wanted]
    needles = [i.encode() for i in wanted]
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if any(n in cmd for n in needles):
            shown = cmd.replace(b"\0", b" ")[:200].decode(errors="replace")
            found.append(f"process {p.name}: {shown}")
    return found


def own_cache(dir: Path, src: Path | None = None) -> dict[str, str]:
    """The environment of a service with a cache of its own (``dir``), so that what it builds
    is not what this process built: it starts with a symbolic link to each base image and
    guest agent build of this host's cache (complete ones: never changed after), so no Debian
    base is debootstrapped again, and with no task image."""
    import json

    from sandfleet.agent.build import cache_dir

    src = src or cache_dir()
    for name in ("agent", "images"):
        (dir / name).mkdir(parents=True, exist_ok=True)
        if not (src / name).is_dir():
            continue
        for entry in (src / name).iterdir():
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            if name == "images":
                try:
                    meta = json.loads((entry / "image.json").read_text()).get("meta") or {}
                except (OSError, ValueError):
                    continue  # incomplete
                if "task" in meta:
                    continue  # a task image: the service must build its own
            (dir / name / entry.name).symlink_to(entry)
    return {"SANDFLEET_CACHE": str(dir)}


@contextlib.contextmanager
def running_service(dir: Path, **kw: object) -> Iterator[RunningService]:
    """A service for the ``with`` block; stopped with SIGTERM (a drain) after it."""
    svc = start_service(dir, **kw)  # type: ignore[arg-type]
    try:
        yield svc
    finally:
        svc.stop()
