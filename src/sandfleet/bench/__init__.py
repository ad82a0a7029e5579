"""Benchmarks: the sandbox layer (``micro``) and the capacity benchmark.

Capacity benchmark modules, in the order data flows:

- ``workload``: the named commands and the offline workload directory they run on;
- ``workers``: busy sandboxes (forked from one holding the workload) and bare host processes;
- ``load``: single, load sweep, slowdown, capacity, drift;
- ``evals``, ``density``: evaluations per minute, idle sandboxes per memory budget;
- ``throttle``: slower-host emulation in a CPU-throttled cgroup;
- ``run``: ``bench run``, mode by mode, into one results dict;
- ``compare``, ``report``, ``svg``: ``bench compare``'s table and HTML report.
"""
