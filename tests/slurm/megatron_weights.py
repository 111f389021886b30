"""Run in `.venv-verl` by tests/slurm/test_verl_lifecycle.py: a Megatron run's export is the trained model.

argv: CHECKPOINT (a global_step_N folder) EXPORT (RUN/exports/step_N) BASE (the base model's folder).

1. transformers loads the export as a causal LM, and it computes finite logits;
2. its weights are the trained ones: the fp32 master weights in Megatron's dist checkpoint of the distributed
   optimizer (optimizer/dist_ckpt: one flat buffer per model-parallel rank, the ranks' shards of every parameter
   with padding) rounded to the model's bf16 hold, as a multiset of nonzero values, the export's values, each
   counted as often as the ranks hold it, plus at most the padding (the layer norms on both TP ranks; under a pipeline the tied embedding's
   copy on the last stage). The multiset needs no knowledge of megatron-core's buffer order, so a megatron-core
   upgrade does not break it, while one weight exported from another step or left at the base model's fails it;
3. the export moved away from the base model (the comparison is not between two copies of the base).

Exit 0: all hold; 3: all hold except that, under a pipeline, the first stage's copy of the tied embedding is not the
export's (the last stage's copy is: what a resume that restored Adam's step wrongly left, see the `resume_step` patch
of hpc_grpo/engines/megatron_cpu.py); 1: anything else.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

# The distributed optimizer's buffers pad each bucket (and parameter starts); the padding is not always zero, so the
# master weights hold the export's values plus at most this many others.
PADDING_MAX = 4096
TIED_APART = "tied embedding copies apart"  # and exit 3: the only mismatch is the first stage's embedding copy


def master_values(ckpt: Path) -> torch.Tensor:
    """Every nonzero fp32 master weight of the distributed optimizer, over all model-parallel ranks, as bf16."""
    reader = dcp.FileSystemReader(str(ckpt / "actor" / "optimizer" / "dist_ckpt"))
    meta = reader.read_metadata().state_dict_metadata
    want = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items()
            if k.endswith(".param") and hasattr(m, "size")}
    if not want:
        sys.exit(f"no master weights (*.param) in the optimizer's dist checkpoint: {sorted(meta)[:10]}")
    dcp.load(want, storage_reader=reader, no_dist=True)
    flat = torch.cat([t.flatten() for t in want.values()])
    return flat[flat != 0].to(torch.bfloat16)


def export_values(export: Path, ckpt: Path, tied_copies: int = 2) -> torch.Tensor:
    """The export's nonzero values, each repeated as often as the model-parallel ranks hold it (tied_copies: of the
    tied embedding under a pipeline)."""
    weights: dict[str, torch.Tensor] = {}
    for f in sorted(export.glob("*.safetensors")):
        weights.update(load_file(f))
    tc = json.loads((ckpt / "actor" / "transformer_config.json").read_text())
    tp, pp = int(tc.get("tensor_model_parallel_size", 1)), int(tc.get("pipeline_model_parallel_size", 1))
    cfg = json.loads((export / "config.json").read_text())
    parts = []
    for name, t in weights.items():
        copies = 1
        if name.endswith("norm.weight"):  # replicated on every TP rank
            copies = tp
        if name == "model.embed_tokens.weight" and pp > 1 and cfg.get("tie_word_embeddings"):
            copies = tied_copies  # the last stage's output layer holds its own copy of the tied embedding
        parts += [t.flatten()] * copies
    flat = torch.cat(parts).to(torch.bfloat16)
    return flat[flat != 0]


def multiset_missing(want: torch.Tensor, have: torch.Tensor) -> int:
    """How many of want's values (with multiplicity) have does not hold."""
    wv, wc = torch.unique(want.float(), return_counts=True)
    hv, hc = torch.unique(have.float(), return_counts=True)
    at = torch.searchsorted(hv, wv).clamp(max=hv.numel() - 1)
    held = torch.where(hv[at] == wv, hc[at], torch.zeros_like(hc[at]))
    return int((wc - held).clamp(min=0).sum())


def main() -> None:
    ckpt, export, base = (Path(a) for a in sys.argv[1:4])
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    ids = torch.tensor([[5, 17, 33, 2, 40, 41, 7, 9]])
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all(), "the export's logits are not finite"
    base_model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        moved = (model(ids).logits - base_model(ids).logits).abs().max().item()
    assert moved > 1e-3, f"the export's logits are the base model's (max |diff| {moved:.2e}): nothing trained"

    got, want = master_values(ckpt), export_values(export, ckpt)
    missing = multiset_missing(want, got)
    if missing and multiset_missing(export_values(export, ckpt, tied_copies=1), got) == 0:
        # everything but one copy of the tied embedding is the trained state: the stages' two copies are apart
        print(f"{TIED_APART}: {missing} of the export's embedding values are not the first pipeline stage's copy "
              "(the export holds the last stage's output-layer copy; every other weight matches)")
        sys.exit(3)
    assert missing == 0 and got.numel() - want.numel() < PADDING_MAX, (
        f"{missing} of the export's {want.numel()} nonzero values are not among the dist checkpoint's "
        f"{got.numel()} nonzero master weights (as bf16)")
    print(f"export {export.name}: transformers loads it, its {want.numel()} nonzero values are the dist checkpoint's "
          f"master weights (bf16), logits moved {moved:.3f} from the base model's")


if __name__ == "__main__":
    main()
