"""The cluster itself: every Slurm command (slurm) and the parsing of their output (slurm_output), job states and
their causes (states), #SBATCH options and dependencies (sbatch), the job's own SLURM_* environment (job_env),
what its nodes allow the code sandbox (isolation), and which cluster profile a command means when none is typed
(clusterpick: its last resort asks this machine's Slurm)."""
