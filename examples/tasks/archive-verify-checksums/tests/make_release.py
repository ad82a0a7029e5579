"""Deterministically build /app/incoming/release.tar.gz (build time) and describe it (tests)."""
import hashlib
import io
import os
import random
import sys
import tarfile

MTIME = 1700000000


def contents():
    rng = random.Random(77)
    files = {"README.txt": b"Release 4.2\nVerify with SHA256SUMS before use.\n",
             "bin/tool.sh": b"#!/bin/sh\necho tool\n"}
    for i in range(5):
        files[f"data/part-{i}.csv"] = ("id,value\n" + "".join(f"{j},{rng.randint(0, 999)}\n" for j in range(200))).encode()
    assets = {}
    for i in range(4):
        assets[f"assets/img/pic {i}.bin"] = bytes(rng.randrange(256) for _ in range(3000 + i))
    assets["assets/fonts/mono.dat"] = b"\x00font" * 100
    return files, assets


def sums_and_bad():
    files, assets = contents()
    allf = {**files, **assets}
    lines, bad = [], []
    names = sorted(allf)
    corrupt = {"data/part-3.csv", "assets/img/pic 2.bin"}
    for n in names:
        digest = hashlib.sha256(allf[n]).hexdigest()
        if n in corrupt:
            digest = hashlib.sha256(allf[n] + b"!").hexdigest()
            bad.append(n)
        lines.append(f"{digest}  {n}\n")
    lines.append(f"{hashlib.sha256(b'gone').hexdigest()}  data/part-9.csv\n")
    bad.append("data/part-9.csv")
    return "".join(lines), sorted(bad)


def _add(tar, name, data, mode=0o644):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode = len(data), MTIME, mode
    tar.addfile(ti, io.BytesIO(data))


def build(outdir):
    files, assets = contents()
    sums, _ = sums_and_bad()
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:xz") as t:
        for n in sorted(assets):
            _add(t, n, assets[n])
    os.makedirs(outdir, exist_ok=True)
    with tarfile.open(os.path.join(outdir, "release.tar.gz"), mode="w:gz") as t:
        for n in sorted(files):
            _add(t, "release/" + n, files[n], 0o755 if n.endswith(".sh") else 0o644)
        _add(t, "release/assets.tar.xz", inner.getvalue())
        _add(t, "release/SHA256SUMS", sums.encode())


if __name__ == "__main__":
    build(sys.argv[1])
