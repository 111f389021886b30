"""planning/lora_targets: lora.target_modules against the module names in the model's safetensors headers
(peft's verdicts on the same names are checked side by side in test_verl_runtime_parity.py)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.planning.lora_targets import check_lora_targets, module_shapes, read_header


def write_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A real safetensors file (header + zero bytes): what save_file writes, without torch."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def sharded_model(folder: Path, tied: bool) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "tie_word_embeddings": tied}))
    write_safetensors(folder / "model-00001-of-00002.safetensors", {
        "model.embed_tokens.weight": [32, 8], "model.layers.0.self_attn.q_proj.weight": [8, 8],
        "model.layers.0.self_attn.q_proj.bias": [8], "model.layers.0.input_layernorm.weight": [8]})
    write_safetensors(folder / "model-00002-of-00002.safetensors", {
        "model.layers.0.mlp.down_proj.weight": [8, 16], "model.norm.weight": [8]})
    return folder


def plan_lora(model: str, *overrides: str, recipe: str = "tiny-verl"):
    return check_lora_targets(resolve_spec(recipe, "local", [f"model.path={model}", "cluster.runs_root=/nonexistent/runs",
                                                            *overrides], run_name="t"))


def test_module_names_and_ranks_come_from_every_shard_and_tied_embeddings_add_lm_head(tmp_path: Path) -> None:
    folder = sharded_model(tmp_path / "m", tied=True)
    assert read_header(folder / "model-00002-of-00002.safetensors").keys() == {"model.layers.0.mlp.down_proj.weight",
                                                                              "model.norm.weight"}
    assert module_shapes(folder) == {"model.embed_tokens": 2, "model.layers.0.self_attn.q_proj": 2,
                                     "model.layers.0.input_layernorm": 1, "model.layers.0.mlp.down_proj": 2,
                                     "model.norm": 1, "lm_head": 2}


@pytest.mark.parametrize("targets, expected", [
    ("[q_proj,down_proj]", []),
    ("[lm_head]", []),  # tied: the module exists though no tensor is stored under its name
    ("all-linear", []),
    ("[nonexistent_proj]", [("error", "matches no module")]),
    ("[q_proj,nonexistent_proj]", [("warning", "nonexistent_proj matches no module")]),
    ("[input_layernorm]", [("error", "a norm layer")]),
    (".*_proj", []),  # a string is peft's full-match regular expression
    (".*layers\\.0\\.mlp", [("error", "matches no module")]),
])
def test_targets_against_the_model(tmp_path: Path, isolated, targets: str, expected: list) -> None:
    folder = sharded_model(tmp_path / "m", tied=True)
    found = plan_lora(str(folder), f"lora.target_modules={targets}")
    assert [(f.severity.value, f.key) for f in found] == [(s, "lora.target_modules") for s, _ in expected], found
    for f, (_, words) in zip(found, expected):
        assert words in f.message and f.fix, f
        assert "q_proj" in (f.message + f.fix)  # the real names are offered


def test_unreadable_weights_and_hub_ids_say_the_check_was_not_made(tmp_path: Path, isolated) -> None:
    found = plan_lora("Qwen/Not-Downloaded-0.5B", "lora.target_modules=[nonexistent_proj]")
    assert [f.severity.value for f in found] == ["info"] and "not checked" in found[0].message
    empty = tmp_path / "no-weights"
    empty.mkdir()
    found = plan_lora(str(empty), "lora.target_modules=[nonexistent_proj]")
    assert [f.severity.value for f in found] == ["info"] and "no *.safetensors" in found[0].message
    broken = sharded_model(tmp_path / "broken", tied=False)
    (broken / "model-00001-of-00002.safetensors").write_bytes(b"\xff" * 16)
    found = plan_lora(str(broken), "lora.target_modules=[q_proj]")
    assert [f.severity.value for f in found] == ["info"] and "cannot read" in found[0].message


def test_untied_model_has_no_lm_head_and_lora_off_checks_nothing(tmp_path: Path, isolated) -> None:
    folder = sharded_model(tmp_path / "m", tied=False)
    assert [f.severity.value for f in plan_lora(str(folder), "lora.target_modules=[lm_head]")] == ["error"]
    assert plan_lora(str(folder), "lora.rank=0", "lora.target_modules=[nonexistent_proj]") == []
