"""Old import path, kept for eval jobs queued before the package re-shape: their submitit folders hold a pickled
`hpc_grpo.evaluate.EvalJob`. New code imports hpc_grpo.evaluation.evaluate."""

from hpc_grpo.evaluation.evaluate import EvalJob

__all__ = ["EvalJob"]
