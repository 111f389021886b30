"""The cluster itself: every Slurm command and SLURM_* variable (slurm), and what its nodes allow the code sandbox (isolation)."""
