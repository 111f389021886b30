#!/usr/bin/env bash
# A comment line inside a continued command: bash ends the call there (written for hpc-grpo's tests)
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    # the learning rate
    actor_rollout_ref.actor.optim.lr=1e-6 \
    trainer.n_gpus_per_node=4
