"""``sandfleet bench compare A.json B.json``: the study's table, B against A.

- single: each command's median latency with one busy sandbox, and B/A;
- slowdown at full load: the median slowdown at each host's own full load (N = its hardware
  threads, or the largest measured N below), and B/A;
- capacity at the target (sandboxes, and per hardware thread), evaluations per minute,
  platform overhead against bare processes, soak and density, each with B/A.
"""

from __future__ import annotations

from typing import Any


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(b / a, 3) if a and b is not None else None


def full_load_n(r: dict[str, Any]) -> int | None:
    """The sweep level that stands for "every hardware thread busy"."""
    ns = sorted(int(k) for k in r.get("sweep") or {})
    threads = (r.get("host") or {}).get("threads") or 0
    below = [n for n in ns if n <= threads]
    return below[-1] if below else (ns[0] if ns else None)


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    na, nb = full_load_n(a), full_load_n(b)
    names = sorted(set(a.get("single") or {}) | set(b.get("single") or {})
                   | set(_get(a, "sweep", str(na), "slowdown") or {}))
    rows = {}
    for c in names:
        sa, sb = _get(a, "single", c, "median_s"), _get(b, "single", c, "median_s")
        da = _get(a, "sweep", str(na), "slowdown", c, "slowdown_median")
        db = _get(b, "sweep", str(nb), "slowdown", c, "slowdown_median")
        rows[c] = {"single_a_s": sa, "single_b_s": sb, "single_ratio": _ratio(sa, sb),
                   "slowdown_a": da, "slowdown_b": db, "slowdown_ratio": _ratio(da, db)}
    ca, cb = a.get("capacity") or {}, b.get("capacity") or {}
    return {
        "hosts": {k: {f: _get(r, "host", f) for f in ("hostname", "cpu_model", "threads", "kernel",
                                                      "page_size", "backend", "throttle")}
                  for k, r in (("a", a), ("b", b))},
        "full_load_n": {"a": na, "b": nb},
        "commands": rows,
        "capacity": {"target": ca.get("target") or cb.get("target"), "a": ca.get("sandboxes"),
                     "b": cb.get("sandboxes"), "ratio": _ratio(ca.get("sandboxes"), cb.get("sandboxes")),
                     "per_thread_a": ca.get("per_thread"), "per_thread_b": cb.get("per_thread")},
        "evals_per_min": {"a": a.get("evals_per_min"), "b": b.get("evals_per_min"),
                          "ratio": _ratio(a.get("evals_per_min"), b.get("evals_per_min"))},
        "baseline_overhead": {"a": _get(a, "baseline_overhead", "full_load"),
                              "b": _get(b, "baseline_overhead", "full_load")},
        "soak": {k: {"failures": _get(r, "soak", "failures", "count"), "drift": _get(r, "soak", "drift")}
                 for k, r in (("a", a), ("b", b))},
        "density": {k: {"created": _get(r, "density", "created"), "pss_mib": _get(r, "density", "pss_mib")}
                    for k, r in (("a", a), ("b", b))},
    }


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def table_lines(cmp: dict[str, Any]) -> list[str]:
    """The comparison as a fixed-width text table."""
    ha, hb = cmp["hosts"]["a"], cmp["hosts"]["b"]
    lines = [f"A: {ha['cpu_model']} x{ha['threads']} ({ha['backend']}, throttle {ha['throttle']})",
             f"B: {hb['cpu_model']} x{hb['threads']} ({hb['backend']}, throttle {hb['throttle']})",
             "",
             f"{'command':16} {'single A s':>11} {'single B s':>11} {'B/A':>6}   "
             f"{'slowdown A':>10} {'slowdown B':>10} {'B/A':>6}"]
    n = cmp["full_load_n"]
    for c, r in cmp["commands"].items():
        lines.append(f"{c:16} {_f(r['single_a_s']):>11} {_f(r['single_b_s']):>11} {_f(r['single_ratio'], '{:.2f}'):>6}"
                     f"   {_f(r['slowdown_a'], '{:.2f}x'):>10} {_f(r['slowdown_b'], '{:.2f}x'):>10}"
                     f" {_f(r['slowdown_ratio'], '{:.2f}'):>6}")
    cap, ev, ov = cmp["capacity"], cmp["evals_per_min"], cmp["baseline_overhead"]
    lines += ["", f"(slowdown = median at full load, N={n['a']} on A and N={n['b']} on B, / N=1)",
              f"{'capacity at ' + _f(cap['target'], '{:.2f}x') + ' p95':30} A {_f(cap['a'], '{}'):>6}"
              f"   B {_f(cap['b'], '{}'):>6}   B/A {_f(cap['ratio'], '{:.2f}')}",
              f"{'  per hardware thread':30} A {_f(cap['per_thread_a'], '{:.2f}'):>6}"
              f"   B {_f(cap['per_thread_b'], '{:.2f}'):>6}",
              f"{'evaluations per minute':30} A {_f(ev['a'], '{:.1f}'):>6}   B {_f(ev['b'], '{:.1f}'):>6}"
              f"   B/A {_f(ev['ratio'], '{:.2f}')}",
              f"{'overhead vs bare, full load':30} A {_f(ov['a'], '{:+.1%}'):>6}   B {_f(ov['b'], '{:+.1%}'):>6}"]
    sa, sb = cmp["soak"]["a"], cmp["soak"]["b"]
    if sa["failures"] is not None or sb["failures"] is not None:
        lines.append(f"{'soak failures / drift':30} A {_f(sa['failures'], '{}')} / {_f(sa['drift'], '{:+.1%}')}"
                     f"   B {_f(sb['failures'], '{}')} / {_f(sb['drift'], '{:+.1%}')}")
    da, db = cmp["density"]["a"], cmp["density"]["b"]
    if da["created"] is not None or db["created"] is not None:
        lines.append(f"{'idle density (PSS MiB each)':30} A {_f(da['created'], '{}')} ({_f(da['pss_mib'], '{:.2f}')})"
                     f"   B {_f(db['created'], '{}')} ({_f(db['pss_mib'], '{:.2f}')})")
    return lines
