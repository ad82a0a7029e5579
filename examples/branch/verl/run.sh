#!/usr/bin/env bash
# A verl 0.9.1 GRPO run on branched groups of the bundled task (docs/trees.md, "Trainers").
# Needs a GPU and a model (MODEL, default Qwen/Qwen2.5-0.5B-Instruct); not run on sandfleet's CPU host:
# tests/test_verl_tree.py runs the same agent loop, worker and estimator through verl's own
# generate_sequences and compute_advantage. The sandboxes use $SANDFLEET_BACKEND (default auto).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${DATA:-$here/data}
python "$here/make_data.py" "$data" 8
python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=sandfleet_tree \
  data.train_files="$data/train.parquet" data.val_files="$data/test.parquet" \
  data.train_batch_size=2 data.max_prompt_length=1024 data.max_response_length=2048 \
  actor_rollout_ref.model.path="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}" \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.val_kwargs.n=4 \
  actor_rollout_ref.rollout.agent.num_workers=1 \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$here/agent_loops.yaml" \
  actor_rollout_ref.rollout.agent.agent_loop_manager_class=sandfleet.integrations.verl_tree.TreeAgentLoopManager \
  actor_rollout_ref.actor.ppo_mini_batch_size=2 \
  trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps=2 trainer.logger=console "$@"
