#!/usr/bin/env python3
"""Print a payments CSV as an aligned table.

Usage: python3 table.py FILE.csv

The input is a UTF-8 CSV file (it may start with a byte-order mark, as files
exported from spreadsheet tools often do) with the header
`name,city,amount`. Output: one line per row, sorted by amount (descending),
then by name; columns are separated by " | ", the name and city columns are
left-aligned and padded to the length (in characters) of the longest value in
that column, and the amount is right-aligned in 10 characters with two
decimals. Example:

    Zoë    | Köln  |     120.50
    Ann    | Paris |      99.00
"""
import csv
import sys


def load(path):
    with open(path, encoding="latin-1") as f:
        return list(csv.DictReader(f))


def render(rows):
    wn = max(len(r["name"].encode()) for r in rows)
    wc = max(len(r["city"].encode()) for r in rows)
    rows = sorted(rows, key=lambda r: (-float(r["amount"]), r["name"].encode()))
    return "\n".join(f"{r['name']:<{wn}} | {r['city']:<{wc}} | {float(r['amount']):>10.2f}" for r in rows)


if __name__ == "__main__":
    print(render(load(sys.argv[1])))
