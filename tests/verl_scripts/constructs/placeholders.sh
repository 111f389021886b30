#!/usr/bin/env bash
# Values the script's author left for its user to fill (written for hpc-grpo's tests)
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=/path/to/train.parquet \
    data.val_files=/path/to/test.parquet \
    data.train_batch_size=64 \
    actor_rollout_ref.model.path=<path_to_your_model> \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm \
    trainer.project_name=TODO \
    trainer.n_gpus_per_node=4
