#!/usr/bin/env bash
# A value set where only running the script decides: the import refuses to guess (written for hpc-grpo's tests)
if [ -n "$SLURM_JOB_ID" ]; then
    NNODES=$SLURM_NNODES
else
    NNODES=1
fi
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    trainer.nnodes=$NNODES
