"""Export of a verl FSDP LoRA checkpoint through the pinned verl's REAL merger, checked by logits: merged == base + adapter.

`python -m verl.model_merger merge --backend fsdp` runs in `.venv-verl` (full verl; it cannot share this venv,
whose transformers is too new for verl), called by hpc_grpo.evaluation.export exactly as a run's evaluation calls it. Only the
checkpoint is made by the test, not by verl's FSDP trainer (which needs GPUs): the files are the ones verl's
FSDPCheckpointManager.save_checkpoint writes for world size 1 (verl/utils/checkpoint/fsdp_checkpoint_manager.py):
`model_world_size_1_rank_0.pt` (the peft-wrapped model's state dict: `base_model.model.*.base_layer.weight`,
`*.lora_A.default.weight`, ...; at world size 1 FSDP shards nothing, so plain tensors), the optimizer and extra-state
shards, `fsdp_config.json` (FSDP_version, world_size), `lora_train_meta.json` (r, lora_alpha, task_type) and
`huggingface/` (config and tokenizer), plus `data.pt` beside `actor/`.

What the real merger showed: it casts every tensor to bfloat16 (fsdp_model_merger.py, `tensor.bfloat16()`), the
LoRA A and B matrices as well, whatever the checkpoint held. Our peft merge then runs in float32, so the only
rounding left is the merger's; the test checks the export equals base + the bf16-rounded adapter exactly, and
stays within a tenth of the adapter's effect of the fp32 policy.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from hpc_grpo.runstate import checkpoints as ck  # noqa: E402
from hpc_grpo.evaluation import export  # noqa: E402
from hpc_grpo.data.tiny_model import ensure_tiny_model  # noqa: E402

IDS = torch.tensor([[5, 17, 33, 2, 40, 41, 7, 9]])
R, ALPHA = 4, 8


def verl_python_or_fail() -> str:
    """The venv with full verl; its absence fails under CI (where tools/run-tests.sh builds it) and skips elsewhere."""
    python = export.verl_python()
    probe = Path(python).parent / ".." / "lib"
    has_verl = any(probe.glob("python3*/site-packages/verl/model_merger/__main__.py"))
    if not has_verl:
        reason = f"no full verl for its merger ({python}): run `bash tools/setup-env.sh verl` (or set HPC_GRPO_VERL_PYTHON)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return python


def write_verl_fsdp_lora_checkpoint(base: Path, ckpt: Path, seed: int) -> PeftModel:
    """global_step_N/ as the pinned verl saves a LoRA actor at world size 1; returns the peft model it holds."""
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32),
                           LoraConfig(r=R, lora_alpha=ALPHA, target_modules="all-linear", task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:  # peft starts B at 0: a trained adapter is not
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    actor = ckpt / "actor"
    (actor / "huggingface").mkdir(parents=True)
    torch.save(model.state_dict(), actor / "model_world_size_1_rank_0.pt")
    torch.save({"state": {}, "param_groups": []}, actor / "optim_world_size_1_rank_0.pt")
    torch.save({"lr_scheduler": {}, "rng": torch.get_rng_state()}, actor / "extra_state_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": 1}, indent=4))
    (actor / "lora_train_meta.json").write_text(json.dumps({"r": R, "lora_alpha": ALPHA, "task_type": "CAUSAL_LM"}))
    model.get_base_model().config.save_pretrained(str(actor / "huggingface"))
    for f in base.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            shutil.copy2(f, actor / "huggingface" / f.name)
    torch.save({"dataloader": {}}, ckpt / "data.pt")
    return model


def bf16_base(tiny: Path, out: Path) -> Path:
    """The tiny model with every weight on bf16's grid, as a real base model from the Hub is: verl's merger writes
    the base in bfloat16, which is then lossless, so any difference left is the export's own."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    model.save_pretrained(str(out))
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            shutil.copy2(f, out / f.name)
    return out


def test_real_verl_merger_export_equals_base_plus_adapter(tmp_path: Path) -> None:
    python = verl_python_or_fail()
    base = bf16_base(ensure_tiny_model(tmp_path / "tiny-qwen2"), tmp_path / "base-bf16")
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "global_step_4"
    policy = write_verl_fsdp_lora_checkpoint(base, ckpt, seed=3)
    (ckpt.parent / "latest_checkpointed_iteration.txt").write_text("4")
    listed = ck.list_checkpoints(run, "verl")
    assert [(c.step, c.layout, c.complete) for c in listed] == [(4, "verl-fsdp", True)], listed  # our reader agrees

    folder = export.export_checkpoint(run, 4, ckpt, "verl-fsdp", str(base))  # the default merger: verl's own
    info = export.export_info(folder)
    assert info["how"] == "verl model_merger (fsdp), then peft merge_and_unload of its lora_adapter/", info
    assert info["layout"] == "verl-fsdp" and info["step"] == 4
    assert not (run / "exports" / "step_4.merger").exists()  # the merger's own output is not left behind

    merged = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    assert not any("lora_" in k or k.startswith("base_model") for k in merged.state_dict()), "adapter not folded in"
    with torch.no_grad():
        exact = policy(input_ids=IDS).logits  # the policy as trained (fp32 adapter)
        for name, p in policy.named_parameters():  # verl's merger casts every tensor, the adapter too, to bf16
            if "lora_" in name:
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
        want = policy(input_ids=IDS).logits
        got = merged(input_ids=IDS).logits
        plain = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)(input_ids=IDS).logits
    effect = (exact - plain).abs().max()
    assert effect > 1e-2, "the adapter must change the logits, or the test proves nothing"
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # base + the merger's bf16 adapter, merged in fp32
    print(f"adapter effect {effect:.4f}, export vs fp32 policy {(got - exact).abs().max():.5f}")
    assert (got - exact).abs().max() < 0.1 * effect  # the merger's rounding is small beside what training changed
    assert (folder / "tokenizer_config.json").is_file()
    assert {p.dtype for p in merged.parameters()} == {torch.float32}
    assert json.loads((folder / "config.json").read_text()).get("dtype") == "float32"  # merged and kept in fp32
    assert python  # the merger ran in this interpreter (export.verl_python): asserted present above


def test_real_merger_without_lora_train_meta_is_refused_not_exported_as_the_base(tmp_path: Path) -> None:
    """Without lora_train_meta.json verl's merger writes lora_alpha=0 (scaling 0): the 'merged' model would be the
    base model. The export refuses it, names the file and leaves nothing that looks done."""
    verl_python_or_fail()
    base = bf16_base(ensure_tiny_model(tmp_path / "tiny-qwen2"), tmp_path / "base-bf16")
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "global_step_2"
    write_verl_fsdp_lora_checkpoint(base, ckpt, seed=5)
    (ckpt / "actor" / "lora_train_meta.json").unlink()
    with pytest.raises(export.ExportError, match="lora_train_meta.json is missing or has no lora_alpha"):
        export.export_checkpoint(run, 2, ckpt, "verl-fsdp", str(base))
    assert export.cached_export(run, 2) is None and not list((run / "exports").glob("*"))
