#!/usr/bin/env bash
# Lengths and token budgets from bash arithmetic (written for hpc-grpo's tests)
max_prompt_length=$((1024 * 2))
max_response_length=$(((1024 + 1024) * 2))
sp=2
token_len=$(( (max_prompt_length + max_response_length) / sp ))
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=/shared/data/gsm8k/train.parquet \
    data.val_files=/shared/data/gsm8k/test.parquet \
    data.train_batch_size=64 \
    data.max_prompt_length=$max_prompt_length \
    data.max_response_length=${max_response_length} \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$((max_prompt_length + max_response_length)) \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$token_len \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=4 \
    trainer.n_gpus_per_node=4
