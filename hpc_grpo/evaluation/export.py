"""A checkpoint of either engine -> one Hugging Face model folder that lm-eval (hf or vLLM) loads as is.

- trl: the checkpoint holds a peft adapter; it is merged into the base with peft's `merge_and_unload`
  (a full fine-tune's model.safetensors is taken as it is).
- verl FSDP: verl's own merger (`python -m verl.model_merger merge --backend fsdp`, CPU), in the verl venv when
  there is one; it does NOT fold LoRA in (its output has the base weights and `lora_adapter/`), so a peft merge
  follows.
- verl Megatron: `actor/model/huggingface/` (mbridge writes HF weights there), plus a peft merge of a
  `lora_adapter/` beside them.

Exports are cached per step in RUN/exports/step_N/ and made atomically: built in a temporary folder, renamed into
place, `export.json` written inside before the rename, so a folder that exists is whole. Prune counts these
folders. Heavy imports (torch, transformers, peft) happen inside the functions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpc_grpo.common.atomic import build_dir_atomic
from hpc_grpo.runstate import checkpoints as ck  # the checkpoint layouts it reads
from hpc_grpo.runstate.layout import export_dir, export_marker  # the run directory's names

class ExportError(RuntimeError):
    """A checkpoint that cannot become a HF folder here; the message says what to do."""


def cached_export(run_dir: Path, step: int) -> Path | None:
    out = export_dir(run_dir, step)
    return out if export_marker(out).is_file() else None


@contextmanager
def leased(run_dir: Path, engine: str, step: int) -> Iterator[ck.Checkpoint]:
    """Checkpoint `step` held against pruning while it is read (a reader lease, hpc_grpo.runstate.leases.lease) and judged
    again under the lease: a prune may have removed it between the caller's listing and the lease."""
    from hpc_grpo.runstate.leases import lease

    with lease(run_dir, step):
        fresh = {c.step: c for c in ck.list_checkpoints(run_dir, engine)}.get(step)
        if fresh is None or not fresh.complete:
            raise ExportError(f"checkpoint step {step} went away before it was leased (pruned meanwhile?): "
                              "choose another step")
        yield fresh


def verl_python(repo_root: Path | None = None) -> str:
    """The interpreter for verl's merger: $HPC_GRPO_VERL_PYTHON, the checkout's .venv-verl, else this one."""
    explicit = os.environ.get("HPC_GRPO_VERL_PYTHON")
    if explicit:
        return explicit
    root = repo_root or Path(__file__).resolve().parents[2]
    candidate = root / ".venv-verl" / "bin" / "python"
    return str(candidate) if candidate.is_file() else sys.executable


def merger_command(actor_dir: Path, target_dir: Path, backend: str = "fsdp", python: str | None = None) -> list[str]:
    """verl's documented merger call (VERL.md): CPU is enough for FSDP."""
    return [python or verl_python(), "-m", "verl.model_merger", "merge", "--backend", backend,
            "--local_dir", str(actor_dir), "--target_dir", str(target_dir)]


def run_verl_merger(actor_dir: Path, target_dir: Path) -> None:
    cmd = merger_command(actor_dir, target_dir)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise ExportError(f"verl's merger failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}\n"
                          "fix: run it in a venv with full verl (bash tools/setup-env.sh verl creates .venv-verl, "
                          "or set HPC_GRPO_VERL_PYTHON)")


def export_checkpoint(run_dir: Path, step: int, path: Path, layout: str, base_model: str,
                      merger: Callable[[Path, Path], None] = run_verl_merger) -> Path:
    """RUN/exports/step_N/ for a checkpoint (cached). `merger` is verl's merger call (a test passes a stand-in)."""
    cached = cached_export(run_dir, step)
    if cached is not None:
        return cached
    out = export_dir(run_dir, step)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def build(tmp: Path) -> None:
        if layout == "trl":
            how = _export_trl(Path(path), base_model, tmp)
        elif layout == "verl-fsdp":
            how = _export_verl_fsdp(Path(path), tmp, merger)
        elif layout == "verl-megatron":
            how = _export_verl_megatron(Path(path), tmp)
        else:
            raise ExportError(f"checkpoint {path} has layout {layout!r}: only trl, verl-fsdp and verl-megatron export")
        export_marker(tmp).write_text(json.dumps({"step": int(step), "source": str(path), "layout": layout,
                                                  "how": how, "base_model": base_model,
                                                  "seconds": round(time.time() - t0, 3)}, indent=2) + "\n")

    # someone else's finished export that won the race is used as it is
    build_dir_atomic(out, build, lambda done: cached_export(run_dir, step) is not None)
    return out


def _copy_tokenizer(src: Path, dst: Path) -> bool:
    copied = False
    for name in ck.TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied = True
    return copied


