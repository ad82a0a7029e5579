#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
p = "invoice.py"
s = open(p).read()
start = s.index("import json")
end = s.index('if __name__ == "__main__":')
s = s[:start] + '''import json
import sys
from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")


def cents(x):
    return x.quantize(CENT, rounding=ROUND_HALF_UP)


def money(x):
    return f"{x:.2f}"


def compute(invoice):
    out_lines = []
    net_total = tax_total = Decimal(0)
    for line in invoice["lines"]:
        net = cents(Decimal(line["qty"]) * Decimal(line["unit_price"]))
        tax = cents(net * Decimal(line["tax_rate"]))
        net_total += net
        tax_total += tax
        out_lines.append({"sku": line["sku"], "net": money(net), "tax": money(tax)})
    return {"lines": out_lines, "net": money(net_total), "tax": money(tax_total),
            "gross": money(net_total + tax_total)}


''' + s[end:]
open(p, "w").write(s)
PY
python3 invoice.py sample_invoice.json
