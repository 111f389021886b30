"""Log lines that mean verl's rollout engine is gone for good, while verl itself waits on it forever.

Why: when a vLLM worker or engine-core process dies (OOM killer, a segfault in a kernel, a failed weight update),
the pinned verl's trainer keeps waiting for the rollout it will never get: main_ppo hangs until the Slurm time limit, and
the allocation burns. vLLM says so in the log first. The job's driver watch (hpc_grpo.job.driver_watch) reads the
driver's output (Ray forwards every actor's lines to it) and stops the job when one of these appears.

Only vLLM's own words for an unrecoverable engine are listed: a line that merely mentions an error must not stop a
healthy run.
"""

from __future__ import annotations

import re

FATAL_ROLLOUT_LINES: tuple[tuple[re.Pattern[str], str], ...] = (
    # vllm/v1/executor/multiproc_executor.py: a GPU (or CPU) worker process exited
    (re.compile(r"Worker proc \S+ died unexpectedly"), "a vLLM worker process died"),
    # vllm/v1/engine/core_client.py: the engine-core process exited
    (re.compile(r"engine core exited unexpectedly"), "vLLM's engine-core process died"),
    # vllm/v1/engine/exceptions.py: every later request fails with it
    (re.compile(r"\bEngineDeadError\b|EngineCore encountered an issue"), "vLLM's engine is dead"),
    # multiproc_executor's collective_rpc: a worker raised inside an RPC (verl's weight update is one)
    (re.compile(r"Worker failed with error '"), "a vLLM worker failed inside an RPC (a weight update?)"),
)

# Time verl gets to exit by itself after such a line before the job stops it.
GRACE_S = 30.0


def fatal_rollout_reason(line: str) -> str | None:
    """What a driver log line says went wrong with the rollout engine, or None for any other line."""
    if "died" not in line and "Engine" not in line and "Worker failed" not in line and "engine core" not in line:
        return None  # cheap pre-filter: the driver prints thousands of lines
    for pattern, reason in FATAL_ROLLOUT_LINES:
        if pattern.search(line):
            return reason
    return None
