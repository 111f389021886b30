"""Model shape facts: the table matches the public config.json files, counts match published sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_grpo.config.models import (
    ModelShape,
    count_params,
    known_models,
    param_groups,
    resolve_shape,
    shape_from_config_json,
)

# Published sizes (model cards / Hub): total, active.
PUBLISHED = {
    "Qwen2.5-0.5B-Instruct": (0.49e9, None),
    "Qwen2.5-1.5B-Instruct": (1.54e9, None),
    "Qwen2.5-3B-Instruct": (3.09e9, None),
    "Qwen2.5-7B-Instruct": (7.62e9, None),
    "Qwen2.5-14B-Instruct": (14.7e9, None),
    "Qwen2.5-32B-Instruct": (32.5e9, None),
    "Qwen2.5-72B-Instruct": (72.7e9, None),
    "Qwen3-30B-A3B": (30.5e9, 3.3e9),
    "Llama-3.1-8B-Instruct": (8.03e9, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_within_3_percent_of_published(name: str) -> None:
    shape = resolve_shape(name)
    assert shape is not None
    total, active = PUBLISHED[name]
    assert shape.params == pytest.approx(total, rel=0.03)
    assert shape.active_params == pytest.approx(active or total, rel=0.03)


def test_qwen25_7b_config_facts() -> None:
    s = resolve_shape("Qwen/Qwen2.5-7B-Instruct")
    assert s is not None
    assert (s.num_attention_heads, s.num_key_value_heads, s.num_hidden_layers, s.hidden_size) == (28, 4, 28, 3584)
    assert (s.intermediate_size, s.vocab_size, s.tie_word_embeddings) == (18944, 152064, False)
    assert s.attention_bias and not s.is_moe and s.head_dim == 128


def test_qwen3_30b_a3b_config_facts() -> None:
    s = resolve_shape("Qwen/Qwen3-30B-A3B")
    assert s is not None
    assert (s.num_attention_heads, s.num_key_value_heads, s.num_hidden_layers) == (32, 4, 48)
    assert (s.num_experts, s.num_experts_per_tok, s.moe_intermediate_size) == (128, 8, 768)
    assert s.head_dim == 128  # not hidden/heads = 64: getting this wrong miscounts attention by 2x
    assert (s.hidden_size, s.vocab_size) == (2048, 151936)
    assert s.qk_norm and not s.attention_bias and s.is_moe and s.num_moe_layers == 48


@pytest.mark.parametrize(
    ("name", "facts"),
    [
        ("Qwen2.5-0.5B-Instruct", (14, 2, 24, 896, 4864, 151936, True)),
        ("Qwen2.5-1.5B-Instruct", (12, 2, 28, 1536, 8960, 151936, True)),
        ("Qwen2.5-3B-Instruct", (16, 2, 36, 2048, 11008, 151936, True)),
        ("Qwen2.5-14B-Instruct", (40, 8, 48, 5120, 13824, 152064, False)),
        ("Qwen2.5-32B-Instruct", (40, 8, 64, 5120, 27648, 152064, False)),
        ("Qwen2.5-72B-Instruct", (64, 8, 80, 8192, 29568, 152064, False)),
        ("Llama-3.1-8B-Instruct", (32, 8, 32, 4096, 14336, 128256, False)),
    ],
)
def test_dense_table_facts(name: str, facts: tuple[int, int, int, int, int, int, bool]) -> None:
    s = resolve_shape(name)
    assert s is not None
    got = (
        s.num_attention_heads,
        s.num_key_value_heads,
        s.num_hidden_layers,
        s.hidden_size,
        s.intermediate_size,
        s.vocab_size,
        s.tie_word_embeddings,
    )
    assert got == facts


def test_count_params_is_what_the_table_uses() -> None:
    s = resolve_shape("Qwen2.5-0.5B-Instruct")
    assert s is not None
    total, active = count_params(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        attention_bias=True,
    )
    assert (total, active) == (s.params, s.active_params) == (param_groups(s).total, param_groups(s).active)
    # untying adds exactly one vocab x hidden matrix
    untied, _ = count_params(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        attention_bias=True,
    )
    assert untied - total == 151936 * 896


def test_base_names_map_to_the_instruct_shape() -> None:
    base, inst = resolve_shape("Qwen/Qwen2.5-3B"), resolve_shape("Qwen/Qwen2.5-3B-Instruct")
    assert base is not None and inst is not None
    assert base.name == "Qwen2.5-3B" and inst.name == "Qwen2.5-3B-Instruct"
    assert base.params == inst.params and base.hidden_size == inst.hidden_size
    assert resolve_shape("meta-llama/Llama-3.1-8B") is not None


@pytest.mark.parametrize(
    "path",
    ["Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct", "QWEN2.5-7B-INSTRUCT", "/models/hub/Qwen2.5-7B-Instruct/", "Qwen2.5-7B"],
)
def test_resolve_shape_variants(path: str) -> None:
    s = resolve_shape(path)
    assert s is not None and s.hidden_size == 3584


@pytest.mark.parametrize("path", ["", "  ", "Qwen/Qwen9-1T", "some/local/thing"])
def test_resolve_shape_unknown_is_none(path: str) -> None:
    assert resolve_shape(path) is None


def test_known_models_lists_table_and_aliases() -> None:
    names = known_models()
    assert names == sorted(names) and len(names) == len(set(names))
    for n in PUBLISHED:
        assert n in names
    assert "Qwen2.5-72B" in names and "Qwen3-30B-A3B-Base" in names
    assert all(resolve_shape(n) is not None for n in names)


def _write(folder: Path, cfg: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return folder


QWEN2_TINY = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "tie_word_embeddings": True,
}


def test_config_json_qwen2(tmp_path: Path) -> None:
    folder = _write(tmp_path / "tiny-qwen2", QWEN2_TINY)
    s = shape_from_config_json(folder)
    assert s.name == "tiny-qwen2" and s.attention_bias and not s.qk_norm and s.head_dim == 16
    assert (s.num_attention_heads, s.num_key_value_heads, s.num_hidden_layers, s.hidden_size) == (4, 2, 2, 64)
    # embed 300*64; per layer q 64*64+64, k/v 64*32+32 each, o 64*64, mlp 3*64*128, norms 2*64; final norm 64
    per_layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert s.params == 300 * 64 + 2 * per_layer + 64
    assert shape_from_config_json(folder / "config.json") == s  # the file itself works too


def test_config_json_local_folder_wins_over_table(tmp_path: Path) -> None:
    folder = _write(tmp_path / "Qwen2.5-7B-Instruct", QWEN2_TINY)  # same name as a table entry
    s = resolve_shape(str(folder))
    assert s is not None and s.hidden_size == 64


def test_config_json_kv_heads_default_to_heads(tmp_path: Path) -> None:
    cfg = {k: v for k, v in QWEN2_TINY.items() if k != "num_key_value_heads"}
    cfg["model_type"] = "llama"
    s = shape_from_config_json(_write(tmp_path / "m", cfg))
    assert s.num_key_value_heads == s.num_attention_heads == 4
    assert not s.attention_bias and not s.qk_norm  # llama: attention_bias absent = False


def test_config_json_qwen3_moe(tmp_path: Path) -> None:
    cfg = {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "tie_word_embeddings": False,
        "attention_bias": False,
    }
    s = shape_from_config_json(_write(tmp_path / "Qwen3-30B-A3B", cfg))
    table = resolve_shape("Qwen3-30B-A3B")
    assert table is not None
    assert (s.params, s.active_params) == (table.params, table.active_params)
    # two dense layers: fewer experts, and the dense MLP counted for them
    s2 = shape_from_config_json(_write(tmp_path / "m2", {**cfg, "mlp_only_layers": [0, 47]}))
    assert s2.num_moe_layers == 46 and s2.params < s.params


def test_config_json_nested_text_config(tmp_path: Path) -> None:
    s = shape_from_config_json(_write(tmp_path / "vl", {"model_type": "x_vl", "text_config": QWEN2_TINY}))
    assert s.hidden_size == 64 and s.attention_bias


@pytest.mark.parametrize(
    "content", ["{not json", "[1, 2]", json.dumps({**QWEN2_TINY, "hidden_size": None}), json.dumps({"model_type": "qwen2"})]
)
def test_config_json_broken_raises_value_error_naming_the_file(tmp_path: Path, content: str) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "config.json").write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match="config.json"):
        resolve_shape(str(folder))


def test_shape_is_frozen_and_derives_fields() -> None:
    s = ModelShape("x", 8, 8, 2, 256, 512, 1000)
    assert s.head_dim == 32 and s.params > 0 and s.active_params == s.params and s.num_moe_layers == 0
    with pytest.raises(AttributeError):
        s.hidden_size = 1  # type: ignore[misc]


def test_import_is_stdlib_only() -> None:
    import subprocess
    import sys

    code = (
        "import sys, hpc_grpo.config.models;"
        "bad=[m for m in ('torch','transformers','numpy','pydantic','yaml') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == ""
    # the memory estimate, verl's memory model and advice: no numeric stack either (the engines package loads the
    # typed spec)
    code = (
        "import sys, hpc_grpo.engines.memory, hpc_grpo.engines.verl_memory, hpc_grpo.engines.verl_memory_model;"
        "bad=[m for m in ('torch','transformers','numpy') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == ""
