"""Export of checkpoints to merged Hugging Face folders, checked by logits: merged == base + adapter.

trl: a real peft LoRA adapter on the tiny model, saved in trl's checkpoint layout, merged through the real code
path. verl FSDP: verl's merger cannot run in this venv (full verl conflicts with trl's transformers); the real
merger runs in .venv-verl in test_export_verl_merger.py. Here its OUTPUT is stood in for: a folder with the base weights and `lora_adapter/`, as VERL.md says the merger writes;
everything after it (the peft merge, the atomic cache) is the real code. verl Megatron: mbridge's
`actor/model/huggingface/` weights plus an adapter, built the same way. The merger's command line is checked.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from hpc_grpo.evaluation import export  # noqa: E402
from hpc_grpo.data.tiny_model import ensure_tiny_model  # noqa: E402
from hpc_grpo.runstate import layout


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen2")


def save_adapter(base: Path, out: Path, seed: int) -> None:
    """A LoRA adapter with non-zero B (peft starts B at 0, which would make any merge trivially equal)."""
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    model.save_pretrained(str(out))


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[5, 17, 33, 2, 40, 41, 7, 9]])


def assert_merged_equals_base_plus_adapter(folder: Path, base: Path, adapter: Path) -> None:
    merged = AutoModelForCausalLM.from_pretrained(str(folder))
    ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)), str(adapter))
    plain = AutoModelForCausalLM.from_pretrained(str(base))
    got, want, base_logits = logits(merged, IDS), logits(ref, IDS), logits(plain, IDS)
    assert not any(k.startswith("base_model") or "lora_" in k for k in merged.state_dict()), "adapter not folded in"
    assert (want - base_logits).abs().max() > 1e-3, "the adapter must change the logits, or the test proves nothing"
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()


def test_trl_checkpoint_merges_to_base_plus_adapter_and_is_cached(tiny: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "checkpoint-4"
    save_adapter(tiny, ckpt, seed=1)
    (run / "exports" / ".step_4.tmp-999").mkdir(parents=True)  # a killed export's leftover: never taken as done
    assert export.cached_export(run, 4) is None
    folder = export.export_checkpoint(run, 4, ckpt, "trl", str(tiny))
    assert folder == run / "exports" / "step_4" and (folder / layout.EXPORT_MARKER).is_file()
    assert_merged_equals_base_plus_adapter(folder, tiny, ckpt)
    assert export.export_info(folder)["layout"] == "trl"
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    called = []
    again = export.export_checkpoint(run, 4, ckpt, "trl", str(tiny), merger=lambda *a: called.append(a))
    assert again == folder and (folder / "model.safetensors").stat().st_mtime_ns == stamp and not called
    # this export's temp folder is gone; the killed one's leftover is not its business
    assert [p.name for p in (run / "exports").glob(".step_4.tmp-*")] == [".step_4.tmp-999"]


def test_failed_export_leaves_nothing_that_looks_done(tiny: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "global_step_3"
    (ckpt / "actor").mkdir(parents=True)

    def broken_merger(actor: Path, target: Path) -> None:
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        raise export.ExportError("merger died")

    with pytest.raises(export.ExportError, match="merger died"):
        export.export_checkpoint(run, 3, ckpt, "verl-fsdp", str(tiny), merger=broken_merger)
    assert export.cached_export(run, 3) is None
    assert not [p for p in (run / "exports").iterdir()], list((run / "exports").iterdir())


def test_verl_fsdp_lora_export_folds_the_merger_adapter_in(tiny: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "global_step_6"
    (ckpt / "actor" / "huggingface").mkdir(parents=True)
    adapter_src = tmp_path / "adapter"
    save_adapter(tiny, adapter_src, seed=2)
    seen = {}

    def merger_output_stand_in(actor: Path, target: Path) -> None:
        """What `verl.model_merger merge --backend fsdp` leaves for a LoRA run: base weights + lora_adapter/."""
        seen["actor"] = actor
        AutoModelForCausalLM.from_pretrained(str(tiny)).save_pretrained(str(target))
        import shutil

        shutil.copytree(adapter_src, target / "lora_adapter")
        for f in tiny.glob("tokenizer*"):
            shutil.copy2(f, target / f.name)

    folder = export.export_checkpoint(run, 6, ckpt, "verl-fsdp", str(tiny), merger=merger_output_stand_in)
    assert seen["actor"] == ckpt / "actor"
    assert_merged_equals_base_plus_adapter(folder, tiny, adapter_src)
    assert "lora_adapter" in export.export_info(folder)["how"]
    assert not (folder / "lora_adapter").exists()


def test_verl_megatron_export_from_mbridge_hf_folder(tiny: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "global_step_8"
    hf = ckpt / "actor" / "model" / "huggingface"
    AutoModelForCausalLM.from_pretrained(str(tiny)).save_pretrained(str(hf))
    import shutil

    for f in tiny.glob("tokenizer*"):
        shutil.copy2(f, hf / f.name)
    save_adapter(tiny, hf / "lora_adapter", seed=3)
    folder = export.export_checkpoint(run, 8, ckpt, "verl-megatron", str(tiny))
    assert_merged_equals_base_plus_adapter(folder, tiny, hf / "lora_adapter")


def test_megatron_without_hf_weights_says_what_to_run(tmp_path: Path) -> None:
    ckpt = tmp_path / "run" / "checkpoints" / "global_step_1"
    (ckpt / "actor" / "model" / "huggingface").mkdir(parents=True)
    with pytest.raises(export.ExportError, match="verl.model_merger merge --backend megatron"):
        export.export_checkpoint(tmp_path / "run", 1, ckpt, "verl-megatron", "/base")


def test_merger_command_is_verls_documented_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPC_GRPO_VERL_PYTHON", raising=False)
    cmd = export.merger_command(Path("/r/global_step_2/actor"), Path("/out"))
    assert cmd[1:] == ["-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir",
                       "/r/global_step_2/actor", "--target_dir", "/out"]
    assert cmd[0] in (sys.executable, str(Path(export.__file__).resolve().parents[2] / ".venv-verl/bin/python"))
    monkeypatch.setenv("HPC_GRPO_VERL_PYTHON", "/opt/verl/bin/python")
    assert export.merger_command(Path("/a"), Path("/b"))[0] == "/opt/verl/bin/python"
