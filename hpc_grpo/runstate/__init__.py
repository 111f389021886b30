"""A run directory on disk: its layout, job history, checkpoints, metrics, restart causes and retention."""
