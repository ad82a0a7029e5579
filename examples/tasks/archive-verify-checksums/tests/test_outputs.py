import hashlib
import os
import sys

sys.path.insert(0, "/tests")
from make_release import contents, sums_and_bad  # noqa: E402

ROOT = "/app/extracted/release"


def test_files_extracted():
    files, assets = contents()
    for n, data in {**files, **assets}.items():
        p = os.path.join(ROOT, n)
        assert os.path.isfile(p), n
        assert hashlib.sha256(open(p, "rb").read()).hexdigest() == hashlib.sha256(data).hexdigest(), n
    assert os.path.isfile(os.path.join(ROOT, "assets.tar.xz"))
    assert open(os.path.join(ROOT, "SHA256SUMS")).read() == sums_and_bad()[0]


def test_bad_files():
    _, bad = sums_and_bad()
    got = open("/app/bad_files.txt").read().splitlines()
    assert got == bad
