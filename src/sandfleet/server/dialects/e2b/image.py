"""The image behind E2B's ``base`` template: the service's host image with E2B's users.

E2B templates have a login user ``user`` (uid 1000, HOME /home/user) and root with HOME
/root. The host's own uid-1000 account (whatever its name) would otherwise be who the
sandbox's commands run as, so this image is the host plus one small layer: /etc/passwd and
/etc/group with uid and gid 1000 renamed ``user`` (home /home/user, bash) and root's home
/root. It is made once per host image and passwd, on first use, and registered in the image
cache as ``e2b-base`` (``sandfleet image ls`` shows it).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from sandfleet.imagestore import Image, host_image, images_dir, resolve_image, save_image

NAME = "e2b-base"
SUDO = r"""#!/bin/sh
# sandfleet's E2B base template (server/dialects/e2b/image.py): no sudo, and a clear word why
if [ "$(id -u)" = 0 ]; then
  while [ $# -gt 0 ]; do
    case $1 in --) shift; break;; -u|-g|-p|-C|-h|-U|-r|-t|-T) shift 2;; -*) shift;; *) break;; esac
  done
  [ $# -gt 0 ] && exec "$@"
  exit 0
fi
echo "sudo: not available in sandfleet's E2B sandboxes: a command can't raise its privileges here" \
     "(bubblewrap sets no_new_privs, so no setuid program works); run it as root instead:" \
     "sandbox.commands.run(cmd, user=\"root\") (files: user=\"root\" too)" >&2
exit 1
"""
"""``/usr/bin/sudo`` of the template: E2B's base image gives ``user`` passwordless sudo, which a
bwrap sandbox can't (its processes run with no_new_privs: setuid does nothing). So it says so
and what to do instead, and exits 1; as root it runs the command, as sudo would."""
USER_LINE = "user:x:1000:1000:E2B user:/home/user:/bin/bash"
GROUP_LINE = "user:x:1000:"
_lock = threading.Lock()


def _passwd(text: str) -> str:
    out = []
    for line in text.splitlines():
        f = line.split(":")
        if len(f) >= 7 and (f[0] == "user" or f[2] == "1000"):
            continue
        if len(f) >= 7 and f[2] == "0":
            f[5] = "/root"
            line = ":".join(f)
        out.append(line)
    return "\n".join([*out, USER_LINE]) + "\n"


def _group(text: str) -> str:
    out = [line for line in text.splitlines()
           if not (len(f := line.split(":")) >= 3 and (f[0] == "user" or f[2] == "1000"))]
    return "\n".join([*out, GROUP_LINE]) + "\n"


def _write(path: Path, text: str, owner: int | None, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text)
    tmp.chmod(mode)
    if owner is not None:
        os.chown(tmp, owner, owner)
    tmp.replace(path)


def _root_uid() -> int | None:
    """The host uid of a bwrap sandbox's root: a layer over the host's root is copied into the
    sandbox's writable layer with its owners (``cp -a``), so the layer's directories must be
    the sandbox root's, as a snapshot's are (None where we may not chown: not root)."""
    if os.geteuid() != 0:
        return None
    from sandfleet.sandbox.spec import BwrapConfig

    return BwrapConfig().host_uid(0)


_made: dict[tuple[Any, ...], str] = {}


def base_image() -> str:
    """The name of the E2B base image, made if this host (or its passwd) has none yet; a
    create checks only the stat of /etc/passwd and /etc/group once it is made."""
    try:
        key = tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in map(os.stat, ("/etc/passwd", "/etc/group")))
    except OSError:
        key = ()
    if key and key in _made and (images_dir() / _made[key] / "image.json").is_file():
        return NAME
    digest = _make()
    if key:
        _made[key] = digest
    return NAME


def _make() -> str:
    host = host_image()
    passwd = _passwd(Path("/etc/passwd").read_text())
    group = _group(Path("/etc/group").read_text())
    owner = _root_uid()
    digest = hashlib.sha256(f"e2b-base:{host.hash}:{owner}\0{passwd}\0{group}\0{SUDO}".encode()).hexdigest()[:16]
    d = images_dir() / digest
    with _lock:
        if not (d / "image.json").is_file():
            layer = d / "layer"
            _write(layer / "etc" / "passwd", passwd, owner)
            _write(layer / "etc" / "group", group, owner)
            _write(layer / "usr" / "bin" / "sudo", SUDO, owner, mode=0o755)
            for sub in (layer, layer / "etc", layer / "usr", layer / "usr" / "bin"):
                sub.chmod(0o755)
                if owner is not None:
                    os.chown(sub, owner, owner)
            save_image(Image(name=NAME, lowers=[layer, Path("/")], arch=host.arch, page_size=host.page_size,
                             hash=digest, base="host", meta={"made_by": "sandfleet serve (E2B base template)"}))
    if resolve_image(NAME).hash != digest:  # an older one (another passwd) would win by age: renew it
        os.utime(d / "image.json")
    return digest
