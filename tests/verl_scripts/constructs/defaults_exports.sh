#!/usr/bin/env bash
# Defaults the user may override from the environment, and several export forms (written for hpc-grpo's tests)
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}
: "${ROLLOUT_N:=4}"
NGPUS=${NGPUS-4}
export VLLM_USE_V1=1 TOKENIZERS_PARALLELISM=false
NCCL_DEBUG=WARN
export NCCL_DEBUG
declare -x HYDRA_FULL_ERROR=1
RAY_LOG_TO_STDERR=1 python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=/shared/data/gsm8k/train.parquet \
    data.val_files=/shared/data/gsm8k/test.parquet \
    data.train_batch_size=64 \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=$ROLLOUT_N \
    trainer.n_gpus_per_node=$NGPUS
