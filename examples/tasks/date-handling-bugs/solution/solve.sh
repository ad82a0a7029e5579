#!/bin/bash
set -euo pipefail
cat > /app/billing.py <<'PY'
"""Date helpers for the billing service."""
import calendar
from datetime import date, datetime, timedelta, timezone


def parse_ts(s):
    """Parse an ISO-8601 timestamp with an explicit UTC offset and return an
    aware datetime in UTC.

    Accepted forms: "2024-03-10T01:30:00Z", "2024-03-10T01:30:00+02:00",
    "2024-03-10 01:30:00-0530" (a space instead of "T", offsets with or without
    a colon).
    """
    s = s.strip().replace(" ", "T", 1)
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%S%z").astimezone(timezone.utc)


def add_months(d, n):
    """Return date d moved by n months (n may be negative). If the day does
    not exist in the target month, use the last day of that month
    (2024-01-31 + 1 month -> 2024-02-29)."""
    year, month0 = divmod(d.year * 12 + d.month - 1 + n, 12)
    month = month0 + 1
    return date(year, month, min(d.day, calendar.monthrange(year, month)[1]))


def business_days_between(start, end):
    """Number of Monday-Friday dates in the half-open range [start, end).
    Returns 0 if end <= start."""
    total = (end - start).days
    if total <= 0:
        return 0
    weeks, rest = divmod(total, 7)
    days = weeks * 5
    wd = start.weekday()
    for i in range(rest):
        if (wd + i) % 7 < 5:
            days += 1
    return days


def invoice_due(issued_ts, net_days=30):
    """Due date of an invoice: the UTC calendar date of issued_ts plus net_days
    calendar days, moved forward to the next Monday if it falls on a weekend."""
    due = parse_ts(issued_ts).date() + timedelta(days=net_days)
    while due.weekday() >= 5:
        due += timedelta(days=1)
    return due
PY
cd /app && python3 -c 'import billing, datetime; print(billing.add_months(datetime.date(2024, 1, 31), 1))'
