#!/usr/bin/env bash
# Values only running the script would know: never run by the import (written for hpc-grpo's tests)
NGPUS=$(nproc)
STAMP=`date +%Y%m%d`
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=/shared/data/gsm8k/train.parquet \
    data.val_files=/shared/data/gsm8k/test.parquet \
    data.train_batch_size=64 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm \
    trainer.experiment_name=grpo_$STAMP \
    trainer.n_gpus_per_node=$NGPUS
