import calendar
import random
import signal
import sys
import time
from datetime import date, datetime, timedelta, timezone

import pytest

sys.path.insert(0, "/app")
from billing import add_months, business_days_between, invoice_due, parse_ts  # noqa: E402


def ref_parse(s):
    d, t = s[:10], s[11:19]
    off = s[19:]
    dt = datetime.fromisoformat(d + "T" + t)
    if off == "Z":
        delta = timedelta(0)
    else:
        sign = -1 if off[0] == "-" else 1
        hh, mm = int(off[1:3]), int(off[-2:])
        delta = sign * timedelta(hours=hh, minutes=mm)
    return (dt - delta).replace(tzinfo=timezone.utc)


def ref_add_months(d, n):
    m = d.year * 12 + (d.month - 1) + n
    y, m = divmod(m, 12)
    return date(y, m + 1, min(d.day, calendar.monthrange(y, m + 1)[1]))


def ref_bdays(a, b):
    return sum(1 for i in range((b - a).days) if (a + timedelta(days=i)).weekday() < 5)


def rand_ts(rng):
    dt = datetime(2020, 1, 1) + timedelta(seconds=rng.randint(0, 6 * 365 * 86400))
    sep = rng.choice(["T", " "])
    h, m = rng.randint(0, 14), rng.choice([0, 30, 45])
    sign = rng.choice("+-")
    off = rng.choice(["Z", f"{sign}{h:02d}:{m:02d}", f"{sign}{h:02d}{m:02d}"])
    return dt.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + off


def test_parse_examples():
    assert parse_ts("2024-03-10T01:30:00Z") == datetime(2024, 3, 10, 1, 30, tzinfo=timezone.utc)
    assert parse_ts("2024-03-10T01:30:00+02:00") == datetime(2024, 3, 9, 23, 30, tzinfo=timezone.utc)
    assert parse_ts("2024-03-10 01:30:00-0530") == datetime(2024, 3, 10, 7, 0, tzinfo=timezone.utc)
    r = parse_ts("2024-12-31T23:00:00-01:00")
    assert r == datetime(2025, 1, 1, 0, 0, tzinfo=timezone.utc) and r.utcoffset() == timedelta(0)


def test_parse_random():
    rng = random.Random(5)
    for _ in range(500):
        s = rand_ts(rng)
        got = parse_ts(s)
        assert got == ref_parse(s) and got.utcoffset() == timedelta(0), s


def test_add_months():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)
    assert add_months(date(2024, 11, 15), 1) == date(2024, 12, 15)
    assert add_months(date(2024, 12, 15), 1) == date(2025, 1, 15)
    assert add_months(date(2024, 3, 31), -1) == date(2024, 2, 29)
    assert add_months(date(2024, 1, 10), -1) == date(2023, 12, 10)
    rng = random.Random(9)
    for _ in range(2000):
        d = date(2000, 1, 1) + timedelta(days=rng.randint(0, 12000))
        n = rng.randint(-40, 40)
        assert add_months(d, n) == ref_add_months(d, n), (d, n)


def test_business_days():
    assert business_days_between(date(2024, 6, 3), date(2024, 6, 10)) == 5   # Mon..Sun
    assert business_days_between(date(2024, 6, 8), date(2024, 6, 10)) == 0   # Sat, Sun
    assert business_days_between(date(2024, 6, 10), date(2024, 6, 3)) == 0
    rng = random.Random(3)
    for _ in range(400):
        a = date(2020, 1, 1) + timedelta(days=rng.randint(0, 2000))
        b = a + timedelta(days=rng.randint(-5, 60))
        assert business_days_between(a, b) == ref_bdays(a, b), (a, b)


class _Over(Exception):
    pass


def _cpu(fn, limit_s=None):
    """CPU time of fn() in this process (other processes on a busy host hardly change it);
    None when it ran past limit_s of CPU time (a CPU-time timer stops it)."""
    def over(signum, frame):
        raise _Over()

    previous = signal.signal(signal.SIGPROF, over)
    t = time.process_time()
    try:
        if limit_s:
            signal.setitimer(signal.ITIMER_PROF, limit_s)
        fn()
    except _Over:
        return None
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    return time.process_time() - t


SLOWER_LIMIT = 10.0  # at most this many times a plain day-by-day count
MEASURE_S = 0.2  # CPU time of each measured turn: CPU clocks can tick in 10 ms steps (gVisor)


def _calls_for(fn, at_least_s=MEASURE_S):
    """How many calls of fn in a row take at least at_least_s of CPU time. One call of the
    day-by-day count takes about 16 ms, one or two ticks of a coarse clock, which can read 0."""
    n = 1
    while True:
        t = _cpu(lambda: [fn() for _ in range(n)])
        if t >= at_least_s:
            return n
        n *= 2


def test_business_days_fast():
    # Against a baseline measured in the same run, not a wall-clock budget: a 100-year range
    # may take at most SLOWER_LIMIT times as long as counting its days one by one (ref_bdays),
    # the same number of calls each, the two taking turns, best of three each.
    a, b = date(1950, 1, 1), date(2050, 1, 1)
    n = _calls_for(lambda: ref_bdays(a, b))
    base, got = [], []
    for _ in range(3):
        base.append(_cpu(lambda: [ref_bdays(a, b) for _ in range(n)]))
        t = _cpu(lambda: [business_days_between(a, b) for _ in range(n)], limit_s=SLOWER_LIMIT * min(base))
        assert t is not None, f"business_days_between over 100 years took over {SLOWER_LIMIT}x a day-by-day count"
        got.append(t)
    assert min(base) > 0, f"the CPU clock did not move in {n} day-by-day counts"
    assert min(got) < SLOWER_LIMIT * min(base), (min(got), min(base))
    assert business_days_between(a, b) == ref_bdays(a, b)


def test_invoice_due():
    # issued late on Friday 2024-05-31 in UTC-5 => 2024-06-01 (Sat) in UTC; +30 days => Mon 2024-07-01
    assert invoice_due("2024-05-31T22:00:00-05:00") == date(2024, 7, 1)
    assert invoice_due("2024-06-01T10:00:00+14:00", net_days=7) == date(2024, 6, 7)
    rng = random.Random(11)
    for _ in range(300):
        s = rand_ts(rng)
        n = rng.randint(0, 90)
        due = ref_parse(s).date() + timedelta(days=n)
        while due.weekday() >= 5:
            due += timedelta(days=1)
        assert invoice_due(s, n) == due, (s, n)
