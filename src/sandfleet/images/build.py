"""Build environment images without a Docker engine.

- A **base** is a Debian root filesystem: built with debootstrap (``sandfleet image build``),
  or, when the host itself runs the wanted Debian suite, the host's own root (no build).
- A **task image** is one thin layer over a shared base: the Dockerfile's COPY/ADD, WORKDIR
  and ENV applied on the host, RUN steps executed in a bubblewrap sandbox whose overlay
  upper directory *is* the layer. Images are cached by a hash of the base and every step
  (with the content of copied files), so rebuilding an unchanged task costs nothing.
"""

from __future__ import annotations

import asyncio
import fcntl
import glob
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sandfleet.errors import ImageBuildError
from sandfleet.images import Image, arch, host_image, images_dir, list_images, save_image
from sandfleet.images.debootstrap import base_image_for

if TYPE_CHECKING:
    from sandfleet.tasks.dockerfile import Dockerfile
    from sandfleet.tasks.model import Task

log = logging.getLogger(__name__)
AGENT_HOST_UID = 61000  # BwrapConfig.host_uid: the task workdir belongs to the sandbox user
SANDBOX_UID = 1000  # BwrapConfig.sandbox_uid: the uid commands run as inside


def _hash_tree(h: hashlib._Hash, path: Path) -> None:
    if path.is_file() or path.is_symlink():
        h.update(path.name.encode())
        h.update(str(path.readlink()).encode() if path.is_symlink() else path.read_bytes())
        h.update(oct(path.lstat().st_mode).encode())
        return
    for child in sorted(path.rglob("*")):
        h.update(str(child.relative_to(path)).encode())
        if child.is_file() and not child.is_symlink():
            h.update(child.read_bytes())
        h.update(oct(child.lstat().st_mode).encode())


def _sources(context: Path, pattern: str, df: str, line: int) -> list[Path]:
    if "://" in pattern:
        raise ImageBuildError(f"ADD of a URL ({pattern}) needs the internet at build time; "
                              "vendor the file into the build context", file=df, line=line)
    full = os.path.normpath(context / pattern.lstrip("/"))
    if not (full + os.sep).startswith(str(context.resolve()) + os.sep) and full != str(context.resolve()):
        raise ImageBuildError(f"COPY source {pattern!r} is outside the build context", file=df, line=line)
    found = sorted(Path(p) for p in glob.glob(full))  # noqa: PTH207 (absolute pattern)
    if not found:
        raise ImageBuildError(f"COPY source {pattern!r} not found in {context}", file=df, line=line)
    return found


def _owner(spec: str | None) -> tuple[int, int]:
    """Host owner for ``COPY --chown``: root stays root; the sandbox user (uid 1000, which
    sandboxes map to AGENT_HOST_UID) and any named user become the sandbox user."""
    if not spec:
        return 0, 0
    user, _, group = spec.partition(":")

    def one(x: str) -> int:
        if x.isdigit():
            return AGENT_HOST_UID if int(x) == SANDBOX_UID else int(x)
        return 0 if x in ("", "root") else AGENT_HOST_UID
    return one(user), one(group or user)


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.lchown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            os.lchown(Path(root, n), uid, gid)


