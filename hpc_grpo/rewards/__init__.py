"""Reward functions verl and trl call: GSM8K (gsm8k) and sandboxed code execution (code).

`compute_score` here is the GSM8K scorer under its pre-0.2 address: runs rendered before the move name
`pkg://hpc_grpo.rewards` in their frozen verl overrides.
"""

from hpc_grpo.rewards.gsm8k import compute_score

__all__ = ["compute_score"]
