"""Old import path of the code reward: verl overrides rendered before the package re-shape name
`pkg://hpc_grpo.code_reward:compute_score`. New renders name hpc_grpo.rewards.code."""

from hpc_grpo.rewards.code import compute_score

__all__ = ["compute_score"]
