#!/usr/bin/env bash
# if and case on values the script sets: followed (written for hpc-grpo's tests)
rollout_name=vllm
device=cuda
if [ "$rollout_name" = "vllm" ]; then
    GPU_UTIL=0.6
elif [[ $rollout_name == sglang ]]; then
    GPU_UTIL=0.5
else
    GPU_UTIL=0.4
fi
case $device in
    npu) N_GPUS=16 ;;
    cuda|gpu)
        N_GPUS=8
        ;;
    *) N_GPUS=1 ;;
esac
now() {
    date +%H%M
}
for f in a b; do echo "$f"; done
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
    actor_rollout_ref.rollout.name=$rollout_name \
    actor_rollout_ref.rollout.gpu_memory_utilization=$GPU_UTIL \
    trainer.n_gpus_per_node=$N_GPUS
