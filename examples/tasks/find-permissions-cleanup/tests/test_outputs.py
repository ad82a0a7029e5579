import os
import stat
import sys

sys.path.insert(0, "/tests")
from gen_site import plan  # noqa: E402

ROOT = "/app/site"
CUTOFF = 1704067200  # 2024-01-01T00:00:00Z


def expected_files():
    dirs, files, dmodes = plan()
    keep, gone = {}, set()
    for path, size, mode, mtime in files:
        if path.endswith(".tmp") and mtime < CUTOFF:
            gone.add(path)
        else:
            keep[path] = (size, 0o755 if path.endswith(".sh") else mode & ~0o002, mtime)
    return dirs, dmodes, keep, gone


def test_deleted_and_kept():
    _, _, keep, gone = expected_files()
    for p in gone:
        assert not os.path.lexists(os.path.join(ROOT, p)), p
    for p, (size, mode, mtime) in keep.items():
        full = os.path.join(ROOT, p)
        assert os.path.isfile(full), p
        st = os.stat(full)
        assert st.st_size == size, p
        assert int(st.st_mtime) == mtime, p


def test_modes():
    dirs, dmodes, keep, _ = expected_files()
    for p, (size, mode, mtime) in keep.items():
        assert stat.S_IMODE(os.stat(os.path.join(ROOT, p)).st_mode) == mode, (p, oct(mode))
    for d, m in dmodes.items():
        assert stat.S_IMODE(os.stat(os.path.join(ROOT, d)).st_mode) == m & ~0o002, d
    for dirpath, dirnames, filenames in os.walk(ROOT):
        for n in dirnames + filenames + [""]:
            assert not os.stat(os.path.join(dirpath, n)).st_mode & 0o002, os.path.join(dirpath, n)


def test_no_extra_files():
    _, _, keep, _ = expected_files()
    found = set()
    for dirpath, _, filenames in os.walk(ROOT):
        for n in filenames:
            found.add(os.path.relpath(os.path.join(dirpath, n), ROOT))
    assert found == set(keep)


def test_large_files_list():
    _, _, keep, _ = expected_files()
    exp = sorted((p for p, (size, _, _) in keep.items() if size > 10240), key=lambda s: s.encode())
    assert exp
    assert open("/app/large_files.txt").read() == "".join(p + "\n" for p in exp)
