"""Benchmarks: the sandbox layer (``micro``) and the capacity benchmark.

Capacity benchmark modules, in the order data flows:

- ``workload``: the named commands and the offline workload directory they run on;
- ``workers``: busy sandboxes (forked from one holding the workload) and bare host processes
  given the sandboxes' cgroup limits, a tmpfs working copy and the same output handling;
- ``load``: single, load sweep, interleaved single baseline, slowdown (with bootstrap CIs),
  interpolated capacity and the finer grid around it, drift;
- ``evals``, ``density``: evaluations per minute, idle sandboxes per memory budget;
- ``throttle``: slower-host emulation in a CPU-throttled cgroup;
- ``run``: ``bench run``, mode by mode, into one results dict;
- ``compare``, ``report``: ``bench compare``'s table (refusing incomparable runs) and the HTML
  report of one run or two (matplotlib charts, :func:`report.expected_charts`).
"""
