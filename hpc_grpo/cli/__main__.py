"""`python -m hpc_grpo.cli ...`, as the installed `hpc-grpo` script."""

from hpc_grpo.cli.app import main

main()
