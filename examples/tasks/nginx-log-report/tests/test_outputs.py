import json
import os
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, "/tests")
from loggen import expected, gen  # noqa: E402


def run(path):
    r = subprocess.run(["python3", "/app/logreport.py", path], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_provided_log():
    assert run("/app/logs/access.log") == expected(open("/app/logs/access.log").read())


@pytest.mark.parametrize("seed,n", [(1, 3), (2, 500), (3, 5000)])
def test_hidden_logs(seed, n):
    text = gen(seed, n)
    p = os.path.join(tempfile.mkdtemp(), "access.log")
    open(p, "w").write(text)
    assert run(p) == expected(text)


def test_tie_break_and_dash_bytes():
    text = "".join([
        '1.1.1.1 - - [10/Oct/2023:13:55:36 +0000] "GET /b HTTP/1.1" 200 - "-" "x"\n',
        '1.1.1.2 - - [10/Oct/2023:13:55:37 +0000] "GET /a?z=1 HTTP/1.1" 503 10 "-" "x"\n',
        '1.1.1.1 - - [10/Oct/2023:13:55:38 +0000] "POST /c HTTP/1.1" 201 5 "-" "x"\n',
        "\n",
        "not a log line\n",
    ])
    p = os.path.join(tempfile.mkdtemp(), "t.log")
    open(p, "w").write(text)
    assert run(p) == {"total_requests": 3, "malformed_lines": 1, "unique_ips": 2,
                      "status_counts": {"200": 1, "503": 1, "201": 1},
                      "top_paths": [["/a", 1], ["/b", 1], ["/c", 1]],
                      "bytes_sent": 15, "server_errors": 1}
