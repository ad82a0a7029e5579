"""``sandfleet bench compare A.json B.json``: the study's table, B against A.

Two results are compared only when they measured the same thing: the same results schema,
command set, workload (version and every command's script), capacity target, and, when both
measured evaluations, the same evaluation task. Otherwise :func:`check_comparable` raises
:class:`IncomparableError` naming each difference.

- single: each command's median latency with one busy sandbox, and B/A;
- slowdown at full load: the median and p95 slowdown at each host's own full load (N = its
  hardware threads, or the largest measured N below), and B/A;
- capacity at the target (sandboxes, and per hardware thread), evaluations per minute,
  platform overhead against bare processes, soak and density, each with B/A.
"""

from __future__ import annotations

from typing import Any

from sandfleet.errors import ConfigError

SCHEMA = "sandfleet.bench/2"
"""The results schema this code reads (``bench run`` writes it: run.SCHEMA)."""


class IncomparableError(ConfigError):
    """Two bench results measured different things (commands, workload, target)."""


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(b / a, 3) if a and b is not None else None


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def host_of(r: dict[str, Any]) -> dict[str, Any]:
    """The host facts of a result (its provenance's host)."""
    return _get(r, "provenance", "host") or {}


def config_of(r: dict[str, Any]) -> dict[str, Any]:
    """The configuration a result was made with (its provenance's config)."""
    return _get(r, "provenance", "config") or {}


def differences(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("A", "B")) -> list[str]:
    """What makes ``a`` and ``b`` incomparable, one sentence each (empty: comparable)."""
    na, nb = names
    out = []
    sa, sb = a.get("schema"), b.get("schema")
    if sa != SCHEMA or sb != SCHEMA:
        out.append(f"results schema: {na} is {sa!r}, {nb} is {sb!r}, this sandfleet reads {SCHEMA!r} "
                   "(re-run the older one with this version's bench run)")
        return out
    ca, cb = config_of(a), config_of(b)
    ma, mb = set(ca.get("commands") or []), set(cb.get("commands") or [])
    if ma != mb:
        only_a = ", ".join(sorted(ma - mb)) or "none"
        only_b = ", ".join(sorted(mb - ma)) or "none"
        out.append(f"command sets differ: only in {na}: {only_a}; only in {nb}: {only_b}")
    wa, wb = ca.get("workload") or {}, cb.get("workload") or {}
    if wa.get("version") != wb.get("version"):
        out.append(f"workload versions differ: {na} {wa.get('version')!r}, {nb} {wb.get('version')!r}")
    scripts_a, scripts_b = wa.get("scripts") or {}, wb.get("scripts") or {}
    changed = sorted(c for c in ma & mb if scripts_a.get(c) != scripts_b.get(c))
    if changed:
        out.append("different scripts for " + ", ".join(
            f"{c} ({na} {scripts_a.get(c)}, {nb} {scripts_b.get(c)})" for c in changed))
    if ca.get("target") != cb.get("target"):
        out.append(f"capacity targets differ: {na} {ca.get('target')}x, {nb} {cb.get('target')}x")
    if a.get("evals") and b.get("evals") and ca.get("eval_task") != cb.get("eval_task"):
        out.append(f"evaluation tasks differ: {na} {ca.get('eval_task')!r}, {nb} {cb.get('eval_task')!r}")
    return out


def check_comparable(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("A", "B")) -> None:
    """Raise :class:`IncomparableError` naming every difference that makes B/A meaningless."""
    diffs = differences(a, b, names)
    if diffs:
        raise IncomparableError(f"cannot compare {names[0]} with {names[1]}: " + "; ".join(diffs))


def full_load_n(r: dict[str, Any]) -> int | None:
    """The sweep level that stands for "every hardware thread busy"."""
    ns = sorted(int(k) for k in r.get("sweep") or {})
    threads = host_of(r).get("threads") or 0
    below = [n for n in ns if n <= threads]
    return below[-1] if below else (ns[0] if ns else None)


HOST_FIELDS = ("hostname", "cpu_model", "threads", "kernel", "page_size", "backend", "throttle")


