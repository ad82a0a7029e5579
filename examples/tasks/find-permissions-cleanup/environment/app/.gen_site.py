"""Deterministically generate the /app/site tree (used at build time and by the tests)."""
import os
import random
import sys

OLD = 1577880000      # 2020-01-01
NEW = 1717200000      # 2024-06-01


def plan():
    rng = random.Random(2024)
    dirs = ["", "bin", "scripts", "scripts/deploy", "www", "www/img", "www/my docs", "cache", "logs", "tmp area"]
    files = []
    for i in range(70):
        d = rng.choice(dirs)
        ext = rng.choice([".sh", ".sh", ".txt", ".html", ".tmp", ".tmp", ".log", ".bak", ".conf"])
        name = rng.choice(["run", "data", "index", "notes", "my file", "build", "report", "x"]) + f"{i}" + ext
        size = rng.choice([0, 10, 500, 4096, 10239, 10240, 10241, 20000, 65536])
        mode = rng.choice([0o644, 0o664, 0o666, 0o600, 0o755, 0o777, 0o640, 0o646])
        mtime = rng.choice([OLD, NEW, OLD + 86400 * 300, NEW + 86400])
        files.append((os.path.join(d, name), size, mode, mtime))
    dmodes = {d: rng.choice([0o755, 0o775, 0o777, 0o757]) for d in dirs if d}
    return dirs, files, dmodes


def build(root):
    dirs, files, dmodes = plan()
    for d in dirs:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for path, size, mode, mtime in files:
        p = os.path.join(root, path)
        with open(p, "wb") as f:
            f.write((path.encode() * (size // max(1, len(path)) + 1))[:size])
        os.chmod(p, mode)
        os.utime(p, (mtime, mtime))
    for d, m in dmodes.items():
        os.chmod(os.path.join(root, d), m)


if __name__ == "__main__":
    build(sys.argv[1])
