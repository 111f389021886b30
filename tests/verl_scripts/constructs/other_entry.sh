#!/usr/bin/env bash
# A trainer other than main_ppo (DAPO's entry point) with keys of its own (written for hpc-grpo's tests)
python3 -m recipe.dapo.main_dapo \
    algorithm.adv_estimator=grpo \
    algorithm.filter_groups.enable=True \
    data.train_files=/shared/data/gsm8k/train.parquet \
    data.val_files=/shared/data/gsm8k/test.parquet \
    data.train_batch_size=64 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm \
    reward_model.overlong_buffer.enable=True \
    reward_model.overlong_buffer.len=512 \
    trainer.n_gpus_per_node=4
