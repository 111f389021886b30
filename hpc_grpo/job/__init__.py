"""What runs inside a Slurm (or local) job, apart from the login-node commands.

Each module here is an entry point or a helper of one: the trl training job, the Ray start/join helpers of the
verl launch script, and the Ray probe driver. Nothing here is imported on the path of render, plan, status or prune.
"""
