"""The text renderer: a :class:`~sandfleet.analysis.schema.Report` as aligned tables (what
``sandfleet analyze`` prints without ``--json``). It reads nothing but the report."""

from __future__ import annotations

from sandfleet.analysis.fmt import interval as _interval
from sandfleet.analysis.fmt import num as _f
from sandfleet.analysis.fmt import pct as _pct
from sandfleet.analysis.fmt import table
from sandfleet.analysis.schema import Report

STATS = ("mean", "median", "p90")


def render_text(a: Report) -> str:
    """The report as aligned tables."""
    labs = a.labels
    runs = a.runs
    out = [table(["run", "name", "rollouts", "completed", "failed", "cancelled"],
                 [[lab, r.name, str(r.rollouts), str(r.completed), str(r.failed), str(r.cancelled)]
                  for lab, r in runs.items()])]
    out.append("\nVerdicts (final attempts; pass rate over scored + policy_fault, masked apart)")
    out.append(table(
        ["run", "scored", "policy_fault", "infra_fault", "mask rate", "pass rate", "refilled"],
        [[lab, str(r.verdicts.scored), str(r.verdicts.policy_fault), str(r.verdicts.infra_fault),
          _pct(r.mask_rate), _pct(r.pass_rate), str(r.refilled)] for lab, r in runs.items()],
    ))
    out.append("\nContention (final attempts; outside = work outside the sandbox, own = its CPU limit's "
               "throttling; docs/rollouts.md)")
    out.append(table(
        ["run", "phase", "measured", "outside share mean", "p95", "outside wait s", "own throttled s",
         "host_contention masks"],
        [[lab, ph, str(p.measured), _f(p.outside_share_mean, 2), _f(p.outside_share_p95, 2),
          _f(p.outside_wait_s_mean, 2), _f(p.throttled_s_mean, 2),
          f"{c.host_contention} ({_pct(c.host_contention_rate)})" if ph == "verifier" else ""]
         for lab, r in runs.items() for c in [r.contention]
         for ph, p in (("agent", c.agent), ("verifier", c.verifier))],
    ))
    if not all(r.model_time_known for r in runs.values()):
        out.append("note: model time unknown in some traces (converted); it is in agent_command")
    out.append("\nBreakdown per span (seconds per completed rollout)")
    out.append(table(
        ["span", *(f"{lab} {m}" for lab in labs for m in STATS)],
        [[col, *(_f(getattr(a.spans[lab][col], m)) for lab in labs for m in STATS)] for col in a.spans[labs[0]]],
    ))
    out.append("\nPlatform overhead (sandbox_start + other_sandbox + overhead, per completed rollout)")
    out.append(table(
        ["run", "mean s", "of wall time", "sandbox_start s", "raw bwrap true ms"],
        [[lab, _f(a.platform_overhead_s[lab]), _pct(a.platform_overhead_fraction[lab]),
          _f(a.spans[lab]["sandbox_start"].mean, 3), _f(a.raw_bwrap_true_ms.get(lab), 1)] for lab in labs],
    ))
    if a.compare is not None:
        c = a.compare
        left = f"; left out, without a completed rollout in one run: {', '.join(c.tasks_left_out)}"
        out.append(f"\nB - A (same {c.tasks} tasks, mean of per-task means; {100 * c.ci_level:g} % bootstrap intervals"
                   + (left if c.tasks_left_out else "") + ")")
        out.append(table(
            ["span", "A s", "B s", "B - A s", "interval s", "B - A %", "interval %"],
            [[col, _f(d.a), _f(d.b), _f(d.delta_s, suffix=" s"), _interval(d.delta_s_ci90),
              _f(d.delta_pct, suffix=" %"), _interval(d.delta_pct_ci90)] for col, d in c.spans.items()],
        ))
    two = len(labs) == 2
    out.append("\nWhat if inference were k times faster" + (f" (gap = {a.gap_definition})" if two else ""))
    if a.whatif_not_applicable or a.whatif_detail is None:
        out.append(f"not applicable: {a.whatif_not_applicable}")
    else:
        out.append(table(
            ["k", *(f"{lab} mean s" for lab in labs), *(["gap"] if two else [])],
            [[k, *(_f(getattr(d, lab)) for lab in labs), *([_pct(d.gap)] if two else [])]
             for k, d in a.whatif_detail.items()],
        ))
    out.append("\nKV cache and GRPO groups")
    out.append(table(
        ["run", "KV-cache idle", "KV idle through reward", "group wait"],
        [[lab, _pct(a.kv_idle_fraction[lab]), _pct(a.kv_idle_fraction_through_reward[lab]),
          _pct(a.group_wait_fraction[lab])] for lab in labs],
    ))
    for lab in labs:  # a --branch run: the work its trees did not redo (docs/figures.md)
        tf = a.trees.get(lab)
        if tf:
            ws = tf.work_saved
            out.append(f"\nTrees of run {lab}: {ws.trees} trees, {ws.leaves} leaves, {ws.branches} branches "
                       f"({_f(ws.branch_s)} s); work saved against independent rollouts to the same leaves")
            out.append(table(["work", "ran", "independent", "saved", "saved share"],
                             [[k, f"{ws.ran[k]:.6g}", f"{ws.independent[k]:.6g}", f"{ws.saved[k]:.6g}",
                               _pct(ws.saved_fraction[k])] for k in ws.ran]))
    st = a.staleness
    given = "given" if st.step_time_given else "the step time run A's bound allows"
    out.append(f"\nStaleness (trainer step {_f(st.step_time_s)} s, {given}; "
               f"bound {st.bound_versions:g} versions at p{st.quantile:g})")
    out.append(table(
        ["run", "p50", "p90", "max", "histogram (versions: rollouts)", "allowed step s"],
        [[lab, _f(d.p50, 2), _f(d.p90, 2), _f(d.max, 2), " ".join(f"{k}:{v}" for k, v in d.histogram.items()),
          _f(st.allowed_step_time_s[lab])] for lab, d in st.distribution.items()],
    ))
    if st.faster_run is not None:  # two runs
        out.append(f"training can step {_f(st.training_faster_pct)} % faster with run {st.faster_run} "
                   "at the same staleness")
    return "\n".join(out)