class _Builder:
    def __init__(self, task: Task, df: Dockerfile, base: Image, out: Path):
        assert task.dockerfile is not None
        self.task = task
        self.df = df
        self.dfname = str(task.dockerfile)
        self.context = (task.context_dir or task.dockerfile.parent).resolve()
        self.base = base
        self.out = out
        self.layer = out / "layer"
        self.env: dict[str, str] = {}
        self.workdir = "/"
        self.log: list[str] = []

    def digest(self) -> str:
        from sandfleet.tasks.dockerfile import Copy

        h = hashlib.sha256(f"sandfleet-image/2 {self.base.hash}".encode())  # bump when builds change
        for step in self.df.steps:
            h.update(repr(step).encode())
            if isinstance(step, Copy):
                for pat in step.sources:
                    for src in _sources(self.context, pat, self.dfname, step.line):
                        _hash_tree(h, src)
        return h.hexdigest()[:32]

    def _target(self, dest: str) -> Path:
        return self.layer / dest.lstrip("/")

    def copy(self, step: object) -> None:
        from sandfleet.tasks.dockerfile import Copy

        assert isinstance(step, Copy)
        srcs = [s for p in step.sources for s in _sources(self.context, p, self.dfname, step.line)]
        dest = step.dest
        as_dir = dest.endswith("/") or len(srcs) > 1 or (srcs[0].is_dir())
        uid, gid = _owner(step.chown)
        for src in srcs:
            if src.is_dir():
                target = self._target(dest)
                shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
            elif step.add and tarfile.is_tarfile(src):
                target = self._target(dest)
                target.mkdir(parents=True, exist_ok=True)
                with tarfile.open(src) as tar:
                    tar.extractall(target, filter="data")
            else:
                target = self._target(dest) / src.name if as_dir else self._target(dest)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target, follow_symlinks=False)
            _chown_tree(target, uid, gid)
            if step.chmod:
                target.chmod(int(step.chmod, 8))

    def run(self, step: object, deadline: float) -> None:
        from sandfleet.sandbox.bwrap import build_command
        from sandfleet.tasks.dockerfile import Run

        assert isinstance(step, Run)
        argv = list(step.argv) if step.argv else ["/bin/sh", "-c", step.shell or ""]
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8",
               **dict(step.build_args), **self.env}
        cmd = build_command(self.out, self.layer, self.base.lowers, argv, env=env, cwd=self.workdir)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ImageBuildError("build timed out", file=self.dfname, line=step.line)
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=remaining)
        except subprocess.TimeoutExpired:
            raise ImageBuildError(f"RUN timed out after the build timeout "
                                  f"({self.task.build_timeout_s:.0f}s)", file=self.dfname, line=step.line) from None
        after = self.layer.with_name(self.layer.name + ".next")
        if after.exists():  # the step ran over a copy of the layer: its result replaces the layer
            shutil.rmtree(self.layer)
            after.rename(self.layer)
        out = (proc.stdout + proc.stderr).decode(errors="replace")
        self.log.append(f"--- line {step.line}: {' '.join(argv)}\n{out}")
        if proc.returncode != 0:
            hint = ""
            if any(w in out for w in ("Could not resolve", "Temporary failure in name resolution",
                                      "Network is unreachable", "Failed to establish")):
                hint = " (the step needs the internet, which this build can't reach)"
            raise ImageBuildError(f"RUN exited with {proc.returncode}{hint}: {out.strip()[-800:]}",
                                  file=self.dfname, line=step.line)

    def build(self) -> dict[str, object]:
        from sandfleet.tasks.dockerfile import Copy, Env, From, Run, Workdir

        deadline = time.monotonic() + self.task.build_timeout_s
        self.layer.mkdir(parents=True)
        for step in self.df.steps:
            if isinstance(step, From):
                continue
            if isinstance(step, Copy):
                self.copy(step)
            elif isinstance(step, Workdir):
                self.workdir = step.path
                self._target(step.path).mkdir(parents=True, exist_ok=True)
            elif isinstance(step, Env):
                self.env.update(dict(step.values))
            elif isinstance(step, Run):
                self.run(step, deadline)
        workdir = self.df.workdir or self.task.workdir
        wd = self._target(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        _chown_tree(wd, AGENT_HOST_UID, AGENT_HOST_UID)  # the agent works here
        (self.out / "build.log").write_text("\n".join(self.log))
        return {"workdir": workdir, "env": self.env, "user": self.df.user,
                "dockerfile": self.dfname, "notes": list(self.df.notes)}


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for n in files:
            try:
                total += Path(root, n).lstat().st_blocks * 512
            except OSError:
                pass
    return total


def build_task_image(task: Task) -> Image:
    """Build (or find in the cache) the image of a task; blocking."""
    if task.dockerfile is None:
        if task.docker_image:
            raise ImageBuildError(f"task {task.name} names only a registry image "
                                  f"({task.docker_image}) and no environment/Dockerfile; sandfleet "
                                  "can't pull images: add the Dockerfile that builds it")
        return host_image()
    from sandfleet.tasks.bases import resolve_base
    from sandfleet.tasks.dockerfile import parse_dockerfile

    df = parse_dockerfile(task.dockerfile, arch=arch())
    ref = resolve_base(df.base.image, file=str(task.dockerfile), line=df.base.line)
    base = base_image_for(ref.suite, ref.packages, file=str(task.dockerfile), line=df.base.line)
    tmp_out = images_dir() / f".build-{os.getpid()}-{time.monotonic_ns()}"
    builder = _Builder(task, df, base, tmp_out)
    digest = builder.digest()
    final = images_dir() / digest
    with open(images_dir() / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for img in list_images():
            if img.hash == digest:
                return img
        shutil.rmtree(final, ignore_errors=True)
        t0 = time.monotonic()
        try:
            meta = builder.build()
        except BaseException:
            shutil.rmtree(tmp_out, ignore_errors=True)
            raise
        shutil.rmtree(tmp_out / "work", ignore_errors=True)
        tmp_out.rename(final)
        meta.update(task=task.name, build_s=round(time.monotonic() - t0, 3),
                    layer_bytes=_du(final / "layer"), base_ref=ref.image)
        image = Image(name=f"task-{task.name}", lowers=[final / "layer", *base.lowers], arch=base.arch,
                      page_size=base.page_size, hash=digest, base=base.name, meta=meta)
        save_image(image)
        log.info("built image %s for %s in %.1fs", digest[:12], task.name, meta["build_s"])
        return image


async def ensure_task_image(task: Task) -> str:
    """The name to put in a SandboxSpec for this task's environment, building it if needed."""
    image = await asyncio.to_thread(build_task_image, task)
    return "host" if image.is_host else image.hash


def describe(image: Image) -> str:
    return json.dumps(image.to_json(), indent=2)
