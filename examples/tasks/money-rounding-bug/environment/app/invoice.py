#!/usr/bin/env python3
"""Compute invoice totals.

Usage: python3 invoice.py INVOICE.json

The input is a JSON object {"lines": [{"sku": str, "qty": str, "unit_price": str,
"tax_rate": str}, ...]} where qty, unit_price and tax_rate are decimal numbers
written as strings (e.g. "3", "19.99", "0.075").

For every line:
    net = qty * unit_price, rounded to cents (0.01) with ROUND_HALF_UP
    tax = net * tax_rate,   rounded to cents (0.01) with ROUND_HALF_UP
Totals are the exact sums of the rounded line values; gross = net + tax.

Output (stdout) is JSON with all money amounts as strings with exactly two
decimals:
    {"lines": [{"sku": ..., "net": "59.97", "tax": "4.50"}, ...],
     "net": "...", "tax": "...", "gross": "..."}
"""
import json
import sys


def money(x):
    return f"{round(x, 2):.2f}"


def compute(invoice):
    out_lines = []
    net_total = tax_total = 0.0
    for line in invoice["lines"]:
        net = round(float(line["qty"]) * float(line["unit_price"]), 2)
        tax = round(net * float(line["tax_rate"]), 2)
        net_total += net
        tax_total += tax
        out_lines.append({"sku": line["sku"], "net": money(net), "tax": money(tax)})
    return {"lines": out_lines, "net": money(net_total), "tax": money(tax_total),
            "gross": money(net_total + tax_total)}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(compute(json.load(f)), indent=2))
