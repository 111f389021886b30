"""A per-GPU memory estimate as data, and what `plan` says about it: fits, tight or does not fit, with the
largest term and the first knob of the advice.

Engine-neutral: the estimate of a verl GRPO step (what is resident in each phase, and which knob lowers the
peak) is hpc_grpo.engines.verl_memory. Stdlib only (on the path of `hpc-grpo plan`). LoRA's parameter count is
hpc_grpo.config.models.lora_trainable_params.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hpc_grpo.common.findings import Finding, Severity, estimate, info, warning

__all__ = ["MemoryEstimate", "memory_findings"]

WARN_FRACTION = 0.9  # above this share of the GPU the estimate is "tight" (warning) and advice is given


@dataclass
class MemoryEstimate:
    """Per-GPU memory of one GRPO step, in GiB.

    `terms` are the sizes of each piece WHEN ON THE GPU (an offloaded term keeps its size here so the
    saving is visible); `phases` say what is resident in each phase (offloaded = 0). total_gib is the
    worst phase. `host_gib` is host RAM per GPU held by offloaded state (x GPUs per node for a node).
    `rollout_kv_gib` is what vLLM's share leaves for the KV cache (None when rollout_tp is unknown);
    `fits` needs the peak within capacity AND room for a KV cache. `notes` flag layouts Megatron
    or verl would refuse (the numbers then assume the layout as given).
    """

    terms: dict[str, float]
    phases: dict[str, dict[str, float]]
    total_gib: float
    capacity_gib: float
    fits: bool
    largest_term: str
    peak_phase: str
    advice: list[str] = field(default_factory=list)
    host_gib: float = 0.0
    rollout_kv_gib: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def training_gib(self) -> float:
        return sum(self.phases["training"].values())

    @property
    def rollout_gib(self) -> float:
        return sum(self.phases["rollout"].values())

    @property
    def fraction(self) -> float:
        return self.total_gib / self.capacity_gib if self.capacity_gib > 0 else math.inf

    def phase_gib(self) -> dict[str, float]:
        return {k: sum(v.values()) for k, v in self.phases.items()}

    def summary(self) -> str:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in self.phase_gib().items())
        return (
            f"~{self.total_gib:.1f} of {self.capacity_gib:.0f} GiB per GPU ({self.fraction:.0%}; {phases}); "
            f"peak in the {self.peak_phase} phase, largest term {self.largest_term} "
            f"{self.phases[self.peak_phase].get(self.largest_term, 0.0):.1f} GiB"
        )


# ------------------------------------------------------------------------------------ findings
def memory_findings(est: MemoryEstimate, key_prefix: str = "memory") -> list[Finding]:
    """Error when it does not fit (largest term + the top knob), warning above 90%, else info."""
    out: list[Finding] = []
    peak_val = est.phases[est.peak_phase].get(est.largest_term, 0.0)
    what = (
        f"estimated peak ~{est.total_gib:.1f} GiB per GPU in the {est.peak_phase} phase "
        f"({est.fraction:.0%} of {est.capacity_gib:.0f} GiB); largest term: {est.largest_term} ~{peak_val:.1f} GiB"
    )
    top = est.advice[0] if est.advice else ""
    if est.total_gib > est.capacity_gib:
        out.append(estimate(Severity.ERROR, key_prefix, f"does not fit (rough estimate): {what}",
                            top or "use more GPUs or a smaller model"))
    elif est.total_gib > WARN_FRACTION * est.capacity_gib:
        out.append(estimate(Severity.WARNING, key_prefix, f"tight (rough estimate, OOM likely): {what}", top))
    else:
        out.append(info(key_prefix, f"within GPU memory (rough estimate): {what}"))
    for note in est.notes:
        out.append(warning(f"{key_prefix}.layout", f"memory estimate assumes an invalid layout: {note}"))
    if est.rollout_kv_gib is not None:
        if est.rollout_kv_gib <= 0:
            out.append(
                estimate(
                    Severity.ERROR,
                    f"{key_prefix}.rollout",
                    f"vLLM's share ({est.terms['rollout']:.1f} GiB) cannot hold the model weights and a KV cache",
                    "raise rollout.gpu_memory_utilization or parallel.rollout_tp",
                )
            )
        elif est.rollout_kv_gib < 2:
            out.append(
                warning(
                    f"{key_prefix}.rollout",
                    f"vLLM's share leaves only ~{est.rollout_kv_gib:.1f} GiB for the KV cache: slow rollouts",
                    "raise rollout.gpu_memory_utilization or parallel.rollout_tp",
                )
            )
    return out
