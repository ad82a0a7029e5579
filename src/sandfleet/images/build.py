"""Build environment images without a Docker engine, and without host privileges.

- A **base** is a Debian root filesystem: built with debootstrap (``sandfleet image build``),
  or, when the host itself runs the wanted Debian suite, the host's own root (no build).
- A **task image** is one thin layer over a shared base: the Dockerfile's COPY/ADD, WORKDIR
  and ENV applied by this process, RUN steps executed rootless (:mod:`sandfleet.images.run`)
  over a copy of the layer. Images are cached by a hash of the base and every step (with
  the content of copied files), so rebuilding an unchanged task costs nothing.

Layers are stored **shifted** into the sandbox uid range (docs/security.md): a file that
belongs to root in the image is owned by host uid ``uid_base`` on disk, sandbox uid ``N`` by
``uid_base + N``. Everything this process writes into a layer goes through :class:`_Tree`,
which resolves paths inside the image (a symlink that a RUN step left resolves against the
image's root, never the host's) and writes with ``O_NOFOLLOW`` and directory descriptors.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import glob
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandfleet.agent.build import cache_dir
from sandfleet.errors import ImageBuildError, SandboxError
from sandfleet.images import scratch
from sandfleet.images.bases import BaseRef, resolve_base
from sandfleet.images.debootstrap import base_image_for
from sandfleet.images.dockerfile import Copy, Dockerfile, Env, From, Run, Stage, User, Workdir, parse_dockerfile
from sandfleet.images.mirrors import build_env, build_files, install_failure
from sandfleet.images.run import build_command, layer_next
from sandfleet.images.tools import tool_path, tool_tree
from sandfleet.imagestore import Image, arch, images_dir, list_images, save_image
from sandfleet.sandbox import uids
from sandfleet.sandbox.network import StepNetwork, availability, helper_uid
from sandfleet.sandbox.spec import AGENT_UID, ROOT_UID, SANDBOX_UIDS, BwrapConfig

log = logging.getLogger(__name__)
BUILDER = "sandfleet-image/3"
"""Part of every image hash: bump it when what a build produces changes (3: shifted owners)."""
OPAQUE = "trusted.overlay.opaque"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40


@dataclass(frozen=True)
class BuildSpec:
    """What the builder builds: a Dockerfile in its context, the image's name, and what to
    record beside it. It knows nothing of tasks (``sandfleet.tasks.images.build_spec`` makes
    one from a task)."""

    dockerfile: Path
    context: Path
    """The build context: what COPY and ADD read (nothing outside it)."""
    name: str
    """The image's name (``sandfleet image ls``); a task's image is ``task-<task>``."""
    workdir: str = "/"
    """The final working directory when the Dockerfile sets none (made there; given to the
    non-root ``agent`` when the Dockerfile names no USER)."""
    timeout_s: float = 600.0
    """Limit of the whole build (every RUN step together)."""
    meta: Mapping[str, object] = field(default_factory=dict)
    """Recorded in the image's metadata beside what the build reports (a task's name)."""


def _hash_tree(h: hashlib._Hash, path: Path) -> None:
    """Names, modes, link targets and contents below ``path``; never follows a symlink."""
    st = path.lstat()
    h.update(path.name.encode() + oct(st.st_mode).encode())
    if stat.S_ISLNK(st.st_mode):
        h.update(str(path.readlink()).encode())
    elif stat.S_ISREG(st.st_mode):
        h.update(path.read_bytes())
    elif stat.S_ISDIR(st.st_mode):
        for child in sorted(os.scandir(path), key=lambda e: e.name):
            h.update(b"/")
            _hash_tree(h, Path(child.path))


def _sources(context: Path, pattern: str, df: str, line: int) -> list[tuple[str, Path]]:
    """The context entries a COPY source names: (name, path with symlinks resolved); refused
    when one resolves outside the context (as Docker does)."""
    if "://" in pattern:
        raise ImageBuildError(f"ADD of a URL ({pattern}) needs the internet at build time; "
                              "vendor the file into the build context", file=df, line=line)
    ctx = os.path.realpath(context)
    found = sorted(glob.glob(f"{glob.escape(ctx)}/{pattern.lstrip('/')}"))  # noqa: PTH207
    if not found:
        raise ImageBuildError(f"COPY source {pattern!r} not found in {context}", file=df, line=line)
    out = []
    for p in found:
        real = os.path.realpath(p)
        if real != ctx and not real.startswith(ctx + os.sep):
            raise ImageBuildError(f"COPY source {pattern!r} resolves outside the build context "
                                  f"({os.path.relpath(p, ctx)} -> {real})", file=df, line=line)
        out.append((Path(p).name, Path(real)))
    return out


class _Tree:
    """The image as the builder sees it: the layer it writes, over read-only ``lowers``.

    Paths are resolved component by component like ``openat2(RESOLVE_IN_ROOT)`` over the
    merged view (the layer first, with overlayfs whiteouts and opaque directories, then the
    lowers): ``..`` stops at the root and a symlink, absolute or relative, resolves inside
    the image. Writes happen only in the layer, through directory descriptors opened with
    ``O_NOFOLLOW``."""

    def __init__(self, layer: Path, lowers: list[Path], config: BwrapConfig, where: tuple[str, int]):
        self.layer = layer
        self.lowers = lowers
        self.config = config
        self.file, self.line = where

    def fail(self, message: str) -> ImageBuildError:
        return ImageBuildError(message, file=self.file, line=self.line or None)

    # ---- lookups in the merged view ----
    @staticmethod
    def _open_dirs(top: Path, parts: list[str]) -> tuple[int | None, list[bool]]:
        """A descriptor of ``top/parts...`` (directories only, no symlink followed), plus
        which of them are opaque; None where the chain is broken."""
        fd = os.open(top, _DIR)
        opaque: list[bool] = []
        for name in parts:
            try:
                nfd = os.open(name, _DIR, dir_fd=fd)
            except OSError as e:
                os.close(fd)
                if e.errno != errno.ENOENT:  # a whiteout or a file here hides the lowers below
                    opaque.append(True)
                return None, opaque
            os.close(fd)
            fd = nfd
            try:
                opaque.append(os.getxattr(fd, OPAQUE) == b"y")
            except OSError:
                opaque.append(False)
        return fd, opaque

    def _find(self, parts: list[str]) -> tuple[os.stat_result, int, int] | None:
        """Where the entry ``parts`` is: (lstat, directory fd holding it, index of the source:
        -1 the layer, i the i-th lower); None when it does not exist. Caller closes the fd."""
        *dirs, name = parts
        fd, opaque = self._open_dirs(self.layer, dirs)
        if fd is not None:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None:
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout: deleted
                    os.close(fd)
                    return None
                return st, fd, -1
            os.close(fd)
        if any(opaque):  # an opaque directory of the layer hides everything below it
            return None
        for i, lower in enumerate(self.lowers):
            fd, _ = self._open_dirs(lower, dirs)
            if fd is None:
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                os.close(fd)
                continue
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                os.close(fd)
                return None
            return st, fd, i
        return None

    def lstat(self, parts: list[str]) -> os.stat_result | None:
        if not parts:
            return os.lstat(self.layer)
        found = self._find(parts)
        if found is None:
            return None
        os.close(found[1])
        return found[0]

    def resolve(self, path: str, *, follow_last: bool = True) -> list[str]:
        """The components of ``path`` inside the image, every symlink resolved in-root (the
        last one only when ``follow_last``)."""
        todo = [p for p in path.split("/") if p not in ("", ".")][::-1]
        done: list[str] = []
        hops = 0
        while todo:
            name = todo.pop()
            if name == "..":
                if done:
                    done.pop()
                continue
            found = self._find([*done, name])
            if found is not None and stat.S_ISLNK(found[0].st_mode) and (todo or follow_last):
                target = os.readlink(name, dir_fd=found[1])
                os.close(found[1])
                hops += 1
                if hops > _MAX_LINKS:
                    raise self.fail(f"too many levels of symbolic links in {path}")
                if target.startswith("/"):
                    done = []
                todo += [p for p in target.split("/") if p not in ("", ".")][::-1]
                continue
            if found is not None:
                os.close(found[1])
            done.append(name)
        return done

    # ---- writes into the layer ----
    def _mirror(self, st: os.stat_result, src: int) -> tuple[int, int]:
        """The owner a layer copy of a lower's directory gets: what the running image shows."""
        if src >= 0 and self.lowers[src] != Path("/"):  # an idmapped base: host uid i is image uid i
            def shift(i: int) -> int:
                return self.config.host_uid(i) if i < SANDBOX_UIDS else i
            return shift(st.st_uid), shift(st.st_gid)
        return st.st_uid, st.st_gid

    def dir_fd(self, parts: list[str], owner: tuple[int, int], mode: int | None = None, *,
               replace: bool = False) -> int:
        """A descriptor of the layer directory ``parts`` (already resolved), made where
        missing: like the lower's directory when one exists, else owned by ``owner`` with
        ``mode``. ``replace``: the last component becomes a directory even where the image
        has something else (a symlink, a file) in a lower."""
        fd = os.open(self.layer, _DIR)
        for i, name in enumerate(parts):
            here = "/" + "/".join(parts[: i + 1])
            try:
                nfd = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                nfd = None
            except OSError as e:
                whiteout = self._whiteout(fd, name)
                if not whiteout:
                    os.close(fd)
                    raise self.fail(f"{here} is not a directory ({e.strerror})") from None
                nfd = None
            if nfd is None:
                found = self._find(parts[: i + 1])
                whiteout = self._whiteout(fd, name)
                uid, gid, m = *owner, 0o755 if mode is None else mode
                if found is not None:
                    st, lfd, src = found
                    os.close(lfd)
                    if stat.S_ISDIR(st.st_mode):
                        (uid, gid), m = self._mirror(st, src), stat.S_IMODE(st.st_mode)
                    elif not (replace and i == len(parts) - 1):
                        os.close(fd)
                        raise self.fail(f"{here} is not a directory in the image")
                if whiteout:
                    os.unlink(name, dir_fd=fd)
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                    nfd = os.open(name, _DIR, dir_fd=fd)
                finally:
                    os.close(fd)
                os.fchown(nfd, uid, gid)
                os.fchmod(nfd, m)
                if whiteout:  # the lower's directory was deleted: don't let its content show
                    os.setxattr(nfd, OPAQUE, b"y")
            else:
                os.close(fd)
            fd = nfd
        return fd

    @staticmethod
    def _whiteout(pfd: int, name: str) -> bool:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0

    def _clear(self, pfd: int, name: str, *, keep_dir: bool) -> bool:
        """Remove the layer entry ``name`` (never following it; whiteouts stay for dir_fd to
        handle when a directory comes); True if a directory stays."""
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return True
            shutil.rmtree(name, dir_fd=pfd)
        elif not (keep_dir and stat.S_ISCHR(st.st_mode) and st.st_rdev == 0):
            os.unlink(name, dir_fd=pfd)
        return False

    def mkdirs(self, path: str, owner: tuple[int, int]) -> list[str]:
        parts = self.resolve(path)
        os.close(self.dir_fd(parts, owner))
        return parts

    def into(self, parts: list[str], src: Path, owner: tuple[int, int], chmod: int | None) -> None:
        """Copy the content of the context directory ``src`` into the image directory ``parts``
        (made when missing, owned by ``owner``)."""
        mode = chmod if chmod is not None else stat.S_IMODE(src.lstat().st_mode)
        os.close(self.dir_fd(parts, owner, mode))
        for child in sorted(os.scandir(src), key=lambda e: e.name):
            self.put([*parts, child.name], Path(child.path), owner, chmod)

    def put(self, parts: list[str], src: Path, owner: tuple[int, int], chmod: int | None) -> None:
        """Copy ``src`` (a file, symlink or directory tree of the build context) to the entry
        ``parts``: its parent is resolved already; the entry itself is replaced, not followed."""
        st = src.lstat()
        mode = chmod if chmod is not None else stat.S_IMODE(st.st_mode)
        pfd = self.dir_fd(parts[:-1], owner)
        try:
            name = parts[-1]
            kept = self._clear(pfd, name, keep_dir=stat.S_ISDIR(st.st_mode))
            if stat.S_ISDIR(st.st_mode):
                pass
            elif kept:
                raise self.fail(f"can't copy {src.name} over the directory /{'/'.join(parts)}")
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(src.readlink(), name, dir_fd=pfd)
                os.chown(name, *owner, dir_fd=pfd, follow_symlinks=False)
            elif stat.S_ISREG(st.st_mode):
                self._write(pfd, name, src, owner, mode, st)
        finally:
            os.close(pfd)
        if stat.S_ISDIR(st.st_mode):
            fd = self.dir_fd(parts, owner, mode, replace=True)
            try:
                os.fchown(fd, *owner)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            for child in sorted(os.scandir(src), key=lambda e: e.name):
                self.put([*parts, child.name], Path(child.path), owner, chmod)

    @staticmethod
    def _write(pfd: int, name: str, src: Path, owner: tuple[int, int], mode: int, st: os.stat_result) -> None:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd)
        try:
            with open(src, "rb") as f:
                while chunk := f.read(1 << 20):
                    os.write(fd, chunk)
            os.fchown(fd, *owner)
            os.fchmod(fd, mode)
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fd)

    def untar(self, parts: list[str], archive: Path, owner: tuple[int, int], chmod: int | None) -> None:
        """Unpack a local archive into the directory ``parts`` (``tarfile``'s "data" rules:
        no absolute names, no ``..``, no links out, no devices)."""
        os.close(self.dir_fd(parts, owner))
        fake = "/nonexistent-sandfleet-dest"
        with tarfile.open(archive) as tar:
            for member in tar:
                try:
                    m = tarfile.data_filter(member, fake)
                except tarfile.FilterError as e:
                    raise self.fail(f"ADD {archive.name}: {e}") from None
                if m is None:
                    continue
                rel = [p for p in m.name.split("/") if p not in ("", ".")]
                if not rel:
                    continue
                where = self.resolve("/" + "/".join([*parts, *rel[:-1]])) + [rel[-1]]
                mode = chmod if chmod is not None else m.mode
                if m.isdir():
                    os.close(self.dir_fd(where, owner, mode))
                    continue
                pfd = self.dir_fd(where[:-1], owner)
                try:
                    if self._clear(pfd, where[-1], keep_dir=False):
                        raise self.fail(f"ADD {archive.name}: {m.name} would replace a directory")
                    if m.issym():
                        os.symlink(m.linkname, where[-1], dir_fd=pfd)
                        os.chown(where[-1], *owner, dir_fd=pfd, follow_symlinks=False)
                    elif m.isfile() or m.islnk():
                        data = tar.extractfile(m)
                        assert data is not None
                        fd = os.open(where[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                     0o600, dir_fd=pfd)
                        try:
                            while chunk := data.read(1 << 20):
                                os.write(fd, chunk)
                            os.fchown(fd, *owner)
                            os.fchmod(fd, mode)
                        finally:
                            os.close(fd)
                finally:
                    os.close(pfd)

    def chown_tree(self, parts: list[str], owner: tuple[int, int]) -> None:
        """Give the layer's directory ``parts`` and all below it to ``owner``; no symlink is
        followed (``fwalk`` over descriptors, ``lchown``)."""
        fd = self.dir_fd(parts, owner)
        try:
            os.fchown(fd, *owner)
            for _root, dirs, files, rfd in os.fwalk(".", dir_fd=fd):
                for n in dirs + files:
                    os.chown(n, *owner, dir_fd=rfd, follow_symlinks=False)
        finally:
            os.close(fd)


    # ---- reads of the merged view (COPY --from a stage) ----
    def names(self, parts: list[str]) -> list[str]:
        """The entries of the directory ``parts`` (resolved) in the merged view."""
        seen: set[str] = set()
        fd, opaque = self._open_dirs(self.layer, parts)
        if fd is not None:
            seen.update(os.listdir(fd))  # noqa: PTH208
            os.close(fd)
        if not any(opaque):
            for lower in self.lowers:
                lfd, _ = self._open_dirs(lower, parts)
                if lfd is not None:
                    seen.update(os.listdir(lfd))  # noqa: PTH208
                    os.close(lfd)
        return sorted(n for n in seen if self.lstat([*parts, n]) is not None)

    def export(self, parts: list[str], dest: Path) -> None:
        """Copy the entry ``parts`` of the merged view (its path resolved) to the host path
        ``dest``: directories, regular files (content and mode) and symbolic links; other
        kinds are skipped. Owners are not kept (``COPY --from`` makes root's files)."""
        found = self._find(parts) if parts else None
        if parts and found is None:
            raise self.fail(f"/{'/'.join(parts)} does not exist in that stage")
        mode = 0o755
        if found is not None:
            st, fd, _src = found
            mode = stat.S_IMODE(st.st_mode)
            try:
                if stat.S_ISLNK(st.st_mode):
                    dest.symlink_to(os.readlink(parts[-1], dir_fd=fd))
                    return
                if stat.S_ISREG(st.st_mode):
                    rfd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    with os.fdopen(rfd, "rb") as src, open(dest, "xb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
                    dest.chmod(mode)
                    return
                if not stat.S_ISDIR(st.st_mode):
                    return
            finally:
                os.close(fd)
        dest.mkdir()
        for name in self.names(parts):
            self.export([*parts, name], dest / name)
        dest.chmod(mode)


class _Builder:
    """Builds one stage of a Dockerfile: a layer over its base (a stage that starts ``FROM``
    another starts from a copy of that one's layer)."""

    def __init__(self, spec: BuildSpec, df: Dockerfile, stage: Stage, base: Image, out: Path, config: BwrapConfig,
                 *, stages: dict[int, _Builder] | None = None, parent: _Builder | None = None,
                 ref: BaseRef | None = None):
        self.spec = spec
        self.df = df
        self.stage = stage
        self.dfname = str(spec.dockerfile)
        self.context = spec.context.resolve()
        self.base = base
        self.out = out
        self.config = config
        self.layer = out / "layer"
        self.stages = stages if stages is not None else {}
        """The stages built so far, for ``COPY --from``."""
        self.parent = parent
        self.ref = ref
        """What the stage's FROM resolved to: the named image's env, workdir, dirs and links
        (a language image's conventions) start the stage."""
        self.env: dict[str, str] = dict(parent.env) if parent else dict(ref.env if ref else ())
        self.workdir: str = parent.workdir if parent else (ref.workdir if ref and ref.workdir else "/")
        self.user: str | None = parent.user if parent else None
        self.log: list[str] = []
        self.network = bool(availability()["available"])
        """Whether RUN steps get a network: the sandboxes' user-mode networking (network.py),
        never the host's namespace; without pasta and nft, RUN steps have loopback only."""

    def digest(self) -> str:
        h = hashlib.sha256(f"{BUILDER} {self.base.hash} uid_base={self.config.uid_base}".encode())
        if self.parent is not None:
            h.update(f" from {self.parent.digest()}".encode())
        elif self.ref is not None and (self.ref.env or self.ref.dirs or self.ref.links or self.ref.workdir):
            h.update(repr((self.ref.env, self.ref.dirs, self.ref.links, self.ref.workdir)).encode())
        for step in self.stage.steps:
            h.update(repr(step).encode())
            if isinstance(step, Copy) and step.stage is not None:
                h.update(f" stage {self.stages[step.stage].digest()}".encode())
            elif isinstance(step, Copy) and step.image is None:
                for pat in step.sources:
                    for _name, src in _sources(self.context, pat, self.dfname, step.line):
                        _hash_tree(h, src)
        return h.hexdigest()[:32]

    def tree(self, line: int) -> _Tree:
        return _Tree(self.layer, self.base.lowers, self.config, (self.dfname, line))

    def owner(self, spec: str | None, line: int) -> tuple[int, int]:
        """Host owner of what ``COPY --chown=spec`` writes: sandbox uid N is host uid
        ``uid_base + N``; root (the default) is ``uid_base``; any other named user is the
        sandbox's ``agent``."""
        if not spec:
            return self.config.host_uid(ROOT_UID), self.config.host_uid(ROOT_UID)
        user, _, group = spec.partition(":")

        def one(x: str) -> int:
            if x.isdigit():
                if int(x) >= SANDBOX_UIDS:
                    raise ImageBuildError(f"--chown={spec}: uid {x} is outside the sandbox's uids "
                                          f"0..{SANDBOX_UIDS - 1}", file=self.dfname, line=line)
                return self.config.host_uid(int(x))
            return self.config.host_uid(ROOT_UID if x in ("", "root") else AGENT_UID)
        return one(user), one(group or user)

    def _from_sources(self, step: Copy, staging: Path) -> list[tuple[str, Path]]:
        """``COPY --from``: the sources, exported from the stage (or taken from the tool's
        package) into ``staging``, as (name, host path)."""
        out: list[tuple[str, Path]] = []
        if step.image is not None:
            folder = tool_tree(step.image, self.base.arch, cache_dir(), file=self.dfname, line=step.line)
            for src in step.sources:
                name = tool_path(step.image, src, file=self.dfname, line=step.line)
                out.append((src.rstrip("/").rsplit("/", 1)[-1] or name, folder / name))
            return out
        assert step.stage is not None
        other = self.stages[step.stage]
        tree = other.tree(step.line)
        tree.file, tree.line = self.dfname, step.line
        for i, src in enumerate(step.sources):
            head, _, last = src.rstrip("/").rpartition("/")
            if any(c in last for c in "*?["):
                parent = tree.resolve(head or "/")
                matches = [n for n in tree.names(parent) if fnmatch.fnmatchcase(n, last)]
                if not matches:
                    raise tree.fail(f"COPY --from: {src} matches nothing in that stage")
                entries = [([*parent, n], n) for n in matches]
            else:
                parts = tree.resolve(src)
                entries = [(parts, parts[-1] if parts else "root")]
            for j, (parts, name) in enumerate(entries):
                where = staging / f"{i}-{j}"
                where.mkdir(parents=True)
                tree.export(parts, where / name)
                out.append((name, where / name))
        return out

    def copy(self, step: Copy) -> None:
        staging = None
        if step.stage is not None or step.image is not None:
            staging = Path(tempfile.mkdtemp(prefix="from-", dir=self.out))
            srcs = self._from_sources(step, staging)
        else:
            srcs = [s for p in step.sources for s in _sources(self.context, p, self.dfname, step.line)]
        try:
            self._copy(step, srcs)
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)

    def _copy(self, step: Copy, srcs: list[tuple[str, Path]]) -> None:
        tree = self.tree(step.line)
        owner = self.owner(step.chown, step.line)
        chmod = None
        if step.chmod:
            try:
                chmod = int(step.chmod, 8) & 0o7777
            except ValueError:
                raise tree.fail(f"--chmod={step.chmod} is not an octal mode") from None
        dest = tree.resolve(step.dest)
        dest_st = tree.lstat(dest)
        as_dir = (step.dest.endswith("/") or len(srcs) > 1 or srcs[0][1].is_dir()
                  or (dest_st is not None and stat.S_ISDIR(dest_st.st_mode)))
        for name, src in srcs:
            if src.is_dir():  # its content goes into dest
                tree.into(dest, src, owner, chmod)
            elif step.add and tarfile.is_tarfile(src):
                tree.untar(dest, src, owner, chmod)
            elif as_dir:
                tree.put([*dest, name], src, owner, chmod)
            else:
                if not dest:
                    raise tree.fail("can't copy a file over /")
                tree.put(dest, src, owner, chmod)

    def workdir_step(self, step: Workdir) -> None:
        """WORKDIR: made where missing, owned by the USER in force (as BuildKit does), else root."""
        self.workdir = step.path
        tree = self.tree(step.line)
        owner = self.owner(None, step.line)
        if self.user and self.user.split(":", 1)[0] not in ("root", "0"):
            owner = self.user_ids(tree, self.user) or owner
        tree.mkdirs(step.path, owner)

    def user_ids(self, tree: _Tree, spec: str) -> tuple[int, int] | None:
        """Host owner of the image user ``spec`` (``name[:group]`` or numbers), from the image's
        /etc/passwd and /etc/group; None when it can't be found there."""
        def table(name: str) -> dict[str, list[str]]:
            found = tree._find(["etc", name])
            if found is None or not stat.S_ISREG(found[0].st_mode):
                if found is not None:
                    os.close(found[1])
                return {}
            st, dfd, _src = found
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            finally:
                os.close(dfd)
            with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
                rows = [line.rstrip("\n").split(":") for line in f if ":" in line]
            return {r[0]: r for r in rows if len(r) > 3}

        user, _, group = spec.partition(":")
        passwd = table("passwd")
        if user.isdigit():
            uid, gid = int(user), 0
            for row in passwd.values():
                if row[2] == user:
                    gid = int(row[3]) if row[3].isdigit() else 0
        elif user in passwd and passwd[user][2].isdigit():
            uid, gid = int(passwd[user][2]), int(passwd[user][3]) if passwd[user][3].isdigit() else 0
        else:
            return None
        if group:
            groups = table("group")
            if group.isdigit():
                gid = int(group)
            elif group in groups and groups[group][2].isdigit():
                gid = int(groups[group][2])
        if uid >= SANDBOX_UIDS or gid >= SANDBOX_UIDS:
            return None
        return self.config.host_uid(uid), self.config.host_uid(gid)

    def run(self, step: Run, deadline: float) -> None:
        argv = list(step.argv) if step.argv else [*(step.via or ("/bin/sh", "-c")), step.shell or ""]
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8",
               **build_env(), **dict(step.build_args), **self.env}
        if self.user and self.user.split(":", 1)[0] not in ("root", "0"):
            argv = ["/bin/sh", "-c", AS_USER, "as-user", self.user, *argv]  # Docker runs RUN as USER
        self.tree(step.line).mkdirs(self.workdir, self.owner(None, step.line))  # a step may have removed it
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ImageBuildError("build timed out", file=self.dfname, line=step.line)
        try:
            slot = uids.take_slot(self.config)  # host uids of its own while the step runs
        except SandboxError as e:
            raise ImageBuildError(f"RUN: {e}", file=self.dfname, line=step.line) from None
        net = StepNetwork(self.out / "net", uid=helper_uid(self.config, slot.base)) if self.network else None
        cmd = build_command(self.out, self.layer, self.base.lowers, argv, env=env, cwd=self.workdir,
                            config=self.config, network=net, tmp_files=build_files(), slot=slot)
        try:
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  pass_fds=net.pass_fds if net else ()) as popen:
                try:
                    if net is not None:
                        net.start(popen.pid)
                    stdout, stderr = popen.communicate(timeout=remaining)
                except BaseException:
                    popen.kill()
                    raise
            proc = subprocess.CompletedProcess(cmd, popen.returncode, stdout, stderr)
        except subprocess.TimeoutExpired:
            raise ImageBuildError(f"RUN timed out after the build timeout "
                                  f"({self.spec.timeout_s:.0f}s)", file=self.dfname, line=step.line) from None
        except SandboxError as e:
            raise ImageBuildError(f"RUN: {e}", file=self.dfname, line=step.line) from None
        finally:
            if net is not None:
                net.close()
            slot.release()  # the step's processes are gone: its launcher was reaped above
        after = layer_next(self.layer)
        if after.exists():  # the step ran over a copy of the layer: its result replaces the layer
            shutil.rmtree(self.layer)
            after.rename(self.layer)
        out = (proc.stdout + proc.stderr).decode(errors="replace")
        self.log.append(f"--- line {step.line}: {' '.join(argv)}\n{out}")
        if proc.returncode != 0:
            hint = ""
            failed_install = install_failure(" ".join(step.argv) if step.argv else step.shell or "", out,
                                             network=self.network)
            if failed_install:
                hint = f" ({failed_install})"
            elif any(w in out for w in ("Could not resolve", "Temporary failure in name resolution",
                                        "Network is unreachable", "Failed to establish")):
                hint = " (the step needs the internet, which this build can't reach)"
            elif "sandfleet-agent launch:" in out:
                hint = " (the build sandbox could not start)"
            elif self.base.is_host and any(w in out for w in ("Permission denied", "Read-only file system",
                                                               "are you root", "Operation not permitted")):
                hint = (" (this image is layered over the host's own /, whose files a build step can read "
                        "but not change: apt-get or pip install into system directories needs a Debian "
                        "base, built once with: sandfleet image build)")
            raise ImageBuildError(f"RUN exited with {proc.returncode}{hint}: {out.strip()[-800:]}",
                                  file=self.dfname, line=step.line)

    def start(self) -> None:
        """Make the layer: empty, or a copy of the parent stage's (owners, modes, overlay
        whiteouts and opaque marks kept)."""
        if self.parent is None:
            self.layer.mkdir(parents=True)
            os.chown(self.layer, *self.owner(None, 0))  # the image's / belongs to its root
            self._conventions()
            return
        self.out.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["cp", "-a", "--preserve=all", "--", str(self.parent.layer), str(self.layer)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ImageBuildError(f"could not start stage {self.stage.name or self.stage.index} from its parent: "
                                  f"{proc.stderr.strip()[-300:]}", file=self.dfname, line=self.stage.base.line)

    def _conventions(self) -> None:
        """The named image's directories (world-writable with the sticky bit, as ``$GOPATH``
        is in the golang image) and its symlinks to where Debian's packages put things."""
        if self.ref is None:
            return
        tree = self.tree(self.stage.base.line)
        root = self.owner(None, 0)
        for d in self.ref.dirs:
            os.close(tree.dir_fd(tree.resolve(d), root, 0o1777))
        for path, target in self.ref.links:
            *parent, name = tree.resolve(path, follow_last=False)
            fd = tree.dir_fd(parent, root)
            try:
                os.symlink(target.replace("{arch}", self.base.arch), name, dir_fd=fd)
                os.chown(name, *root, dir_fd=fd, follow_symlinks=False)
            finally:
                os.close(fd)

    def build(self, deadline: float) -> dict[str, object]:
        self.start()
        for step in self.stage.steps:
            if isinstance(step, From):
                continue
            if isinstance(step, Copy):
                self.copy(step)
            elif isinstance(step, Workdir):
                self.workdir_step(step)
            elif isinstance(step, Env):
                self.env.update(dict(step.values))
            elif isinstance(step, User):
                self.user = step.user
            elif isinstance(step, Run):
                self.run(step, deadline)
        return {"workdir": self.workdir, "env": self.env, "user": self.user}

    def finish(self) -> dict[str, object]:
        """The final stage: the workdir goes to the non-root ``agent`` that stands in for
        Docker's root when the Dockerfile names no USER; with a USER, owners stay as built
        (the agent runs as that user, as in Docker). What the image records."""
        workdir = self.df.workdir or self.spec.workdir
        tree = self.tree(0)
        if not self.df.user:
            agent = self.config.host_uid(AGENT_UID)
            tree.chown_tree(tree.resolve(workdir), (agent, agent))  # the agent works here
        else:
            tree.mkdirs(workdir, self.owner(None, 0))
        return {"workdir": workdir, "env": self.env, "user": self.df.user,
                "dockerfile": self.dfname, "notes": list(self.df.notes), "uid_base": self.config.uid_base}


# Run a RUN step as the Dockerfile's USER, as Docker does: a name or uid, ":group" optional;
# the user's primary group (0 where it has no passwd entry), its supplementary groups, its HOME.
AS_USER = r"""
spec=$1; shift
user=${spec%%:*}; group=; case $spec in *:*) group=${spec#*:} ;; esac
entry=$(getent passwd "$user" || true)
if [ -n "$entry" ]; then uid=$(echo "$entry" | cut -d: -f3); gid=$(echo "$entry" | cut -d: -f4)
  name=$(echo "$entry" | cut -d: -f1); HOME=$(echo "$entry" | cut -d: -f6)
else
  case $user in *[!0-9]*|'') echo "unable to find user $user: no matching entries in passwd file" >&2; exit 1 ;; esac
  uid=$user; gid=0; name=; HOME=/
fi
if [ -n "$group" ]; then
  case $group in *[!0-9]*) gid=$(getent group "$group" | cut -d: -f3)
    [ -n "$gid" ] || { echo "unable to find group $group" >&2; exit 1; } ;; *) gid=$group ;; esac
fi
export HOME
if [ -n "$name" ]; then exec setpriv --reuid="$uid" --regid="$gid" --init-groups -- "$@"; fi
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups -- "$@"
"""


def _du(path: Path) -> int:
    total = 0
    for _root, _dirs, files, rfd in os.fwalk(path):
        for n in files:
            try:
                total += os.stat(n, dir_fd=rfd, follow_symlinks=False).st_blocks * 512
            except OSError:
                pass
    return total


def build_image(spec: BuildSpec, config: BwrapConfig | None = None, *, strict: bool = False,
                report: dict[str, object] | None = None, accept_older: bool = False) -> Image:
    """Build (or find in the cache) the image ``spec`` describes; blocking. Every stage the final
    one needs is built (BuildKit's order); the image is the final stage's layer over its base.
    ``strict``: a substituted base (``--strict-bases``) raises instead of being recorded in
    the image's ``warnings``. ``accept_older`` (``--accept-older-versions``): a language base
    asking for a version newer than Debian ships is built with the newest there is.
    ``report["built"]`` says whether this call built it (False:
    found in the cache, also when another call built it while this one waited)."""
    config = config or BwrapConfig()
    df = parse_dockerfile(spec.dockerfile, arch=arch())
    dfname = str(spec.dockerfile)
    scratch.reap(images_dir())
    tmp_out = scratch.scratch_dir(images_dir(), ".build-")
    builders: dict[int, _Builder] = {}
    refs: dict[int, BaseRef] = {}
    for i in df.needed_stages():
        stage = df.stages[i]
        if stage.parent is not None:
            parent = builders[stage.parent]
            refs[i] = refs[stage.parent]
            builders[i] = _Builder(spec, df, stage, parent.base, tmp_out / f"stage-{i}", config,
                                   stages=builders, parent=parent)
            continue
        refs[i] = resolve_base(stage.base.image, strict=strict, accept_older=accept_older, file=dfname,
                               line=stage.base.line)
        base = base_image_for(refs[i], file=dfname, line=stage.base.line)
        if strict and base.meta.get("warnings"):
            raise ImageBuildError(f"{'; '.join(map(str, base.meta['warnings']))}; refused by --strict-bases",  # type: ignore[call-overload]
                                  file=dfname, line=stage.base.line)
        builders[i] = _Builder(spec, df, stage, base, tmp_out / f"stage-{i}", config, stages=builders,
                               ref=refs[i])
    last = len(df.stages) - 1
    final, ref = builders[last], refs[last]
    final.out, final.layer = tmp_out, tmp_out / "layer"
    digest = final.digest()
    image_dir = images_dir() / digest
    with open(images_dir() / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for img in list_images():
            if img.hash == digest:
                shutil.rmtree(tmp_out, ignore_errors=True)
                return img
        shutil.rmtree(image_dir, ignore_errors=True)
        t0 = time.monotonic()
        deadline = t0 + spec.timeout_s
        try:
            for builder in builders.values():
                builder.build(deadline)
            meta = final.finish()
        except BaseException:
            shutil.rmtree(tmp_out, ignore_errors=True)
            raise
        (tmp_out / "build.log").write_text("\n".join(line for b in builders.values() for line in b.log))
        for i in builders:
            if i != last:
                shutil.rmtree(tmp_out / f"stage-{i}", ignore_errors=True)
        for junk in ("scratch", *(p.name for p in tmp_out.glob("lower*"))):
            try:
                (tmp_out / junk).rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno != errno.ENOTEMPTY:
                    raise
        tmp_out.rename(image_dir)
        base = final.base
        warnings = [*([ref.note] if ref.substituted and ref.note else []), *map(str, base.meta.get("warnings") or [])]  # type: ignore[call-overload]
        meta.update(spec.meta)
        meta.update(build_s=round(time.monotonic() - t0, 3), layer_bytes=_du(image_dir / "layer"),
                    base_ref=ref.image, base_used=ref.describe(), base_image=base.name, warnings=warnings,
                    base_kind=ref.kind, base_asked=ref.asked, base_got=ref.got,
                    python=base.meta.get("python"), missing_packages=base.meta.get("missing_packages") or [],
                    stages=len(builders))
        image = Image(name=spec.name, lowers=[image_dir / "layer", *base.lowers], arch=base.arch,
                      page_size=base.page_size, hash=digest, base=base.name, meta=meta)
        save_image(image)
        if report is not None:
            report["built"] = True
        log.info("built image %s (%s) in %.1fs", digest[:12], spec.name, meta["build_s"])
        return image


def describe(image: Image) -> str:
    return json.dumps(image.to_json(), indent=2)
