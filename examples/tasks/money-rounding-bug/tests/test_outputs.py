import json
import os
import random
import subprocess
import tempfile
from decimal import ROUND_HALF_UP, Decimal

import pytest

C = Decimal("0.01")


def expected(inv):
    lines, n_tot, t_tot = [], Decimal(0), Decimal(0)
    for l in inv["lines"]:
        net = (Decimal(l["qty"]) * Decimal(l["unit_price"])).quantize(C, ROUND_HALF_UP)
        tax = (net * Decimal(l["tax_rate"])).quantize(C, ROUND_HALF_UP)
        n_tot += net
        t_tot += tax
        lines.append({"sku": l["sku"], "net": f"{net:.2f}", "tax": f"{tax:.2f}"})
    return {"lines": lines, "net": f"{n_tot:.2f}", "tax": f"{t_tot:.2f}", "gross": f"{n_tot + t_tot:.2f}"}


def run(inv):
    p = os.path.join(tempfile.mkdtemp(), "inv.json")
    json.dump(inv, open(p, "w"))
    r = subprocess.run(["python3", "/app/invoice.py", p], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_sample():
    inv = json.load(open("/app/sample_invoice.json"))
    assert run(inv) == expected(inv)


def test_half_cases():
    inv = {"lines": [{"sku": f"S{i}", "qty": q, "unit_price": p, "tax_rate": t} for i, (q, p, t) in enumerate([
        ("1", "0.125", "0.2"), ("1", "0.135", "0.5"), ("3", "0.335", "0.1"), ("1", "1.015", "0.07"),
        ("10", "0.0045", "0"), ("1", "8.345", "0.15"), ("2", "0.0025", "1"), ("1", "123456789.995", "0.19")])]}
    assert run(inv) == expected(inv)


def test_large_amounts():
    inv = {"lines": [{"sku": "BIG", "qty": "1000000", "unit_price": "98765432.105", "tax_rate": "0.21"},
                     {"sku": "BIG2", "qty": "3", "unit_price": "33333333333.335", "tax_rate": "0.055"}]}
    assert run(inv) == expected(inv)


@pytest.mark.parametrize("seed", range(5))
def test_random(seed):
    rng = random.Random(seed)
    lines = []
    for i in range(rng.randint(1, 30)):
        lines.append({"sku": f"X{i}", "qty": str(rng.randint(1, 50)),
                      "unit_price": f"{rng.randint(0, 99999)}.{rng.randint(0, 999):03d}",
                      "tax_rate": rng.choice(["0", "0.05", "0.075", "0.19", "0.2", "0.125"])})
    inv = {"lines": lines}
    assert run(inv) == expected(inv)


def test_empty():
    assert run({"lines": []}) == {"lines": [], "net": "0.00", "tax": "0.00", "gross": "0.00"}
