"""Date helpers for the billing service."""
from datetime import date, datetime, timedelta, timezone


def parse_ts(s):
    """Parse an ISO-8601 timestamp with an explicit UTC offset and return an
    aware datetime in UTC.

    Accepted forms: "2024-03-10T01:30:00Z", "2024-03-10T01:30:00+02:00",
    "2024-03-10 01:30:00-0530" (a space instead of "T", offsets with or without
    a colon).
    """
    s = s.replace("Z", "")
    return datetime.strptime(s[:19].replace(" ", "T"), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)


def add_months(d, n):
    """Return date d moved by n months (n may be negative). If the day does
    not exist in the target month, use the last day of that month
    (2024-01-31 + 1 month -> 2024-02-29)."""
    month = d.month + n
    year = d.year + month // 12
    month = month % 12
    return date(year, month, d.day)


def business_days_between(start, end):
    """Number of Monday-Friday dates in the half-open range [start, end).
    Returns 0 if end <= start."""
    days = 0
    d = start
    while d < end:
        if d.weekday() < 6:
            days += 1
        d += timedelta(days=1)
    return days


def invoice_due(issued_ts, net_days=30):
    """Due date of an invoice: the UTC calendar date of issued_ts plus net_days
    calendar days, moved forward to the next Monday if it falls on a weekend."""
    due = parse_ts(issued_ts).date() + timedelta(days=net_days)
    while due.weekday() >= 5:
        due += timedelta(days=1)
    return due
