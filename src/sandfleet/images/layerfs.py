"""The builder's only way to write into an image layer: :class:`LayerTree`.

Layers are stored **shifted** into the sandbox uid range (docs/security.md): a file that
belongs to root in the image is owned by host uid ``uid_base`` on disk, sandbox uid ``N`` by
``uid_base + N``. Everything the builder writes into a layer goes through :class:`LayerTree`,
which resolves paths inside the image (a symlink that a RUN step left resolves against the
image's root, never the host's) and writes with ``O_NOFOLLOW`` and directory descriptors.
Security critical: tests/security/test_build.py.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
from pathlib import Path

from sandfleet.errors import ImageBuildError
from sandfleet.sandbox.spec import SANDBOX_UIDS, BwrapConfig

OPAQUE = "trusted.overlay.opaque"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40


class LayerTree:
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
