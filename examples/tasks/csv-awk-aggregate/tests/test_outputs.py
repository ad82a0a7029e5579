import os
import random
import subprocess
import tempfile
from collections import defaultdict

import pytest

SCRIPT = "/app/aggregate.sh"


def expected(text):
    agg = defaultdict(lambda: [0, 0, 0])
    for line in text.splitlines()[1:]:
        if not line.strip():
            continue
        date, region, product, units, price = line.split(",")
        r = region.strip().lower()
        cents = int(round(float(price) * 100))
        agg[r][0] += 1
        agg[r][1] += int(units)
        agg[r][2] += int(units) * cents
    rows = sorted(agg.items(), key=lambda kv: (-kv[1][2], kv[0]))
    out = ["region,orders,units,revenue"]
    for r, (o, u, c) in rows:
        out.append(f"{r},{o},{u},{c // 100}.{c % 100:02d}")
    return "\n".join(out) + "\n"


def run(path):
    r = subprocess.run(["bash", "-c", f'"{SCRIPT}" "$1"', "x", path], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_executable():
    assert os.access(SCRIPT, os.X_OK)


def test_provided_data():
    assert run("/app/data/sales.csv") == expected(open("/app/data/sales.csv").read())


def gen(seed, n):
    rng = random.Random(seed)
    names = ["alpha", "beta", "gamma", "delta zone", "eps"]
    lines = ["date,region,product,units,unit_price"]
    for i in range(n):
        r = rng.choice(names)
        if rng.random() < 0.3:
            r = "  " + r.title() + "\t"
        lines.append(f"2023-01-{rng.randint(1, 28):02d},{r},p{rng.randint(1, 9)},{rng.randint(1, 99)},{rng.randint(1, 99999) / 100:.2f}")
        if rng.random() < 0.1:
            lines.append("")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed,n", [(1, 5), (2, 200), (3, 1500)])
def test_hidden_data(seed, n):
    d = tempfile.mkdtemp()
    p = os.path.join(d, "in put.csv")
    text = gen(seed, n)
    open(p, "w").write(text)
    assert run(p) == expected(text)
    assert open(p).read() == text


def test_tie_break():
    d = tempfile.mkdtemp()
    p = os.path.join(d, "tie.csv")
    text = "date,region,product,units,unit_price\n2024-01-01,b,x,1,5.00\n2024-01-01,a,x,2,2.50\n2024-01-02,c,x,1,9.99\n"
    open(p, "w").write(text)
    assert run(p) == "region,orders,units,revenue\nc,1,1,9.99\na,1,2,5.00\nb,1,1,5.00\n"
