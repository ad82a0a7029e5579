#!/usr/bin/env python3
"""The separate verifier's carry of a workdir full of links (round XVIII's ``link-flood``): how
long ``clean_archive`` (the host's re-pack of the workdir's tar: rollout/verifier.py) takes for
N symbolic links and N regular files, in this process.

``scripts/bench-carry.py [N ...]`` (default 2000 8000 60000): prints one line per N. Before the
links became a set, each member was checked against every link seen so far (quadratic).
"""

from __future__ import annotations

import io
import sys
import tarfile
import time

from sandfleet.rollout.verifier import clean_archive


def archive(n: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for name in ("app", "app/links", "app/files"):
            folder = tarfile.TarInfo(name)
            folder.type = tarfile.DIRTYPE
            tar.addfile(folder)
        for i in range(n):
            link = tarfile.TarInfo(f"app/links/{i}")
            link.type, link.linkname = tarfile.SYMTYPE, "/tmp/c/0"
            tar.addfile(link)
        for i in range(n):
            file = tarfile.TarInfo(f"app/files/{i}")
            file.size = 3
            tar.addfile(file, io.BytesIO(b"abc"))
    return buf.getvalue()


def main() -> int:
    for n in [int(a) for a in sys.argv[1:]] or [2000, 8000, 60000]:
        data = archive(n)
        start = time.perf_counter()
        out = clean_archive(data, ["/app"])
        took = time.perf_counter() - start
        print(f"{n} links + {n} files: clean_archive {took:.2f} s "  # noqa: T201
              f"({len(data)} bytes in, {len(out)} out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
