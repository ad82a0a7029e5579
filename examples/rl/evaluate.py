"""Pass@1 of a model on sandfleet tasks, single turn (docs/rl.md).

    python examples/rl/evaluate.py --tasks tasks/eval --samples 8 --out runs/eval-base
    python examples/rl/evaluate.py --tasks tasks/eval --model runs/grpo/final --samples 8 --out runs/eval-trained
    python examples/rl/evaluate.py --tasks tasks/train --calibrate 8 --out runs/calibration

Each (task, sample) is one completion, sampled as in training (same prompt, temperature and
length), run in a fresh sandbox and scored by the task's verifier. Writes ``results.jsonl``
(one line per completion), ``trace.jsonl`` (the rollouts) and ``summary.json``: the pass rate
(reward 1) and mean reward, overall with a bootstrap 95% CI over tasks x samples, and per
template. ``--calibrate K`` takes K samples per template, spread over its tasks, and writes
``calibration.json`` (``pass_at_1`` per template) for train_grpo.py --calibration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rlcommon import DEFAULT_MODEL, TEMPERATURE, TOP_K, load_model, set_threads, task_rows  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=Path, required=True)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--samples", type=int, default=8, help="Completions per task.")
    p.add_argument("--calibrate", type=int, default=None, metavar="K", help="K completions per template instead.")
    p.add_argument("--templates", default=None)
    p.add_argument("--max-completion-length", type=int, default=48)
    p.add_argument("--temperature", type=float, default=TEMPERATURE)
    p.add_argument("--top-k", type=int, default=TOP_K)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--sandbox-cpus", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=2)
    a = p.parse_args(argv)
    set_threads(a.torch_threads)
    import numpy as np
    import torch

    from sandfleet.integrations.trl import Runner, SandfleetReward, completion_text, extract_script
    from sandfleet.stats import bootstrap_ci

    a.out.mkdir(parents=True, exist_ok=True)
    rows = task_rows(a.tasks, set(a.templates.split(",")) if a.templates else None)
    work: list[tuple[dict[str, Any], int]] = []
    if a.calibrate:
        for template in sorted({r["template"] for r in rows}):
            mine = [r for r in rows if r["template"] == template]
            work += [(mine[i % len(mine)], i // len(mine)) for i in range(a.calibrate)]
    else:
        work = [(r, s) for r in rows for s in range(a.samples)]
    torch.manual_seed(a.seed)
    model, tok = load_model(a.model)
    model.eval()
    tok.padding_side = "left"
    traces = (a.out / "trace.jsonl").open("w")

    def keep(r: Any) -> None:
        traces.write(json.dumps(r.to_trace()) + "\n")
        traces.flush()

    reward = SandfleetReward(concurrency=a.concurrency, runner=Runner(cpus=a.sandbox_cpus, on_result=keep,
                                                                      run_id=a.out.name))  # fmt: skip
    results = (a.out / "results.jsonl").open("w")
    gen_s = reward_s = 0.0
    t_start = time.time()
    for start in range(0, len(work), a.batch):
        chunk = work[start:start + a.batch]
        texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r, _ in chunk]
        enc = tok(texts, return_tensors="pt", padding=True)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=a.temperature, top_p=1.0, top_k=a.top_k,
                                 max_new_tokens=a.max_completion_length, pad_token_id=tok.pad_token_id)  # fmt: skip
        gen_s += time.perf_counter() - t0
        completions = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        t0 = time.perf_counter()
        values = asyncio.run(reward(completions=completions, sandfleet_task=[r["sandfleet_task"] for r, _ in chunk]))
        reward_s += time.perf_counter() - t0
        for (r, s), c, v in zip(chunk, completions, values, strict=True):
            results.write(json.dumps({"task": Path(r["sandfleet_task"]).name, "template": r["template"], "sample": s,
                                      "reward": v, "passed": v >= 1,
                                      "script": extract_script(completion_text(c))[:1000]}) + "\n")  # fmt: skip
        results.flush()
        print(f"{start + len(chunk)}/{len(work)} done, gen {gen_s:.0f}s reward {reward_s:.0f}s", flush=True)  # noqa: T201
    results.close()
    traces.close()
    rows_out = [json.loads(line) for line in (a.out / "results.jsonl").read_text().splitlines()]
    passed = [float(x["passed"]) for x in rows_out]
    rewards = [float(x["reward"]) for x in rows_out]
    per_template = {}
    for template in sorted({x["template"] for x in rows_out}):
        mine = [x for x in rows_out if x["template"] == template]
        per_template[template] = {"n": len(mine), "pass_rate": float(np.mean([x["passed"] for x in mine])),
                                  "reward_mean": float(np.mean([x["reward"] for x in mine]))}
    summary = {
        "model": a.model, "tasks": str(a.tasks), "completions": len(rows_out),
        "task_count": len({x["task"] for x in rows_out}), "samples_per_task": None if a.calibrate else a.samples,
        "pass_rate": float(np.mean(passed)), "pass_rate_ci95": bootstrap_ci(passed, np.mean),
        "reward_mean": float(np.mean(rewards)), "reward_mean_ci95": bootstrap_ci(rewards, np.mean),
        "per_template": per_template, "generation_s": gen_s, "reward_s": reward_s, "wall_s": time.time() - t_start,
        "max_completion_length": a.max_completion_length, "temperature": a.temperature,
        "top_k": a.top_k, "seed": a.seed,
        "load_avg": os.getloadavg(),
    }  # fmt: skip
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    if a.calibrate:
        cal = {"pass_at_1": {t: v["pass_rate"] for t, v in per_template.items()}, "samples_per_template": a.calibrate,
               "reward_mean": {t: v["reward_mean"] for t, v in per_template.items()}}  # fmt: skip
        (a.out / "calibration.json").write_text(json.dumps(cal, indent=1))
    print(json.dumps(summary, indent=1))  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
