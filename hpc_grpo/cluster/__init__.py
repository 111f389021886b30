"""The cluster itself: every Slurm command and every SLURM_* variable go through here."""