def compare(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("A", "B")) -> dict[str, Any]:
    """B against A (refused with :class:`IncomparableError` when they measured different things)."""
    check_comparable(a, b, names)
    na, nb = full_load_n(a), full_load_n(b)
    names_ = sorted(set(config_of(a).get("commands") or []))
    rows = {}
    for c in names_:
        sa, sb = _get(a, "single", c, "median_s"), _get(b, "single", c, "median_s")
        da = _get(a, "sweep", str(na), "slowdown", c, "slowdown_median")
        db = _get(b, "sweep", str(nb), "slowdown", c, "slowdown_median")
        pa = _get(a, "sweep", str(na), "slowdown", c, "slowdown_p95")
        pb = _get(b, "sweep", str(nb), "slowdown", c, "slowdown_p95")
        rows[c] = {"single_a_s": sa, "single_b_s": sb, "single_ratio": _ratio(sa, sb),
                   "slowdown_a": da, "slowdown_b": db, "slowdown_ratio": _ratio(da, db),
                   "slowdown_p95_a": pa, "slowdown_p95_b": pb,
                   "slowdown_p95_ci_a": _get(a, "sweep", str(na), "slowdown", c, "slowdown_p95_ci"),
                   "slowdown_p95_ci_b": _get(b, "sweep", str(nb), "slowdown", c, "slowdown_p95_ci")}
    ca, cb = a.get("capacity") or {}, b.get("capacity") or {}
    return {
        "names": {"a": names[0], "b": names[1]},
        "hosts": {k: {f: host_of(r).get(f) for f in HOST_FIELDS} for k, r in (("a", a), ("b", b))},
        "provenance": {"a": a.get("provenance"), "b": b.get("provenance")},
        "full_load_n": {"a": na, "b": nb},
        "commands": rows,
        "capacity": {"target": ca.get("target") or cb.get("target"), "a": ca.get("sandboxes"),
                     "b": cb.get("sandboxes"), "ratio": _ratio(ca.get("sandboxes"), cb.get("sandboxes")),
                     "per_thread_a": ca.get("per_thread"), "per_thread_b": cb.get("per_thread"),
                     "method_a": ca.get("method"), "method_b": cb.get("method")},
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
    pa, pb = cmp["provenance"]["a"] or {}, cmp["provenance"]["b"] or {}
    lines = [f"A: {ha['cpu_model']} x{ha['threads']} ({ha['backend']}, throttle {ha['throttle']}), "
             f"kernel {ha['kernel']}, sandfleet {pa.get('sandfleet')} {pa.get('commit')}",
             f"B: {hb['cpu_model']} x{hb['threads']} ({hb['backend']}, throttle {hb['throttle']}), "
             f"kernel {hb['kernel']}, sandfleet {pb.get('sandfleet')} {pb.get('commit')}",
             "",
             f"{'command':16} {'single A s':>11} {'single B s':>11} {'B/A':>6}   "
             f"{'slowdown A':>10} {'slowdown B':>10} {'B/A':>6}   {'p95 sd A':>9} {'p95 sd B':>9}"]
    n = cmp["full_load_n"]
    for c, r in cmp["commands"].items():
        lines.append(f"{c:16} {_f(r['single_a_s']):>11} {_f(r['single_b_s']):>11} {_f(r['single_ratio'], '{:.2f}'):>6}"
                     f"   {_f(r['slowdown_a'], '{:.2f}x'):>10} {_f(r['slowdown_b'], '{:.2f}x'):>10}"
                     f" {_f(r['slowdown_ratio'], '{:.2f}'):>6}"
                     f"   {_f(r['slowdown_p95_a'], '{:.2f}x'):>9} {_f(r['slowdown_p95_b'], '{:.2f}x'):>9}")
    cap, ev, ov = cmp["capacity"], cmp["evals_per_min"], cmp["baseline_overhead"]
    lines += ["", f"(slowdown = median / p95 at full load, N={n['a']} on A and N={n['b']} on B, "
                  "/ the interleaved single-sandbox median / p95)",
              f"{'capacity at ' + _f(cap['target'], '{:.2f}x') + ' p95':30} A {_f(cap['a'], '{:.2f}'):>6}"
              f"   B {_f(cap['b'], '{:.2f}'):>6}   B/A {_f(cap['ratio'], '{:.2f}')}",
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
