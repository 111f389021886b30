"""How megatron-core splits a model's layers over pipeline stages, and when it refuses: restated from megatron-core's
TransformerConfig.__post_init__ and transformer_block.get_num_layers_to_build, so `plan` shows the split it will
build and errors only where megatron-core would stop (tests/unit/test_megatron_pipeline.py checks it against
megatron-core's own function where that is installed).

The rules:
* even split: layers % PP == 0, and with VPP each stage's layers % VPP == 0;
* account_for_embedding / account_for_loss_in_pipeline_split: the embedding (loss) counts as one more layer, the
  total must divide by PP (and each stage by VPP), and the first (last) stage builds one layer fewer;
* num_layers_in_first / last_pipeline_stage: those stages get that many, the rest divides evenly over the middle
  stages (each > 0, divisible by VPP with VPP); they cannot be combined with account_for_*.
A custom pipeline_model_parallel_layout is left to megatron-core (not modelled).

Stdlib only (on the path of `hpc-grpo plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

OTC = "actor_rollout_ref.actor.megatron.override_transformer_config"
EMBED_KEY = f"{OTC}.account_for_embedding_in_pipeline_split"
LOSS_KEY = f"{OTC}.account_for_loss_in_pipeline_split"
FIRST_KEY = f"{OTC}.num_layers_in_first_pipeline_stage"
LAST_KEY = f"{OTC}.num_layers_in_last_pipeline_stage"
LAYOUT_KEY = f"{OTC}.pipeline_model_parallel_layout"


@dataclass(frozen=True)
class PipelineSplit:
    """megatron-core's pipeline settings for one model."""

    num_layers: int
    pp: int
    vpp: int | None = None
    first: int | None = None
    last: int | None = None
    embedding: bool = False
    loss: bool = False


class Refused(ValueError):
    """megatron-core would refuse this split: the message names the rule and the numbers."""


def stage_layers(s: PipelineSplit) -> list[int]:
    """Transformer layers each pipeline stage builds (summed over its virtual stages); Refused where megatron-core stops."""
    if s.pp < 1 or s.num_layers < 1:
        raise Refused(f"need layers >= 1 and PP >= 1 (got {s.num_layers} layers, PP {s.pp})")
    vpp = s.vpp if (s.vpp is not None and s.pp > 1) else None
    if s.first is not None or s.last is not None:
        return _uneven(s, vpp)
    total = s.num_layers + int(s.embedding) + int(s.loss)
    counted = " (embedding and loss counted as layers)" if s.embedding and s.loss else (
        " (embedding counted as a layer)" if s.embedding else " (loss counted as a layer)" if s.loss else "")
    if total % s.pp:
        raise Refused(f"{total} layers{counted} do not divide by PP {s.pp}")
    per_stage = total // s.pp
    if vpp and per_stage % vpp:
        raise Refused(f"{per_stage} layers per stage{counted} do not divide by VPP {vpp}")
    split = [per_stage] * s.pp
    if s.embedding:
        split[0] -= 1
    if s.loss:
        split[-1] -= 1
    if min(split) < 0 or (vpp and s.embedding and per_stage // vpp < 1):
        raise Refused(f"not enough layers in the first virtual stage for the embedding ({per_stage} per stage)")
    return split


def _uneven(s: PipelineSplit, vpp: int | None) -> list[int]:
    if s.embedding or s.loss:
        raise Refused("num_layers_in_first/last_pipeline_stage cannot be combined with "
                      "account_for_embedding/loss_in_pipeline_split")
    rest, middle = s.num_layers, s.pp
    for where, n in (("first", s.first), ("last", s.last)):
        if n is None:
            continue
        if n <= 0:
            raise Refused(f"num_layers_in_{where}_pipeline_stage must be > 0 (got {n})")
        if vpp and n % vpp:
            raise Refused(f"num_layers_in_{where}_pipeline_stage {n} does not divide by VPP {vpp}")
        rest -= n
        middle -= 1
    if bool(rest) != bool(middle) or rest < 0:
        raise Refused(f"{rest} layers are left for {middle} middle stage(s)")
    if middle and rest % middle:
        raise Refused(f"{rest} layers left for the middle stages do not divide by their number, {middle}")
    per = rest // middle if middle else 0
    if middle and vpp and per % vpp:
        raise Refused(f"{per} layers per middle stage do not divide by VPP {vpp}")
    split = [per] * s.pp
    if s.first is not None:
        split[0] = s.first
    if s.last is not None:
        split[-1] = s.last
    return split
