"""The words a rendered verl launch.sh passes to hpc_grpo.job.verl_node, as bash itself expands them."""

from __future__ import annotations

import subprocess
from pathlib import Path

EXEC = 'exec "$python" -m hpc_grpo.job.verl_node'


def node_argv(launch: str, cwd: Path) -> list[str]:
    """Run the script up to its exec line, printing that line's arguments instead of running verl_node."""
    assert launch.count(EXEC) == 1, f"launch.sh has no single `{EXEC}` line"
    script = launch.replace(EXEC, "printf '%s\\0'")
    proc = subprocess.run(["bash", "-c", script], cwd=cwd, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
                          capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return [a.decode("utf-8") for a in proc.stdout.split(b"\0")[:-1]]
