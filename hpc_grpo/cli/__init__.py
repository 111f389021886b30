"""The hpc-grpo command line (Typer): parse, call a command, print. The app is hpc_grpo.cli.app."""
