"""The size of one checkpoint on disk: the one sizing rule plan, preflight and prune share.

What the pinned verl writes per `global_step_N/actor/` (checked against its checkpoint managers):

* FSDP: per-rank `model_*.pt` shards of the actor's fp32 parameters (`fsdp_config.model_dtype=fp32`)
  and `optim_*.pt` with Adam's two fp32 moments: 4 + 8 = 12 B per parameter, no further master
  copy. With LoRA the model shards hold the whole (frozen) base in fp32 too; only the optimizer is
  adapter-sized. That is why a LoRA checkpoint is about as big as the base model in fp32.
* Megatron: `model/huggingface/` (bf16 weights written by mbridge, 2 B per parameter) plus the
  distributed optimizer's `optimizer/dist_ckpt/` (fp32 master + 2 moments, 12 B per trained
  parameter). 72B full fine-tuning comes to ~1 TB per checkpoint.
* trl (the CPU engine): the adapter (or model) in fp32 and Adam's two moments.

Plus `data.pt` and rng/scheduler state, which are small (the 2% margin covers them).
Stdlib only: on the path of `plan`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_grpo.config.engine_traits import traits_of

__all__ = ["CheckpointSize", "checkpoint_size"]

GIB = float(1024**3)
MARGIN = 1.02  # data.pt, extra_state, rng, tokenizer/config copies


@dataclass(frozen=True)
class CheckpointSize:
    """Bytes of one checkpoint, split into what holds them (so a table can say why it is big)."""

    weights_bytes: float
    optimizer_bytes: float
    layout: str

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.optimizer_bytes) * MARGIN

    @property
    def gib(self) -> float:
        return self.total_bytes / GIB

    def describe(self) -> str:
        return f"~{human(self.total_bytes)} ({self.layout})"


def human(n: float) -> str:
    """Bytes as GiB, with decimal TB beside from half a TB on (the 72B recipe writes about 1 TB)."""
    if n >= 5e11:
        return f"{n / GIB:.0f} GiB = {n / 1e12:.2f} TB"
    return f"{n / GIB:.1f} GiB"


def checkpoint_size(engine: str, backend: str, params: float, lora_params: float = 0.0) -> CheckpointSize:
    """One checkpoint of a run training `params` (base) with `lora_params` adapter parameters (0 = full)."""
    if params <= 0:
        raise ValueError(f"params must be positive, got {params}")
    trained = lora_params if lora_params > 0 else params
    if traits_of(engine).checkpoint_format == "hf-trainer":
        weights = 4 * (lora_params if lora_params > 0 else params)
        return CheckpointSize(weights, 8 * trained, "trl: fp32 adapter/model + Adam moments")
    if backend == "megatron":
        weights = 2 * (params + lora_params)
        return CheckpointSize(weights, 12 * trained, "Megatron: bf16 HF weights + fp32 master and Adam moments of the trained params")
    if backend == "fsdp":
        weights = 4 * (params + lora_params)
        what = "FSDP: fp32 shards of the whole model" + (" (the LoRA base included)" if lora_params > 0 else "")
        return CheckpointSize(weights, 8 * trained, what + " + Adam moments of the trained params")
    raise ValueError(f"backend must be fsdp or megatron, not {backend!r}")
