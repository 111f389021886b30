#!/usr/bin/env bash
# Overrides kept in bash arrays, the trainer started through a launcher array (written for hpc-grpo's tests)
set -euo pipefail
ACTOR_LR=2e-6
LAUNCH=(python3 -m verl.trainer.main_ppo)
DATA=(
    data.train_files=/shared/data/gsm8k/train.parquet
    data.val_files=/shared/data/gsm8k/test.parquet
    data.train_batch_size=64
    # a comment inside the array
    data.max_prompt_length=512
    data.max_response_length=1024
)
ACTOR=(
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct
    actor_rollout_ref.actor.optim.lr=${ACTOR_LR}
    actor_rollout_ref.actor.ppo_mini_batch_size=32
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
)
ACTOR+=(actor_rollout_ref.actor.use_kl_loss=True)
ROLLOUT=(
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=4
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
    'trainer.logger=["console"]'
)
"${LAUNCH[@]}" algorithm.adv_estimator=grpo "${DATA[@]}" "${ACTOR[@]}" "${ROLLOUT[@]}" \
    trainer.n_gpus_per_node=4 trainer.nnodes=1 "$@" 2>&1 | tee train.log
