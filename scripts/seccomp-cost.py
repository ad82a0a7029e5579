"""What the default seccomp filter costs a command, in CPU time (user + sys, which a loaded host
disturbs far less than wall time): 300,000 getppid + 100,000 stat, and 100 spawns of `true`,
in a filtered and an unconfined bwrap sandbox, alternately, 6 rounds; prints the medians.
    PYTHONPATH=src .venv/bin/python scripts/seccomp-cost.py   (as root: bwrap sandboxes)
"""
import asyncio
import json
import statistics
import sys

from sandfleet.sandbox import create_sandbox, make_spec

CODE = r'''
import os, resource, subprocess
r0 = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(300000): os.getppid()
for _ in range(100000): os.stat("/")
r1 = resource.getrusage(resource.RUSAGE_SELF)
c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
for _ in range(100): subprocess.run(["true"])
c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
r2 = resource.getrusage(resource.RUSAGE_SELF)
cpu = lambda a, b: (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) * 1e3
print(cpu(r0, r1), cpu(r1, r2) + cpu(c0, c1))
'''


async def main():
    boxes = {k: await create_sandbox(make_spec(backend="bwrap", seccomp_allow=a))
             for k, a in (("filtered", ()), ("unconfined", ("unconfined",)))}
    res: dict[str, list[list[float]]] = {k: [] for k in boxes}
    for i in range(6):
        for k, sb in (sorted(boxes.items()) if i % 2 else sorted(boxes.items(), reverse=True)):
            r = await sb.exec(["python3", "-c", CODE], timeout=300)
            res[k].append([float(x) for x in r.stdout.split()])
    for sb in boxes.values():
        await sb.close()
    sys.stdout.write(json.dumps({k: {"syscalls_cpu_ms_median": round(statistics.median(a for a, _ in v), 1),
                          "100_spawns_cpu_ms_median": round(statistics.median(b for _, b in v), 1)}
                      for k, v in res.items()}) + "\n")

asyncio.run(main())
