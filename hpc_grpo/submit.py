"""Old import path, kept for jobs queued before the package re-shape: their submitit folders hold a pickled
`hpc_grpo.submit.TrainJob`. New code imports hpc_grpo.launch.submit."""

from hpc_grpo.launch.submit import TrainJob

__all__ = ["TrainJob"]
