"""A test hook, never a setting: `HPC_GRPO_TEST_BREAK_WEIGHT_SYNC=1` breaks verl's trainer -> vLLM weight sync on
purpose, so a test can show that the job notices a rollout which is not the policy it trains (runstate/health).

Why here: verl pushes the trainer's weights (full, or the LoRA adapter) into vLLM's workers through
`vLLMColocateWorkerExtension._update_weights` (verl/workers/rollout/vllm_rollout/utils.py), called in each vLLM
worker process for every bucket of every sync, the first one included, for the FSDP and the Megatron engines
alike. hpc-grpo's vLLM plugin (engines/vllm_cpu.register, loaded by vLLM in each of its processes, on CPU and GPU)
calls `install` when the variable is set: the update becomes a no-op, the sender still sends (nothing waits on a
receiver), and vLLM keeps the weights it loaded at start (`rollout.load_format`: the checkpoint's weights, or
random ones with verl's `dummy`) and never gets an adapter.

Only the environment turns it on (no recipe key, no override): it is named TEST, and plan, status and the job's
log say so loudly wherever it is set (`warning`).
"""

from __future__ import annotations

import os
from typing import Any

ENV = "HPC_GRPO_TEST_BREAK_WEIGHT_SYNC"


def enabled(environ: Any = None) -> bool:
    """Whether the hook is on in this environment (exactly "1")."""
    return (os.environ if environ is None else environ).get(ENV) == "1"


def warning() -> str:
    """The line plan, status and the job print while the hook is on."""
    return (f"TEST HOOK ON: {ENV}=1 breaks the trainer -> vLLM weight sync on purpose (vLLM keeps its initial "
            f"weights, the policy it samples never moves): a test setting only; unset {ENV} for a real run")


def install() -> bool:
    """Make verl's worker-side weight update a no-op in this vLLM process; False where verl's class is missing."""
    try:
        from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension as extension
    except ImportError:
        return False
    if getattr(extension._update_weights, "_hpc_grpo_broken", False):
        return True

    def dropped(self: Any, weights: Any, *args: Any, **kwargs: Any) -> None:
        return None

    dropped._hpc_grpo_broken = True  # type: ignore[attr-defined]
    extension._update_weights = dropped  # type: ignore[method-assign]
    print(f"hpc-grpo: {warning()}", flush=True)
    return True
