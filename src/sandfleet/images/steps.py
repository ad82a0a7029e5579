"""One stage of a Dockerfile, built: :class:`StageBuilder` applies COPY/ADD, WORKDIR, ENV and
USER itself (through :class:`~sandfleet.images.layerfs.LayerTree`) and runs RUN steps rootless
(:mod:`sandfleet.images.run`) over a copy of the layer; its :meth:`~StageBuilder.digest` is what
images are cached by (the base, every step, the content of copied files).
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from sandfleet.agent.build import cache_dir
from sandfleet.errors import ImageBuildError, SandboxError
from sandfleet.images.bases import BaseRef
from sandfleet.images.dockerfile import Copy, Dockerfile, Env, From, Run, Stage, User, Workdir
from sandfleet.images.layerfs import LayerTree
from sandfleet.images.mirrors import build_env, build_files, install_failure
from sandfleet.images.run import build_command, layer_next
from sandfleet.images.spec import BuildSpec
from sandfleet.images.tools import tool_path, tool_tree
from sandfleet.imagestore import Image
from sandfleet.sandbox import uids
from sandfleet.sandbox.network import StepNetwork, helper_uid
from sandfleet.sandbox.spec import AGENT_UID, ROOT_UID, SANDBOX_UIDS, BwrapConfig

BUILDER = "sandfleet-image/3"
"""Part of every image hash: bump it when what a build produces changes (3: shifted owners)."""


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


class StageBuilder:
    """Builds one stage of a Dockerfile: a layer over its base (a stage that starts ``FROM``
    another starts from a copy of that one's layer)."""

    def __init__(self, spec: BuildSpec, df: Dockerfile, stage: Stage, base: Image, out: Path, config: BwrapConfig,
                 *, stages: dict[int, StageBuilder] | None = None, parent: StageBuilder | None = None,
                 ref: BaseRef | None = None, network: bool = False):
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
        self.network = network
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

    def tree(self, line: int) -> LayerTree:
        return LayerTree(self.layer, self.base.lowers, self.config, (self.dfname, line))

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

    def user_ids(self, tree: LayerTree, spec: str) -> tuple[int, int] | None:
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
