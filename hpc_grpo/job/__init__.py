"""What runs inside a Slurm (or local) job, apart from the login-node commands.

Each module here is an entry point or a helper of one: the trl training job, one node of a verl job
(verl_node, with its decisions in node_plan; where the node is comes from hpc_grpo.cluster.job_env) and its Ray
start/join helpers, and the Ray probe driver (the code sandbox's runner is hpc_grpo.sandbox). Nothing here is imported on the path of render, plan, status or prune.
"""
