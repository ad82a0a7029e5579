"""GRPO with TRL on sandfleet rewards, on CPU (docs/rl.md).

    python examples/rl/train_grpo.py --tasks tasks/train --steps 40 --out runs/grpo --seed 0

Writes to --out:
- ``metrics.jsonl``: one line per step: ``step``, ``reward_mean``, ``reward_std``, ``pass_rate``
  (share of completions with reward 1), ``kl`` (when --beta > 0), and the step's time split:
  ``generation_s``, ``reward_wall_s`` and ``reward_cpu_s`` (the sandboxes), ``optimizer_s`` (the
  rest of the step: log-probs, forward/backward, optimizer), ``step_s``, plus ``monitor_s``;
- ``trace.jsonl``: every sandbox rollout (sandfleet's trace schema: ``sandfleet analyze OUT``);
- ``completions.jsonl``: each completion's step, task, script and reward;
- ``hacks.jsonl``: what the reward-hacking monitor flagged (sandfleet.integrations.trl.HackMonitor);
- ``checkpoint-N/`` every --save-every steps (--resume continues from the last), ``final/``;
- ``run.json``: the arguments, versions, thread count and sandbox CPU quota.

With ``--branch TURN:WIDTH[,...]`` each GRPO group is ``num_generations / leaves`` trees
(docs/trees.md): the model takes turns in a sandbox (fenced bash blocks, the output as the next
user turn), the sandbox and conversation split at TURN into WIDTH children that sample on, and
every leaf is scored by the task's verifier (sandfleet.integrations.trl.TreeRollout, TRL's
``rollout_func``). The loss gets a per-token advantage: TRL's group advantage plus the tree
advantage of the turn the token was sampled in (``--tree-combine``); each step's line has
``tree``: per leaf its node, reward and per-turn tree advantages.
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
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from rlcommon import (  # noqa: E402
    BRANCH_SYSTEM,
    DEFAULT_MODEL,
    MULTI_TURN_SYSTEM,
    TEMPERATURE,
    TOP_K,
    load_model,
    read_jsonl,
    set_threads,
    task_rows,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=Path, required=True, help="A folder of task folders (e.g. generated train/).")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"{DEFAULT_MODEL} (the GGUF) or a model folder.")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--multi-turn", action="store_true", help="SandfleetBashEnv with a bash tool (plumbing: a 135M "
                   "model rarely makes well-formed tool calls).")
    p.add_argument("--resume", action="store_true", help="Continue from the last checkpoint in --out.")
    p.add_argument("--smoke", action="store_true", help="Tiny lengths and batches (tests).")
    p.add_argument("--templates", default=None, help="Comma-separated templates to train on (default: all).")
    p.add_argument("--calibration", type=Path, default=None,
                   help="calibration.json from evaluate.py --calibrate: train on its templates with 0 < pass@1 < 1.")
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=48)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0: no reference model).")
    p.add_argument("--temperature", type=float, default=TEMPERATURE)
    p.add_argument("--top-k", type=int, default=TOP_K)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--sandbox-cpus", type=float, default=1.0, help="Each sandbox's CPU quota (cgroup).")
    p.add_argument("--concurrency", type=int, default=2, help="Sandboxes at once.")
    p.add_argument("--no-monitor", action="store_true", help="Skip the reward-hacking monitor.")
    p.add_argument("--branch", default=None, help="TURN:WIDTH[,TURN:WIDTH...]: each group is trees that split "
                   "at those agent turns (num_generations must be a multiple of the leaves per tree).")
    p.add_argument("--tree-combine", choices=("sum", "tree", "group"), default="sum",
                   help="With --branch: the per-token advantage is TRL's group advantage plus the turn's tree "
                   "advantage (sum), the tree advantage alone (tree), or the group advantage alone (group).")
    a = p.parse_args(argv)
    if a.smoke:
        a.prompts_per_step, a.num_generations, a.max_completion_length = 1, 2, 16
        a.save_every = min(a.save_every, 1)
    if a.branch:
        from sandfleet.rollout.tree import parse_branch

        if a.multi_turn:
            p.error("--branch and --multi-turn are two ways to take turns: give one")
        leaves = parse_branch(a.branch).leaves
        if a.smoke:
            a.num_generations = leaves
        if a.num_generations % leaves:
            p.error(f"--branch {a.branch} grows {leaves} leaves per tree: --num-generations "
                    f"({a.num_generations}) must be a multiple of it")
        a.no_monitor = True  # the monitor re-runs single scripts; a leaf is a conversation
    return a


class JsonlSink:
    def __init__(self, path: Path):
        self.f = path.open("a")

    def write(self, row: dict[str, Any]) -> None:
        self.f.write(json.dumps(row) + "\n")
        self.f.flush()


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    set_threads(a.torch_threads)
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from sandfleet.integrations.trl import (
        HackMonitor,
        Runner,
        SandfleetBashEnv,
        SandfleetReward,
        completion_text,
        cpu_seconds,
        extract_script,
        resolve_task,
    )

    a.out.mkdir(parents=True, exist_ok=True)
    if not a.resume and (a.out / "metrics.jsonl").exists():
        raise SystemExit(f"{a.out} holds a run already: pass --resume to continue it, or a new --out")
    templates = set(a.templates.split(",")) if a.templates else None
    if a.calibration is not None:
        cal = json.loads(a.calibration.read_text())
        templates = {t for t, r in cal["pass_at_1"].items() if 0 < r < 1}
    rows = task_rows(a.tasks, templates)
    if a.multi_turn:  # reset() appends the instruction to the last user message
        for r in rows:
            r["prompt"] = [{"role": "system", "content": MULTI_TURN_SYSTEM}, {"role": "user", "content": "Task:"}]
    torch.manual_seed(a.seed)
    model, tok = load_model(a.model)

    if a.branch:  # the agent's system prompt: fenced blocks, one turn after another
        for r in rows:
            r["prompt"] = [{"role": "system", "content": BRANCH_SYSTEM}, *r["prompt"][1:]]  # the worked examples kept
    traces, completions_log, hacks, metrics = (JsonlSink(a.out / n) for n in
                                               ("trace.jsonl", "completions.jsonl", "hacks.jsonl", "metrics.jsonl"))
    step_info: dict[str, Any] = {}

    def keep(result: Any) -> None:
        traces.write(result.to_trace())
        if result.agent == "trl-bash-env":  # a multi-turn episode: its reward is get_reward()'s
            step_info["n"] = step_info.get("n", 0) + 1
            step_info["passed"] = step_info.get("passed", 0) + float((result.reward or 0) >= 1)

    runner = Runner(cpus=a.sandbox_cpus, on_result=keep, run_id=a.out.name)
    monitor = None if a.no_monitor else HackMonitor(runner)
    reward = SandfleetReward(concurrency=a.concurrency, runner=runner)

    async def scored(prompts: Any = None, completions: Any = None, sandfleet_task: Any = None, **kw: Any) -> Any:
        values = await reward(prompts=prompts, completions=completions, sandfleet_task=sandfleet_task, **kw)
        step = getattr(kw.get("trainer_state"), "global_step", -1) + 1
        step_info["reward_wall_s"] = step_info.get("reward_wall_s", 0.0) + reward.last.wall_s
        step_info["reward_cpu_s"] = step_info.get("reward_cpu_s", 0.0) + reward.last.cpu_s
        step_info["n"] = step_info.get("n", 0) + len(values)
        step_info["passed"] = step_info.get("passed", 0) + sum(v >= 1 for v in values)
        for c, t, v in zip(completions, sandfleet_task, values, strict=True):
            completions_log.write({"step": step, "task": Path(t).name, "reward": v,
                                   "script": extract_script(completion_text(c))[:1000]})
        if monitor is not None:
            t0 = time.perf_counter()
            flags = await asyncio.gather(*(monitor.check(resolve_task(t), extract_script(completion_text(c)), v)
                                           for c, t, v in zip(completions, sandfleet_task, values, strict=True)))
            for f in flags:
                if f is not None:
                    hacks.write({"step": step, **f})
            step_info["hacks"] = step_info.get("hacks", 0) + sum(f is not None for f in flags)
            step_info["monitor_s"] = step_info.get("monitor_s", 0.0) + time.perf_counter() - t0
        return values

    scored.__name__ = "sandfleet"
    tree = None
    if a.branch:
        from sandfleet.integrations.trl import HFEngine, TreeRollout, tree_reward

        def engine(trainer: Any) -> Any:
            return HFEngine(trainer.accelerator.unwrap_model(trainer.model), tok, temperature=a.temperature,
                            top_k=a.top_k, max_tokens=a.max_completion_length)

        tree = TreeRollout(engine, a.branch, rows, runner=runner, seed=a.seed)

        def tree_scored(prompts: Any = None, completions: Any = None, **kw: Any) -> Any:
            t0 = time.perf_counter()
            values = tree_reward(prompts=prompts, completions=completions, **kw)
            counted = [v for v in values if v is not None]
            step_info["n"] = step_info.get("n", 0) + len(counted)
            step_info["passed"] = step_info.get("passed", 0) + sum(v >= 1 for v in counted)
            step = getattr(kw.get("trainer_state"), "global_step", -1) + 1
            leaves = []
            for row in tree.rows if tree is not None else []:
                if row.leaf is None:
                    continue
                leaf = row.leaf
                leaves.append({"rollout_id": leaf.rollout_id, "node": (leaf.tree or {}).get("node_id"),
                               "reward": row.reward, "verdict": leaf.verdict, "turns": leaf.turns,
                               "tree_advantages": leaf.tree_advantages})
                completions_log.write({"step": step, "task": leaf.task, "reward": row.reward,
                                       "rollout_id": leaf.rollout_id, "tree_advantages": leaf.tree_advantages})
            step_info["tree"] = leaves
            step_info["reward_wall_s"] = step_info.get("reward_wall_s", 0.0) + time.perf_counter() - t0
            return values

        tree_scored.__name__ = "sandfleet"

    base: Any = GRPOTrainer
    if a.branch:
        from sandfleet.integrations.trl import tree_trainer

        base = tree_trainer(a.tree_combine)

    class Timed(base):  # type: ignore[misc,valid-type]
        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._generate(*args, **kwargs)
            finally:  # with --branch this is the whole tree: sampling, commands and verifiers
                step_info["generation_s"] = step_info.get("generation_s", 0.0) + time.perf_counter() - t0

        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
            if not a.multi_turn:  # single turn: the reward function times itself
                return super()._calculate_rewards(*args, **kwargs)
            # multi-turn: the bash tool's sandbox time is inside generation; the verifier
            # and close (get_reward) are here
            t0, cpu0 = time.perf_counter(), cpu_seconds()
            try:
                return super()._calculate_rewards(*args, **kwargs)
            finally:
                step_info["reward_wall_s"] = step_info.get("reward_wall_s", 0.0) + time.perf_counter() - t0
                step_info["reward_cpu_s"] = step_info.get("reward_cpu_s", 0.0) + cpu_seconds() - cpu0

    class Record(TrainerCallback):  # type: ignore[misc]
        t0 = 0.0
        done: dict[str, Any] = {}

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step_info.clear()
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            total = time.perf_counter() - self.t0
            gen, rw, mon = (step_info.get(k, 0.0) for k in ("generation_s", "reward_wall_s", "monitor_s"))
            n = step_info.get("n", 0)
            self.done = {"step": state.global_step, "step_s": round(total, 3), "generation_s": round(gen, 3),
                         "reward_wall_s": round(rw, 3), "reward_cpu_s": round(step_info.get("reward_cpu_s", 0.0), 3),
                         "monitor_s": round(mon, 3), "optimizer_s": round(total - gen - rw - mon, 3),
                         "pass_rate": step_info.get("passed", 0) / n if n else None, "completions": n,
                         "hacks": step_info.get("hacks", 0), "load_avg_1m": os.getloadavg()[0], "time": time.time()}
            if "tree" in step_info:  # --branch: each leaf's node, reward and per-turn tree advantages
                self.done["tree"] = step_info["tree"]
                adv = getattr(trainer, "tree_advantages", None)
                if adv is not None:
                    self.done["token_advantage_range"] = [round(float(adv.min()), 4), round(float(adv.max()), 4)]

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if not self.done or logs is None or "reward" not in logs:
                return
            row = dict(self.done)
            row["reward_mean"] = logs.get("reward")
            row["reward_std"] = logs.get("reward_std")
            if "kl" in logs:
                row["kl"] = logs["kl"]
            for k in ("loss", "entropy", "completions/mean_length", "frac_reward_zero_std", "learning_rate"):
                if k in logs:
                    row[k.replace("completions/", "completion_")] = logs[k]
            metrics.write(row)
            self.done = {}
            print(json.dumps(row), flush=True)  # noqa: T201

    config = GRPOConfig(
        output_dir=str(a.out), use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=a.prompts_per_step * a.num_generations, num_generations=a.num_generations,
        gradient_accumulation_steps=1, max_completion_length=a.max_completion_length, max_steps=a.steps,
        logging_steps=1, report_to="none", save_strategy="steps", save_steps=a.save_every, save_total_limit=1,
        learning_rate=a.lr, beta=a.beta, temperature=a.temperature, top_k=a.top_k, top_p=1.0,
        seed=a.seed, data_seed=a.seed,
        dataloader_num_workers=0, max_tool_calling_iterations=4 if a.multi_turn else None,
        log_completions=False, disable_tqdm=True,
    )  # fmt: skip
    dataset = Dataset.from_list(rows)
    kwargs: dict[str, Any] = {}
    if a.multi_turn:
        from trl.chat_template_utils import qwen2_5_chat_template

        tok.chat_template = qwen2_5_chat_template  # SmolLM2's ChatML template has no tool support
        SandfleetBashEnv.runner = runner
        kwargs["environment_factory"] = SandfleetBashEnv
        reward_funcs: list[Any] = []
    elif tree is not None:
        reward_funcs = [tree_scored]
        kwargs["rollout_func"] = tree
    else:
        reward_funcs = [scored]
    (a.out / "run.json").write_text(json.dumps({
        "argv": sys.argv, "args": {k: str(v) for k, v in vars(a).items()}, "tasks": len(rows),
        "templates": sorted({r["template"] for r in rows}), "torch": torch.__version__, "trl": trl.__version__,
        "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(),
        "sandbox_cpus": a.sandbox_cpus, "concurrency": a.concurrency, "cpu_count": os.cpu_count(),
        "start": time.time(), "load_avg": os.getloadavg(),
    }, indent=1))  # fmt: skip
    trainer = Timed(model=model, processing_class=tok, reward_funcs=reward_funcs, args=config,
                    train_dataset=dataset, callbacks=[Record()], **kwargs)  # fmt: skip
    resume = None
    if a.resume:
        ckpts = sorted(a.out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        if not ckpts:
            raise SystemExit(f"--resume: no checkpoint-N in {a.out}")
        resume = str(ckpts[-1])
    t0 = time.time()
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        SandfleetBashEnv.close_all()
        if tree is not None:
            tree.close()
    trainer.save_model(str(a.out / "final"))
    tok.save_pretrained(str(a.out / "final"))
    steps = read_jsonl(a.out / "metrics.jsonl")
    summary = {"wall_s": time.time() - t0, "steps": len(steps), "end": time.time(), "load_avg": os.getloadavg()}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
