"""A tiny random Qwen2 model with a locally trained tokenizer, for offline tests and CPU smoke runs.

No Hugging Face Hub access exists on these machines, so tests cannot download even a small model.
This builds one in about a second: Qwen2 architecture (so every code path that handles real Qwen2.5
checkpoints is exercised), ~100k parameters, byte-level BPE tokenizer with ChatML special tokens.

Pitfall handled here (transformers 5.x): AutoTokenizer loads a model_type=qwen2 folder as
Qwen2Tokenizer, which rebuilds the normalizer and pre-tokenizer from vocab/merges (NFC + Qwen2's
split regex, digits split one by one) and ignores those in tokenizer.json. We train with exactly
that normalizer and regex, so both loading paths produce the same ids.
Heavy imports (torch, transformers, tokenizers) stay inside functions.
"""

from __future__ import annotations

import random
from pathlib import Path

from hpc_grpo.common.atomic import build_dir_atomic

__all__ = [
    "QWEN2_PRETOKENIZE_REGEX",
    "CHATML_TEMPLATE",
    "SPECIAL_TOKENS",
    "build_tiny_model",
    "ensure_tiny_model",
    "generate_corpus",
]

# Same pattern as transformers' Qwen2Tokenizer (models/qwen2/tokenization_qwen2.py, PRETOKENIZE_REGEX).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# ChatML as in Qwen2.5-Instruct, without Qwen's default system prompt and tool-calling branches.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

VOCAB_SIZE = 640
HIDDEN_SIZE = 64
INTERMEDIATE_SIZE = 128
NUM_LAYERS = 2
# head_dim = 64 / 2 = 32: vLLM's CPU attention has no head size 16 (it supports 32, 64, 80, ...). Two KV heads, so
# Megatron's TP 2 still divides the query groups (tests/slurm/test_verl_main_ppo.py).
NUM_HEADS = 2
NUM_KV_HEADS = 2
MAX_POSITIONS = 512
# Weight init std (transformers' default is 0.02). With 0.02 the tied embedding rows are so short that no hidden
# state moves a logit by more than ~1: a LoRA, which cannot touch the embedding, then cannot change what the model
# samples, and GRPO shows no learning even when every piece works. A real LM's logits span tens of nats.
INIT_STD = 0.2

_NAMES = ["Natalia", "Weng", "Betty", "James", "Julie", "Mark", "Tina", "Albert", "Ken", "Alexis", "Maria", "Tom"]
_ITEMS = ["clips", "apples", "books", "pages", "dollars", "cookies", "eggs", "marbles", "tickets", "hours"]
_VERBS = ["sold", "bought", "read", "earned", "baked", "collected", "gave away", "found"]
_WORDS = (
    "the a an of to and in is was for on that with as it at by from this be are or have has had not but "
    "what all were when we there can each which she he they their one two three four five six seven eight "
    "nine ten twice half third quarter percent total number more less than many much how per week day month "
    "year minute hour price cost pay spend save left remaining each every first second then after before "
    "school store farm garden class students teacher friends family mother father brother sister children "
    "money cents dollar profit discount tax rate speed distance miles feet inches pounds cups boxes bags rows "
    "step think answer final output question so therefore because if altogether average difference product sum"
).split()


def generate_corpus(seed: int = 0, n: int = 1500) -> list[str]:
    """Arithmetic and GSM8K-style lines (with '<<a*b=c>>' notes, '#### N', $, commas, negatives, newlines),
    so the merges cover what tests and smoke runs actually tokenize."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(1, 99)
        op, res = rng.choice([("+", a + b), ("-", a - b), ("*", a * b), ("/", round(a / b, 2))])
        name, item, verb = rng.choice(_NAMES), rng.choice(_ITEMS), rng.choice(_VERBS)
        total = rng.randint(-50, 120000)
        kind = rng.randrange(5)
        if kind == 4:
            words = rng.sample(_WORDS, 12)
            lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ":", ","]))
        elif kind == 0:
            lines.append(f"{a} {op} {b} = {res}")
        elif kind == 1:
            lines.append(
                f"{name} {verb} {a} {item} in April, and then {b} more in May. How many {item} did {name} have?"
            )
        elif kind == 2:
            lines.append(
                f"{name} has {a} {item}.\n{name} {verb} {a}{op}{b} = <<{a}{op}{b}={res}>>{res} {item}.\n#### {total:,}"
            )
        else:
            lines.append(
                f"Let's think step by step and output the final answer after \"####\". "
                f"It costs ${a}.{b:02d} per hour, so the answer is {res}.\n\n#### {total}"
            )
    return lines


def _train_tokenizer(seed: int):  # -> tokenizers.Tokenizer
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    # Must equal what Qwen2Tokenizer rebuilds on load (see module docstring).
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(generate_corpus(seed), trainer=trainer)
    return tok


def build_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """Build the tiny model + tokenizer into out_dir (created if needed) and return out_dir.

    Deterministic: the same seed gives byte-identical model.safetensors and tokenizer.json.
    """
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    raw = _train_tokenizer(seed)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=IM_END,  # chat models stop at <|im_end|>, like Qwen2.5-Instruct
        pad_token=ENDOFTEXT,
        unk_token=None,
        model_max_length=MAX_POSITIONS,
        padding_side="left",  # decoder-only generation pads on the left
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START]})
    tokenizer.chat_template = CHATML_TEMPLATE
    eot_id, im_end_id = raw.token_to_id(ENDOFTEXT), raw.token_to_id(IM_END)

    config = Qwen2Config(
        vocab_size=raw.get_vocab_size(),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        initializer_range=INIT_STD,
        bos_token_id=eot_id,
        eos_token_id=im_end_id,
        pad_token_id=eot_id,
    )
    # Seed a private generator state: torch.manual_seed would also do, but fork_rng keeps the
    # caller's global RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=eot_id,
        eos_token_id=[im_end_id, eot_id],
        pad_token_id=eot_id,
        do_sample=False,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def ensure_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """Return out_dir, building the model there first if config.json is missing.

    Builds into a sibling temp folder and renames it into place, so a crash never leaves a
    half-written model that later calls would trust; concurrent callers are safe.
    """
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        _refuse_old_shape(out_dir)
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()  # an empty folder (e.g. made by a caller) is no obstacle
    elif out_dir.exists():
        raise FileExistsError(
            f"{out_dir} exists without config.json (a partial or foreign folder); remove it or pick another --out"
        )
    # built with a plain mkdir (the umask's mode: a shared model folder must be readable by the group)
    build_dir_atomic(out_dir, lambda tmp: build_tiny_model(tmp, seed=seed),
                     lambda done: (done / "config.json").is_file())  # another process's model won the race
    return out_dir


def _refuse_old_shape(out_dir: Path) -> None:
    """A tiny model built by an older hpc-grpo has head size 16, which vLLM's CPU attention cannot run: say so
    instead of letting a vLLM rollout fail minutes into a job (the folder is the user's: never deleted here)."""
    import json

    cfg = json.loads((out_dir / "config.json").read_text())
    heads = cfg.get("num_attention_heads") or 1
    head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 0) // heads
    if cfg.get("model_type") == "qwen2" and cfg.get("hidden_size") == HIDDEN_SIZE and head_dim < HIDDEN_SIZE // NUM_HEADS:
        raise FileExistsError(
            f"{out_dir} holds a tiny model from an older hpc-grpo (head size {head_dim}; vLLM's CPU attention "
            f"needs {HIDDEN_SIZE // NUM_HEADS}). Fix: rm -r {out_dir} and run `hpc-grpo model tiny --out {out_dir}`"
        )
