"""The code sandbox: the runner that executes model-written code for the code reward (code_sandbox), the judge
process that runs the tests and calls the code through proxies (sandbox_judge), the plain data that crosses between
them (sandbox_values), how the code is isolated (sandbox_namespaces) and its kernel settings (sandbox_kernel).

Standard library only and importing nothing of hpc_grpo: the runner starts as its own `python -I -S` process and
loads its siblings by file path (hpc_grpo.cluster.isolation.SANDBOX names the runner's file). Plan states its
memory rule, so the package sits in the rewards/data layer.
"""
