"""Figures and numbers for docs/rl.md from a training run and two evaluations.

    python examples/rl/report.py --run runs/grpo --base runs/eval-base --trained runs/eval-trained --out docs/rl

Writes ``reward.svg`` (reward per step and its moving average), ``step-time.svg`` (each step's
generation / sandbox reward / optimizer seconds), ``whatif.svg`` (the sandbox reward's share of
step time with generation k times faster) and ``report.json`` (the numbers quoted in the doc:
pass rates with bootstrap 95% CIs over tasks x samples, the difference's CI, step-time
totals and shares).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rlcommon import read_jsonl  # noqa: E402

SPEEDUPS = (1, 8, 32)


def moving_average(xs: list[float], w: int) -> list[float]:
    out = []
    for i in range(len(xs)):
        window = xs[max(0, i - w + 1):i + 1]
        out.append(sum(window) / len(window))
    return out


def whatif(steps: list[dict[str, Any]], k: float, *, optimizer_too: bool = False) -> float:
    """The sandbox reward's share of step time (generation + reward + optimizer) if
    generation (and, with ``optimizer_too``, the optimizer) were ``k`` times faster, the
    sandbox reward unchanged."""
    gen = sum(s["generation_s"] for s in steps)
    rew = sum(s["reward_wall_s"] for s in steps)
    opt = sum(s["optimizer_s"] for s in steps)
    return rew / (gen / k + rew + (opt / k if optimizer_too else opt))


def _rate(xs: list[float]) -> dict[str, Any]:
    import numpy as np

    from sandfleet.stats import bootstrap_ci

    return {"n": len(xs), "pass_rate": float(np.mean(xs)), "ci95": bootstrap_ci(xs, np.mean)}


def evaluation(base: Path, trained: Path) -> dict[str, Any]:
    import numpy as np

    from sandfleet.stats import bootstrap_ci, bootstrap_ci2

    out: dict[str, Any] = {}
    a, b = read_jsonl(base / "results.jsonl"), read_jsonl(trained / "results.jsonl")
    for name, rows in (("base", a), ("trained", b)):
        passed = [float(r["passed"]) for r in rows]
        rewards = [float(r["reward"]) for r in rows]
        out[name] = {"completions": len(rows), "tasks": len({r["task"] for r in rows}),
                     "pass_rate": float(np.mean(passed)), "pass_rate_ci95": bootstrap_ci(passed, np.mean),
                     "reward_mean": float(np.mean(rewards)), "reward_mean_ci95": bootstrap_ci(rewards, np.mean),
                     "per_template": {t: _rate([float(r["passed"]) for r in rows if r["template"] == t])
                                      for t in sorted({r["template"] for r in rows})}}  # fmt: skip
    pa, pb = [float(r["passed"]) for r in a], [float(r["passed"]) for r in b]
    ra, rb = [float(r["reward"]) for r in a], [float(r["reward"]) for r in b]
    out["pass_rate_diff"] = float(np.mean(pb) - np.mean(pa))
    out["pass_rate_diff_ci95"] = bootstrap_ci2(pa, pb, lambda x, y: float(np.mean(y) - np.mean(x)))
    out["reward_diff"] = float(np.mean(rb) - np.mean(ra))
    out["reward_diff_ci95"] = bootstrap_ci2(ra, rb, lambda x, y: float(np.mean(y) - np.mean(x)))
    lo_b, hi_a = out["trained"]["pass_rate_ci95"][0], out["base"]["pass_rate_ci95"][1]
    out["goal_met"] = bool(lo_b > hi_a)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--base", type=Path, default=None)
    p.add_argument("--trained", type=Path, default=None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--window", type=int, default=5)
    a = p.parse_args(argv)
    from sandfleet.plotting import new_figure, plt

    steps = read_jsonl(a.run / "metrics.jsonl")
    if not steps:
        raise SystemExit(f"no steps in {a.run / 'metrics.jsonl'}")
    a.out.mkdir(parents=True, exist_ok=True)
    xs = [s["step"] for s in steps]
    rewards = [float(s["reward_mean"]) for s in steps]
    passes = [float(s["pass_rate"] or 0.0) for s in steps]

    fig, ax = new_figure()
    template_of = {int(c["step"]): str(c["task"]).rsplit("-s", 1)[0] for c in read_jsonl(a.run / "completions.jsonl")}
    for template in sorted(set(template_of.values())) or [None]:
        mine = [(x, r) for x, r in zip(xs, rewards, strict=True) if template is None or template_of.get(x) == template]
        ax.plot([x for x, _ in mine], [r for _, r in mine], "o", alpha=0.6, markersize=4,
                label=f"reward of a {template} step" if template else "reward (mean over the step's completions)")
    ax.plot(xs, moving_average(rewards, a.window), "-", label=f"reward, moving average of {a.window}")
    ax.plot(xs, moving_average(passes, a.window), "--", label=f"pass rate, moving average of {a.window}")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.legend(loc="upper left")
    fig.savefig(a.out / "reward.svg")
    plt.close(fig)

    fig, ax = new_figure()
    gen = [s["generation_s"] for s in steps]
    rew = [s["reward_wall_s"] for s in steps]
    opt = [s["optimizer_s"] for s in steps]
    ax.bar(xs, gen, label="generation")
    ax.bar(xs, rew, bottom=gen, label="sandbox reward (wall)")
    ax.bar(xs, opt, bottom=[g + r for g, r in zip(gen, rew, strict=True)], label="optimizer and the rest")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.legend(loc="upper left")
    fig.savefig(a.out / "step-time.svg")
    plt.close(fig)

    shares = {k: whatif(steps, k) for k in SPEEDUPS}
    both = {k: whatif(steps, k, optimizer_too=True) for k in SPEEDUPS}
    fig, ax = new_figure(5.5, 3.2)
    pos = list(range(len(SPEEDUPS)))
    ax.bar([i - 0.2 for i in pos], [100 * shares[k] for k in SPEEDUPS], width=0.4, label="generation k x faster")
    ax.bar([i + 0.2 for i in pos], [100 * both[k] for k in SPEEDUPS], width=0.4,
           label="generation and optimizer k x faster")
    for i, k in enumerate(SPEEDUPS):
        ax.annotate(f"{100 * shares[k]:.1f} %", (i - 0.2, 100 * shares[k]), ha="center", va="bottom")
        ax.annotate(f"{100 * both[k]:.1f} %", (i + 0.2, 100 * both[k]), ha="center", va="bottom")
    ax.set_xticks(pos, [f"{k}x" for k in SPEEDUPS])
    ax.legend(loc="upper left")
    ax.set_xlabel("speed-up k")
    ax.set_ylabel("sandbox reward, % of step time")
    fig.savefig(a.out / "whatif.svg")
    plt.close(fig)

    total = {k: round(sum(s[k] for s in steps), 1) for k in
             ("step_s", "generation_s", "reward_wall_s", "reward_cpu_s", "optimizer_s", "monitor_s")}
    report: dict[str, Any] = {
        "steps": len(steps), "totals_s": total,
        "mean_step_s": round(total["step_s"] / len(steps), 2),
        "share": {k: round(total[k] / total["step_s"], 3) for k in ("generation_s", "reward_wall_s", "optimizer_s",
                                                                     "monitor_s")},
        "sandbox_share_whatif": {f"{k}x": round(v, 4) for k, v in shares.items()},
        "sandbox_share_whatif_trainer": {f"{k}x": round(v, 4) for k, v in both.items()},
        "reward_first_last": [sum(rewards[:a.window]) / min(a.window, len(rewards)),
                              sum(rewards[-a.window:]) / min(a.window, len(rewards))],
        "pass_first_last": [sum(passes[:a.window]) / min(a.window, len(passes)),
                            sum(passes[-a.window:]) / min(a.window, len(passes))],
        "hacks_flagged": len(read_jsonl(a.run / "hacks.jsonl")),
        "load_avg_1m_mean": round(sum(s.get("load_avg_1m", 0) for s in steps) / len(steps), 2),
    }  # fmt: skip
    if a.base and a.trained:
        report["evaluation"] = evaluation(a.base, a.trained)
    (a.out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
