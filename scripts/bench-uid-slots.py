#!/usr/bin/env python3
"""What taking a host uid slot costs while another process holds many (sandbox/uids.py).

    .venv/bin/python scripts/bench-uid-slots.py [HELD=5000]

A helper process takes HELD slots of a private uid_base (lock files in a temporary
directory, so no live sandbox's slots are touched) and keeps them; this process then takes
100 slots one after another and prints the first take and the median of the rest."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from sandfleet.sandbox.spec import BwrapConfig
from sandfleet.sandbox.uids import take_slot

held = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
base, slots = 2_200_000_000, held + 200
os.environ["SANDFLEET_UID_SLOTS"] = tempfile.mkdtemp(prefix="sf-slot-bench-")
cfg = BwrapConfig(uid_base=base, slots=slots)
helper = subprocess.Popen(
    [sys.executable, "-c", "import sys, time; from sandfleet.sandbox.spec import BwrapConfig; "
     "from sandfleet.sandbox.uids import take_slot; "
     f"c = BwrapConfig(uid_base={base}, slots={slots}); s = [take_slot(c) for _ in range({held})]; "
     "print('held', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
try:
    assert helper.stdout is not None and helper.stdout.readline().strip() == "held"
    ts = []
    for _ in range(100):
        t = time.perf_counter()
        take_slot(cfg)
        ts.append(time.perf_counter() - t)
finally:
    helper.kill()
    helper.wait()
rest = sorted(ts[1:])
line = (f"{held} slots held by another process: first take {ts[0] * 1e3:.2f} ms, "
        f"median of the next 99 {rest[len(rest) // 2] * 1e3:.3f} ms")
print(line)  # noqa: T201
