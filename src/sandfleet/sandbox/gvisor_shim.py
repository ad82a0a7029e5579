"""The gvisor backend's statx shim, as an image layer (docs/security.md, "gVisor: the platform,
and what Debian's runsc lacks").

Debian's runsc 0.0~20221219 answers EINVAL to ``statx`` and ``fstatat`` called with
``AT_NO_AUTOMOUNT``, which coreutils' ``ls DIR``, ``ls -l`` and ``stat`` always pass (a flag
that matters only on automount points, and a sandbox has none). ``gvisor_statx.c`` drops the
flag; this module builds it once into a small layer that every gvisor sandbox gets on top of
its image: ``/usr/lib/sandfleet/gvisor-statx.so`` and an ``/etc/ld.so.preload`` naming it, so
every dynamically linked program loads it (statically linked ones still see the EINVAL).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from sandfleet.agent.build import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("gvisor_statx.c")
SHIM = "/usr/lib/sandfleet/gvisor-statx.so"


@functools.cache
def statx_layer(root_uid: int, dir_uid: int) -> Path | None:
    """The layer (built once per source and owners, in the cache): its root directory owned by
    host uid ``root_uid`` (the sandbox's root, as a writable layer's is), ``/etc`` and ``/usr``
    and the files by ``dir_uid`` (host root over the host's own root: its directories stay
    nobody's inside, as on bwrap; the sandbox's root over a base image, which it owns). None,
    with a warning, where there is no C compiler: ``ls DIR`` then fails inside."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        log.warning("no C compiler: gvisor sandboxes go without the statx shim (ls DIR, stat fail in them)")
        return None
    digest = hashlib.sha256(SOURCE.read_bytes() + f"{root_uid}:{dir_uid}".encode()).hexdigest()[:16]
    layer = cache_dir() / "gvisor-shim" / digest
    if layer.is_dir():
        return layer
    layer.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest}.", dir=layer.parent))
    try:
        so = tmp / SHIM.lstrip("/")
        so.parent.mkdir(parents=True)
        cmd = [cc, "-O2", "-shared", "-fPIC", "-o", str(so), str(SOURCE)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            log.warning("building the gvisor statx shim failed (%s): %s", " ".join(cmd), p.stderr[-1000:])
            return None
        (tmp / "etc").mkdir()
        (tmp / "etc/ld.so.preload").write_text(SHIM + "\n")
        for path in [tmp, *tmp.rglob("*")]:
            os.lchown(path, *(2 * [root_uid if path == tmp else dir_uid]))
            path.chmod(0o755 if path.is_dir() or path == so else 0o644)
        try:
            tmp.rename(layer)
        except OSError:  # another process made it meanwhile
            if not layer.is_dir():
                raise
        return layer
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
