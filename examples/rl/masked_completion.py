"""What a masked completion (sandfleet's ``infra_fault``) contributes to TRL's GRPO update,
measured with TRL's own code (``trl==1.16.0``, CPU torch; docs/integrations.md, "The mask").

A group of 4 completions of one prompt is generated and scored by TRL's ``GRPOTrainer``
(a tiny random Llama, so that it runs in seconds on a CPU). The reward function is what
:class:`sandfleet.integrations.trl.SandfleetReward` returns for four rollouts whose verdicts
are scored (1.0), scored (0.0), policy_fault (0.0) and infra_fault (None, masked):
:func:`sandfleet.integrations.trl.reward_of` of real ``RolloutResult`` s settled by the
verdict rule. Then, with TRL's ``_generate_and_score_completions`` and ``compute_loss``:

- the group's statistics: TRL's advantages against the mean and std of the three unmasked
  rewards (the masked one left out), and the masked completion's advantage;
- gradients per completion: the loss with every other completion's ``completion_mask``
  zeroed (TRL's normaliser kept), so that the four gradients add up to the batch's; the
  masked completion's gradient, without KL (beta 0) and with KL (beta 0.04, the policy
  moved off its reference so that the KL term has a gradient);
- the loss normalisation: the unmasked completions' gradient in TRL's batch against the same
  batch with the masked completion removed from the normaliser (its ``completion_mask``
  zeroed, ``num_items_in_batch`` without its tokens), for ``loss_type`` dapo (TRL's default:
  tokens of the generation batch) and grpo (a mean over sequences).

    python examples/rl/masked_completion.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

G = 4
MASKED = 3
"""Which member of the group is the infra fault."""


def sandfleet_rewards() -> list[float | None]:
    """The reward function's values for four rollouts, through sandfleet's own verdict rule."""
    from sandfleet.integrations.trl import reward_of
    from sandfleet.rollout.result import RolloutResult

    def result(status: str, reward: float | None, reason: str | None = None, error: str | None = None,
               phase: str | None = None) -> RolloutResult:
        return RolloutResult("t#0", "t", "t", 0, "trl-script", "bwrap", 0.0, 1.0, status, [],  # type: ignore[arg-type]
                             reward=reward, reason=reason, error=error, info={"phase": phase} if phase else {})

    killed = ("sandbox sf-1: the guest agent closed its stream; its process was killed by SIGKILL; "
              "its log ends: agent: serving")
    from sandfleet.errors import SandboxDiedError
    from sandfleet.rollout.verdict import settle

    results = [result("completed", 1.0), result("completed", 0.0),
               result("failed", None, "reward_missing", "no reward file", "verifier"),
               result("failed", None, "sandbox_died", killed, "agent")]
    # a verdict comes from the error's type (rollout/verdict.py), as the runner settles it
    settle(results[3], SandboxDiedError(killed))
    return [reward_of(r) for r in results]


def tiny_model(root: Path) -> str:
    """A 1-layer random Llama and a character-level tokenizer, saved under ``root``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = "abcdefghijklmnopqrstuvwxyz "
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=1, bos_token_id=None)
    LlamaForCausalLM(config).save_pretrained(root)
    tok.save_pretrained(root)
    return str(root)


def trainer_for(model_path: str, out: Path, *, beta: float, loss_type: str) -> Any:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rewards = sandfleet_rewards()

    def sandfleet(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [rewards[i % G] for i in range(len(completions))]

    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=G, num_generations=G,
                      max_completion_length=12, beta=beta, loss_type=loss_type, use_cpu=True, report_to=[],
                      max_steps=1, logging_steps=1, temperature=1.0, seed=0, save_strategy="no")
    torch.manual_seed(0)
    trainer = GRPOTrainer(model=model_path, reward_funcs=[sandfleet], args=args,
                          train_dataset=Dataset.from_list([{"prompt": "abc "}] * G))
    if beta:  # move the policy off its reference (as after some steps), so that the KL term has a gradient
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for p in trainer.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    trainer.model.train()
    if not hasattr(trainer, "current_gradient_accumulation_steps"):  # set by the training loop
        trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer


def grads(trainer: Any, batch: dict[str, Any]) -> Any:
    """The flattened gradient of TRL's loss on ``batch``."""
    import torch

    trainer.model.zero_grad()
    trainer.compute_loss(trainer.model, batch).backward()
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                      for p in trainer.model.parameters()])


def only(batch: dict[str, Any], keep: list[int], items: Any = None) -> dict[str, Any]:
    """``batch`` with the completion mask of every row outside ``keep`` zeroed (the normaliser
    ``num_items_in_batch`` kept, or ``items``)."""
    out = dict(batch)
    mask = batch["completion_mask"].clone()
    for i in range(mask.shape[0]):
        if i not in keep:
            mask[i] = 0
    out["completion_mask"] = mask
    if items is not None:
        out["num_items_in_batch"] = items
    return out


def measure(model_path: str, out: Path, *, beta: float, loss_type: str) -> dict[str, Any]:
    trainer = trainer_for(model_path, out, beta=beta, loss_type=loss_type)
    batch = trainer._generate_and_score_completions([{"prompt": "abc "}] * G)
    adv = batch["advantages"].tolist()
    lengths = batch["completion_mask"].sum(-1).tolist()
    rewards = sandfleet_rewards()
    kept = [r for r in rewards if r is not None]
    mean = sum(kept) / len(kept)
    std = (sum((r - mean) ** 2 for r in kept) / (len(kept) - 1)) ** 0.5  # TRL's nanstd: unbiased
    expected = [0.0 if r is None else (r - mean) / (std + 1e-4) for r in rewards]
    full = grads(trainer, batch)
    per = [grads(trainer, only(batch, [i])) for i in range(G)]
    others = [i for i in range(G) if i != MASKED]
    unmasked = grads(trainer, only(batch, others))
    without = grads(trainer, only(batch, others, batch["num_items_in_batch"] - lengths[MASKED]))
    if loss_type == "grpo":  # a mean over the batch's sequences: the masked one is 1 of G
        without = unmasked * G / (G - 1)
    return {
        "beta": beta, "loss_type": loss_type, "rewards": rewards, "advantages": adv,
        "advantages_expected_without_masked": expected,
        "group_stats_exclude_masked": all(abs(a - e) < 1e-3 for a, e in zip(adv, expected, strict=True)),
        "completion_tokens": lengths,
        "grad_norm_batch": float(full.norm()),
        "grad_norm_per_completion": [float(g.norm()) for g in per],
        "per_completion_sum_rel_err": float((sum(per) - full).abs().max() / full.abs().max()),
        "masked_grad_norm": float(per[MASKED].norm()),
        "masked_grad_share": float(per[MASKED].norm() / full.norm()) if float(full.norm()) else 0.0,
        "unmasked_grad_scale_vs_masked_removed": float(unmasked.norm() / without.norm()) if float(without.norm())
        else None,
        "masked_token_share": lengths[MASKED] / sum(lengths),
    }


def main() -> None:
    import trl

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures here too")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sandfleet-trl-mask-") as tmp:
        path = tiny_model(Path(tmp) / "model")
        runs = [measure(path, Path(tmp) / f"run{i}", beta=beta, loss_type=lt)
                for i, (beta, lt) in enumerate([(0.0, "dapo"), (0.04, "dapo"), (0.0, "grpo"), (0.04, "grpo")])]
    figures = {"trl": trl.__version__, "group_size": G, "masked_member": MASKED, "runs": runs}
    text = json.dumps(figures, indent=2)
    sys.stdout.write(text + "\n")
    if a.json:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