def merge_adapter(base_dir: str | Path, adapter_dir: Path, out: Path, tokenizer_from: list[Path]) -> None:
    """peft: base + adapter -> merged weights (merge_and_unload), saved as a plain HF folder.

    The merge runs, and is saved, in float32: verl's merger writes the base in bfloat16 whatever the checkpoint held,
    and a trained LoRA delta (often below bf16's 2^-8 relative step) added to bf16 weights would be partly rounded
    away. The export is then 4 bytes a parameter; prune counts it by its real size."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
        out.mkdir(parents=True, exist_ok=True)
        merged.save_pretrained(str(out))
    for src in [*tokenizer_from, Path(base_dir)]:
        if (src / "tokenizer.json").is_file() or (src / "tokenizer_config.json").is_file():
            AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(out))
            return
    raise ExportError(f"no tokenizer in {', '.join(map(str, tokenizer_from))} or {base_dir}")


def _export_trl(ckpt: Path, base_model: str, out: Path) -> str:
    if ck.holds_adapter(ckpt):
        merge_adapter(base_model, ckpt, out, [ckpt])
        return "peft merge_and_unload of the trl adapter into the base model"
    files = ck.trl_model_files(ckpt)
    if files:
        out.mkdir(parents=True)
        for f in files:
            shutil.copy2(f, out / f.name)
        return "full fine-tune weights copied from the trl checkpoint"
    raise ExportError(f"{ckpt} has neither {ck.ADAPTER_CONFIG} nor model.safetensors: not a trl checkpoint")


def _export_verl_fsdp(ckpt: Path, out: Path, merger: Callable[[Path, Path], None]) -> str:
    actor = ck.actor_dir(ckpt)
    if not actor.is_dir():
        raise ExportError(f"{ckpt} has no {ck.ACTOR}/ folder: not a verl checkpoint")
    merged = out.parent / f"{out.name}.merger"
    shutil.rmtree(merged, ignore_errors=True)
    try:
        merger(actor, merged)
        adapter = merged / ck.LORA_ADAPTER
        if adapter.is_dir():
            _check_merger_lora_alpha(actor, adapter)
            merge_adapter(merged, adapter, out, [merged, ck.hf_dir(ckpt, "verl-fsdp")])
            return f"verl model_merger (fsdp), then peft merge_and_unload of its {ck.LORA_ADAPTER}/"
        os.rename(merged, out)
        if not (out / "tokenizer_config.json").is_file():
            _copy_tokenizer(ck.hf_dir(ckpt, "verl-fsdp"), out)
        return "verl model_merger (fsdp)"
    finally:
        shutil.rmtree(merged, ignore_errors=True)


def _check_merger_lora_alpha(actor: Path, adapter: Path) -> None:
    """verl's merger takes lora_alpha from <actor>/lora_train_meta.json only and writes 0 without it: peft's scaling
    alpha/r is then 0 and the 'merged' model is the base model. Refuse that instead of exporting it."""
    try:
        alpha = json.loads((adapter / ck.ADAPTER_CONFIG).read_text()).get("lora_alpha")
    except (OSError, ValueError) as e:
        raise ExportError(f"verl's merger wrote an unreadable {adapter / ck.ADAPTER_CONFIG}: {e}") from e
    if not alpha:
        raise ExportError(f"verl's merger wrote lora_alpha={alpha!r} into {adapter.name}/{ck.ADAPTER_CONFIG}, so the "
                          f"adapter would have no effect (the export would be the base model): "
                          f"{actor / ck.LORA_META} is missing or has no lora_alpha. fix: write "
                          '{"r": <lora_rank>, "lora_alpha": <lora_alpha>, "task_type": "CAUSAL_LM"} there, from the '
                          "run's actor_rollout_ref.model.lora_rank/lora_alpha, and export again")


def _export_verl_megatron(ckpt: Path, out: Path) -> str:
    hf = ck.hf_dir(ckpt, "verl-megatron")
    if not any(hf.glob("*.safetensors")):
        raise ExportError(f"{hf} holds no weights (only mbridge writes HF weights there): run verl's merger "
                          f"on a GPU node: {' '.join(merger_command(ck.actor_dir(ckpt), out, 'megatron'))}")
    where = hf.relative_to(ckpt)
    adapter = ck.megatron_adapter(ckpt)
    if adapter is not None:
        base = out.parent / f"{out.name}.base"
        shutil.rmtree(base, ignore_errors=True)
        shutil.copytree(hf, base, ignore=shutil.ignore_patterns(ck.LORA_ADAPTER))
        try:
            merge_adapter(base, adapter, out, [hf])
        finally:
            shutil.rmtree(base, ignore_errors=True)
        return f"{where}/, then peft merge_and_unload of its LoRA adapter"
    shutil.copytree(hf, out)
    return f"{where}/ (mbridge HF weights)"


def export_info(folder: Path) -> dict[str, Any]:
    try:
        return json.loads(export_marker(folder).read_text())
    except (OSError, ValueError):
        return {}
