"""The tiny offline Qwen2 model: loads through the Auto classes, tokenizes consistently, generates."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported anywhere in this module

from hpc_grpo.data.tiny_model import build_tiny_model, ensure_tiny_model  # noqa: E402

SAMPLES = [
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72",
    "#### 1,234",
    "  two  spaces and\ttab\n\nblank line\r\nCRLF",
    "1234567890 -42 3.14 $12.50",
    "Let's think step by step and output the final answer after \"####\".",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "café naïve e\u0301 ÀÉÎ 東京",  # e + combining accent: NFC must compose it the same way on both paths
]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))


def test_files_and_config(model_dir: Path) -> None:
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= names
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (64, 2, 2, 2)
    assert cfg["hidden_size"] // cfg["num_attention_heads"] >= 32  # vLLM's CPU attention has no head size 16
    assert cfg["tie_word_embeddings"] is True
    assert cfg["max_position_embeddings"] == 512
    assert 512 <= cfg["vocab_size"] <= 1000


def test_loads_with_auto_classes(model_dir: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    assert 50_000 < n_params < 500_000
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert model.config.vocab_size == raw.get_vocab_size()
    for name in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert raw.token_to_id(name) is not None
        assert tok.convert_tokens_to_ids(name) == raw.token_to_id(name)
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.config.pad_token_id == tok.pad_token_id


def test_auto_tokenizer_ids_equal_raw_tokenizer_ids(model_dir: Path) -> None:
    """transformers 5 rebuilds Qwen2's normalizer/pre-tokenizer on load: ids must still match tokenizer.json."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in SAMPLES:
        auto_ids = tok(text, add_special_tokens=False)["input_ids"]
        raw_ids = raw.encode(text, add_special_tokens=False).ids
        assert auto_ids == raw_ids, text
        assert tok.decode(auto_ids) == raw.decode(raw_ids, skip_special_tokens=False)
    # digits are split one by one (Qwen2's \p{N} rule), so "1234" is four tokens
    assert len(raw.encode("1234").ids) == 4
    # special tokens stay single tokens inside text
    ids = raw.encode("<|im_start|>user").ids
    assert ids[0] == raw.token_to_id("<|im_start|>")


def test_chat_template_generation_prompt(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    no_prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert not no_prompt.endswith("<|im_start|>assistant\n")
    two = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, *msgs, {"role": "assistant", "content": "#### 4"}], tokenize=False
    )
    assert two == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n#### 4<|im_end|>\n"


def test_generate_eight_tokens(model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompts = ["What is 2+2?", "Natalia sold 48 clips. How many?"]
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in prompts]
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out.shape == (2, batch["input_ids"].shape[1] + 8)
    assert isinstance(tok.batch_decode(out[:, batch["input_ids"].shape[1]:]), list)


def test_same_seed_same_bytes_different_seed_differs(model_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert _sha256(again / "model.safetensors") == _sha256(model_dir / "model.safetensors")
    assert _sha256(again / "tokenizer.json") == _sha256(model_dir / "tokenizer.json")
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert _sha256(other / "model.safetensors") != _sha256(model_dir / "model.safetensors")


def test_ensure_builds_once_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "tiny"
    assert ensure_tiny_model(target) == target
    assert (target / "config.json").is_file()
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(target) == target
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in target.parent.iterdir()] == ["tiny"]  # no temp folders left


def test_ensure_refuses_foreign_folder(tmp_path: Path) -> None:
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        ensure_tiny_model(target)
    assert (target / "notes.txt").read_text() == "mine"


def test_an_older_tiny_model_is_refused_with_the_fix(tmp_path) -> None:
    """A model built by an older hpc-grpo (head size 16) would fail inside vLLM minutes into a job: say so now."""
    import json

    import pytest

    from hpc_grpo.data.tiny_model import ensure_tiny_model

    old = tmp_path / "tiny"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4}))
    with pytest.raises(FileExistsError, match=r"head size 16.*rm -r .*hpc-grpo model tiny"):
        ensure_tiny_model(old)
    assert (old / "config.json").is_file()  # the user's folder: never deleted
