"""Opt-in (marker ``rl``; scripts/test-integrations.sh rl): a branched group through TRL 1.16's
own GRPOTrainer (issue 44). TreeRollout is the trainer's rollout_func over the bundled branch
example (examples/branch, --branch 2:4) with a scripted token engine and real sandboxes;
tree_trainer's advantage is per token: TRL's group advantage plus the tree advantage of the
turn the token was sampled in; the loss takes it and has a gradient. Skips without torch/trl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from test_rollout_support import needs_bwrap

pytestmark = [pytest.mark.rl, needs_bwrap(),  # TRL and transformers warn about their own deprecations
              pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]
pytest.importorskip("torch")
pytest.importorskip("trl")

BRANCH = Path(__file__).resolve().parents[1] / "examples" / "branch"


def char_model(root: Path) -> str:
    """A 1-layer random Llama over CharEngine's tokens (a character's code point + 1; 0 ends a turn)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<eos>": 0, **{chr(i): i + 1 for i in range(32, 127)}, "\n": 11, "<pad>": 200, "<unk>": 201}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         pad_token_id=200, eos_token_id=0, bos_token_id=None)
    LlamaForCausalLM(config).save_pretrained(root)
    tok.save_pretrained(root)
    return str(root)


def test_tree_trainer_takes_per_token_tree_advantages(tmp_path: Path) -> None:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig

    from sandfleet.integrations._common import Settings
    from sandfleet.integrations.trl import Runner, TreeRollout, tree_reward, tree_trainer
    from sandfleet.testing.token_engine import CharEngine

    task = BRANCH / "tasks" / "branch-demo"
    script = json.loads((BRANCH / "script.json").read_text())
    rows = [{"prompt": [{"role": "user", "content": (task / "instruction.md").read_text()}],
             "sandfleet_task": str(task)}]
    rollout = TreeRollout(CharEngine(script), "2:4", rows, runner=Runner(settings=Settings(backend="bwrap")))
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=2048, beta=0.0, use_cpu=True, report_to=[], max_steps=1,
                      logging_steps=1, seed=0, save_strategy="no", bf16=False)
    trainer: Any = tree_trainer("sum")(model=char_model(tmp_path / "m"), reward_funcs=[tree_reward], args=args,
                                       train_dataset=Dataset.from_list(rows * 4), rollout_func=rollout)
    trainer.model.train()
    if not hasattr(trainer, "current_gradient_accumulation_steps"):
        trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    try:
        batch = trainer._generate_and_score_completions([dict(r) for r in rows * 4])
    finally:
        rollout.close()
    adv = batch["advantages"]
    assert adv.dim() == 2 and adv.shape == batch["completion_ids"].shape  # (B, T): per token
    rewards = [r.reward for r in rollout.rows]
    assert sorted(rewards) == [0.0, 0.0, 1.0, 1.0]  # type: ignore[type-var]
    mean = 0.5
    std = float(torch.tensor(rewards).std())  # TRL's nanstd: unbiased
    for i, row in enumerate(rollout.rows):
        assert row.reward is not None and row.leaf is not None
        group = (row.reward - mean) / (std + 1e-4)
        n = len(row.completion_ids)
        assert batch["completion_ids"][i, :n].tolist() == row.completion_ids
        got = adv[i, :n].tolist()
        for a, tree, m in zip(got, row.tree_advantages, row.env_mask, strict=True):
            if m:  # the model's tokens: TRL's group term plus its turn's tree term
                assert a == pytest.approx(group + tree, abs=1e-5)
        own = {round(t, 6) for t, m in zip(row.tree_advantages, row.env_mask, strict=True) if m}
        assert own == {0.0, round(row.reward - mean, 6)}  # turns 1-2 the root's (0), turn 3 its own
        assert batch["tool_mask"][i, :n].tolist() == row.env_mask  # the output is out of the loss
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    assert torch.isfinite(loss) and any(p.grad is not None and p.grad.abs().sum() > 0
                                        for p in trainer.model.parameters())
