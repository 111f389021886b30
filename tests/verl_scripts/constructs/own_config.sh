#!/usr/bin/env bash
# The script's own config beside it (--config-path + --config-name), extending verl's ppo_trainer (written for
# hpc-grpo's tests)
PROJECT_DIR="$(pwd)"
python3 -m verl.trainer.main_ppo \
    --config-path="$PROJECT_DIR/tests/verl_scripts/constructs/config" \
    --config-name='own_grpo' \
    algorithm.adv_estimator=grpo \
    data.train_files=/shared/data/gsm8k/train.parquet \
    data.val_files=/shared/data/gsm8k/test.parquet \
    data.train_batch_size=64 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.n=8 \
    trainer.n_gpus_per_node=4
