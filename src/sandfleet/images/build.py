"""Build environment images without a Docker engine, and without host privileges.

- A **base** is a Debian root filesystem: built with debootstrap (``sandfleet image build``),
  or, when the host itself runs the wanted Debian suite, the host's own root (no build).
- A **task image** is one thin layer over a shared base: the Dockerfile's COPY/ADD, WORKDIR
  and ENV applied by this process, RUN steps executed rootless (:mod:`sandfleet.images.run`)
  over a copy of the layer. Images are cached by a hash of the base and every step (with
  the content of copied files), so rebuilding an unchanged task costs nothing.

What is built is a :class:`~sandfleet.images.spec.BuildSpec` (a Dockerfile, its context, a
name): the builder knows no task. The pieces: :mod:`sandfleet.images.steps` builds one stage,
:mod:`sandfleet.images.layerfs` is the only writer into a layer (shifted owners, no symlink
followed out of the image), and this module orders the stages, caches and records the image.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import time
from pathlib import Path

from sandfleet.errors import ImageBuildError
from sandfleet.images import scratch
from sandfleet.images.bases import BaseRef, resolve_base
from sandfleet.images.debootstrap import base_image_for
from sandfleet.images.dockerfile import parse_dockerfile
from sandfleet.images.spec import BuildSpec
from sandfleet.images.steps import StageBuilder
from sandfleet.imagestore import Image, arch, images_dir, list_images, save_image
from sandfleet.sandbox.network import availability
from sandfleet.sandbox.spec import BwrapConfig

__all__ = ["build_image"]
log = logging.getLogger(__name__)


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
    network = bool(availability()["available"])  # the sandboxes' user-mode networking, or loopback only
    builders: dict[int, StageBuilder] = {}
    refs: dict[int, BaseRef] = {}
    for i in df.needed_stages():
        stage = df.stages[i]
        if stage.parent is not None:
            parent = builders[stage.parent]
            refs[i] = refs[stage.parent]
            builders[i] = StageBuilder(spec, df, stage, parent.base, tmp_out / f"stage-{i}", config,
                                   stages=builders, parent=parent, network=network)
            continue
        refs[i] = resolve_base(stage.base.image, strict=strict, accept_older=accept_older, file=dfname,
                               line=stage.base.line)
        base = base_image_for(refs[i], file=dfname, line=stage.base.line)
        if strict and base.meta.get("warnings"):
            raise ImageBuildError(f"{'; '.join(map(str, base.meta['warnings']))}; refused by --strict-bases",  # type: ignore[call-overload]
                                  file=dfname, line=stage.base.line)
        builders[i] = StageBuilder(spec, df, stage, base, tmp_out / f"stage-{i}", config, stages=builders,
                                   ref=refs[i], network=network)
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
