"""hpc-grpo: validated, rendered and resumable GRPO post-training jobs on Slurm clusters."""

__version__ = "0.1.0"
