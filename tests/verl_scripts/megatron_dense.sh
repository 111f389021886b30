#!/bin/bash
# GRPO on a dense 7B model with Megatron (TP 4, PP 2), two nodes of 8 GPUs; written for hpc-grpo's import tests
set -euo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=1
export HF_TOKEN=hf_not_a_real_token

NNODES=${NNODES:-2}
TP=4
PP=2
train_files="['/shared/data/gsm8k/train.parquet']"

python3 -m verl.trainer.main_ppo --config-path=config \
    --config-name='ppo_megatron_trainer.yaml' \
    algorithm.adv_estimator=grpo \
    data.train_files="$train_files" \
    data.val_files=/shared/data/gsm8k/test.parquet \
    data.train_batch_size=512 \
    data.max_prompt_length=1024 \
    data.max_response_length=2048 \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path=/shared/models/Qwen2.5-7B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$TP \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=$PP \
    actor_rollout_ref.actor.megatron.param_offload=True \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.ref.megatron.tensor_model_parallel_size=$TP \
    actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=$PP \
    actor_rollout_ref.ref.megatron.param_offload=True \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
    +actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=8 \
    trainer.logger=console \
    trainer.project_name=verl_megatron \
    trainer.experiment_name=qwen7b_tp4_pp2 \
    trainer.nnodes=$NNODES \
    trainer.n_gpus_per_node=8 \
    trainer.save_freq=50 \
    trainer.test_freq=10 \
    trainer.total_epochs=3 "$@"
