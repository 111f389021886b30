"""The code sandbox: the runner that executes model-written code for the code reward (code_sandbox), how it is
isolated (sandbox_namespaces) and its kernel settings (sandbox_kernel).

Standard library only and importing nothing of hpc_grpo: the runner starts as its own `python -I -S` process and
loads its two siblings by file path (hpc_grpo.cluster.isolation.SANDBOX names the runner's file). The rewards
import the runner's encoder and plan its memory rule, so the package sits in the rewards/data layer.
"""
