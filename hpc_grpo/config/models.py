"""Model shape facts, so `plan` and the engines' own rules can check layouts and memory on an offline login node.
In config/ beside the spec: a fact about the recipe's input (its model), below the engines that read it.

A local model folder's config.json wins; otherwise a built-in table holds the families the recipes
use (values copied from the public Hugging Face config.json files). Parameter counts are computed
from the architecture rather than typed in, so table, config.json and memory estimate agree.
Stdlib only: this module is on the path of `hpc-grpo plan`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "ModelShape",
    "ParamGroups",
    "count_params",
    "known_models",
    "param_groups",
    "resolve_shape",
    "shape_from_config_json",
]


@dataclass(frozen=True, slots=True)
class ParamGroups:
    """Parameter counts by where they live; the memory estimate shards each group differently."""

    embedding: int
    lm_head: int  # 0 when tied to the embedding
    attention: int  # all layers: q/k/v/o (+ qkv bias, + q/k norm)
    norms: int  # all layers' RMSNorm weights + the final norm
    dense_mlp: int  # all dense layers' gate/up/down
    experts: int  # all MoE layers, all experts' gate/up/down
    router: int  # all MoE layers' router (gate) weights
    active_experts: int  # the experts one token actually uses (top-k of `experts`)

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.lm_head
            + self.attention
            + self.norms
            + self.dense_mlp
            + self.experts
            + self.router
        )

    @property
    def active(self) -> int:
        return self.total - self.experts + self.active_experts


def _groups(
    *,
    hidden_size: int,
    intermediate_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    vocab_size: int,
    head_dim: int | None = None,
    num_experts: int = 0,
    num_experts_per_tok: int = 0,
    moe_intermediate_size: int = 0,
    tie_word_embeddings: bool = False,
    attention_bias: bool = False,
    qk_norm: bool = False,
    num_moe_layers: int | None = None,
) -> ParamGroups:
    h = hidden_size
    d = head_dim or h // num_attention_heads
    q_out = num_attention_heads * d
    kv_out = num_key_value_heads * d
    moe_layers = (num_hidden_layers if num_experts else 0) if num_moe_layers is None else num_moe_layers
    dense_layers = num_hidden_layers - moe_layers

    attn = h * q_out + 2 * h * kv_out + q_out * h
    if attention_bias:  # Qwen2: bias on q, k, v (not o)
        attn += q_out + 2 * kv_out
    if qk_norm:  # Qwen3: RMSNorm over head_dim on q and k
        attn += 2 * d
    expert_mlp = 3 * h * moe_intermediate_size
    return ParamGroups(
        embedding=vocab_size * h,
        lm_head=0 if tie_word_embeddings else vocab_size * h,
        attention=attn * num_hidden_layers,
        norms=2 * h * num_hidden_layers + h,
        dense_mlp=3 * h * intermediate_size * dense_layers,
        experts=expert_mlp * num_experts * moe_layers,
        router=h * num_experts * moe_layers,
        active_experts=expert_mlp * num_experts_per_tok * moe_layers,
    )


def count_params(**config: Any) -> tuple[int, int]:
    """(total, active) parameters of a Llama/Qwen2/Qwen3(-MoE) decoder from its config fields
    (the keyword arguments of `_groups`, named as in config.json).

    Counts embeddings, per layer q/k/v/o (+ Qwen2's qkv bias, + Qwen3's q/k norm), the SwiGLU MLP
    (gate, up, down) or, for MoE layers, every expert + the router, two RMSNorms per layer plus the
    final norm, and the lm_head unless tied. Active = total minus the experts a token does not use.
    Rotary embeddings have no parameters.
    """
    g = _groups(**config)
    return g.total, g.active


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The shape facts of one model that layout and memory checks need.

    `params`/`active_params` = 0 and `head_dim` = 0 mean "derive" (done in __post_init__), so the
    table below cannot drift from `count_params`. `num_moe_layers` = -1 means every layer is MoE
    when `num_experts` > 0 (true for Qwen3-MoE: decoder_sparse_step 1, no mlp_only_layers).
    """

    name: str
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_experts: int = 0  # 0 = dense
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    params: int = 0
    active_params: int = 0
    head_dim: int = 0
    attention_bias: bool = False  # Qwen2 has bias on q/k/v
    qk_norm: bool = False  # Qwen3 normalises q and k per head
    num_moe_layers: int = -1
    model_type: str = ""

    def __post_init__(self) -> None:
        if self.num_attention_heads <= 0 or self.hidden_size <= 0 or self.num_hidden_layers <= 0:
            raise ValueError(f"{self.name}: heads, hidden_size and layers must be positive")
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_moe_layers < 0:
            object.__setattr__(self, "num_moe_layers", self.num_hidden_layers if self.num_experts else 0)
        if self.params == 0:
            g = param_groups(self)
            object.__setattr__(self, "params", g.total)
            object.__setattr__(self, "active_params", g.active)
        elif self.active_params == 0:
            object.__setattr__(self, "active_params", self.params)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def param_groups(shape: ModelShape) -> ParamGroups:
    """The parameter groups of a shape (see ParamGroups)."""
    return _groups(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        vocab_size=shape.vocab_size,
        head_dim=shape.head_dim or None,
        num_experts=shape.num_experts,
        num_experts_per_tok=shape.num_experts_per_tok,
        moe_intermediate_size=shape.moe_intermediate_size,
        tie_word_embeddings=shape.tie_word_embeddings,
        attention_bias=shape.attention_bias,
        qk_norm=shape.qk_norm,
        num_moe_layers=shape.num_moe_layers if shape.num_moe_layers >= 0 else None,
    )


def lora_trainable_params(shape: ModelShape, rank: int) -> int:
    """Adapter parameters for LoRA on all linear layers: rank x (in + out) per linear layer.

    Counts q/k/v/o, gate/up/down of dense MLPs and of every expert, and the MoE router; PEFT's
    all-linear leaves the lm_head out.
    """
    if rank <= 0:
        return 0
    h, d = shape.hidden_size, shape.head_dim
    q, kv = shape.num_attention_heads * d, shape.num_key_value_heads * d
    attn = (h + q) + 2 * (h + kv) + (q + h)
    dense_layers = shape.num_hidden_layers - shape.num_moe_layers
    per_dense = 3 * (h + shape.intermediate_size)
    per_moe = shape.num_experts * 3 * (h + shape.moe_intermediate_size) + (h + shape.num_experts)
    return rank * (attn * shape.num_hidden_layers + per_dense * dense_layers + per_moe * shape.num_moe_layers)


# ------------------------------------------------------------------------------------ the table
# Values from each model's config.json on the Hugging Face Hub (Qwen/..., meta-llama/...).
def _qwen25(name: str, heads: int, kv: int, layers: int, hidden: int, inter: int, vocab: int, tie: bool) -> ModelShape:
    return ModelShape(
        name=name,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        attention_bias=True,
        model_type="qwen2",
    )


_TABLE: tuple[ModelShape, ...] = (
    _qwen25("Qwen2.5-0.5B-Instruct", 14, 2, 24, 896, 4864, 151936, True),
    _qwen25("Qwen2.5-1.5B-Instruct", 12, 2, 28, 1536, 8960, 151936, True),
    _qwen25("Qwen2.5-3B-Instruct", 16, 2, 36, 2048, 11008, 151936, True),
    _qwen25("Qwen2.5-7B-Instruct", 28, 4, 28, 3584, 18944, 152064, False),
    _qwen25("Qwen2.5-14B-Instruct", 40, 8, 48, 5120, 13824, 152064, False),
    _qwen25("Qwen2.5-32B-Instruct", 40, 8, 64, 5120, 27648, 152064, False),
    _qwen25("Qwen2.5-72B-Instruct", 64, 8, 80, 8192, 29568, 152064, False),
    ModelShape(
        name="Qwen3-30B-A3B",
        num_attention_heads=32,
        num_key_value_heads=4,
        num_hidden_layers=48,
        hidden_size=2048,
        intermediate_size=6144,  # unused: every layer is MoE
        vocab_size=151936,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        tie_word_embeddings=False,
        head_dim=128,  # not hidden/heads (= 64)
        qk_norm=True,
        model_type="qwen3_moe",
    ),
    ModelShape(
        name="Qwen3-235B-A22B",
        num_attention_heads=64,
        num_key_value_heads=4,
        num_hidden_layers=94,
        hidden_size=4096,
        intermediate_size=12288,  # unused: every layer is MoE
        vocab_size=151936,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=1536,
        tie_word_embeddings=False,
        head_dim=128,
        qk_norm=True,
        model_type="qwen3_moe",
    ),
    ModelShape(
        name="Llama-3.1-8B-Instruct",
        num_attention_heads=32,
        num_key_value_heads=8,
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        vocab_size=128256,
        tie_word_embeddings=False,
        model_type="llama",
    ),
)

# Other Hub names with the same architecture (base models, re-releases).
_ALIASES: dict[str, str] = {
    **{s.name.removesuffix("-Instruct"): s.name for s in _TABLE if s.name.endswith("-Instruct")},
    "Qwen3-30B-A3B-Base": "Qwen3-30B-A3B",
    "Qwen3-30B-A3B-Instruct-2507": "Qwen3-30B-A3B",
    "Qwen3-30B-A3B-Thinking-2507": "Qwen3-30B-A3B",
    "Meta-Llama-3.1-8B-Instruct": "Llama-3.1-8B-Instruct",
    "Meta-Llama-3.1-8B": "Llama-3.1-8B-Instruct",
}

_BY_NAME: dict[str, ModelShape] = {s.name.lower(): s for s in _TABLE}
for _alias, _target in _ALIASES.items():
    _BY_NAME[_alias.lower()] = replace(_BY_NAME[_target.lower()], name=_alias)


def known_models() -> list[str]:
    """Every model name the built-in table answers for (canonical names and aliases), sorted."""
    return sorted(s.name for s in _BY_NAME.values())


# ---------------------------------------------------------------------------------- config.json
def _need_int(cfg: dict[str, Any], key: str, path: Path) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{path}: '{key}' missing or not an integer (got {v!r})")
    return v


def _opt_int(cfg: dict[str, Any], key: str, default: int = 0) -> int:
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def shape_from_config_json(path: Path) -> ModelShape:
    """Read a Hugging Face config.json (or the folder holding it) into a ModelShape.

    Understands Llama, Qwen2, Qwen3 and Qwen3-MoE keys; multimodal configs that nest the language
    model under `text_config` are unwrapped. `num_key_value_heads` defaults to the head count (no
    GQA), `head_dim` to hidden/heads. Qwen2 always has qkv bias (its config has no key for it);
    others follow `attention_bias`. Raises ValueError naming the file when a needed key is missing.
    """
    path = Path(path).expanduser()
    file = path / "config.json" if path.is_dir() else path
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: cannot read model config: {e}") from e
    if not isinstance(cfg, dict):
        raise ValueError(f"{file}: model config is not a JSON object")
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type", ""))}

    model_type = str(cfg.get("model_type", "") or "")
    heads = _need_int(cfg, "num_attention_heads", file)
    layers = _need_int(cfg, "num_hidden_layers", file)
    hidden = _need_int(cfg, "hidden_size", file)
    num_experts = _opt_int(cfg, "num_experts") or _opt_int(cfg, "num_local_experts")
    moe_layers = -1
    if num_experts:
        step = _opt_int(cfg, "decoder_sparse_step", 1) or 1
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        moe_layers = sum(1 for i in range(layers) if i not in mlp_only and (i + 1) % step == 0)
    bias_default = model_type in ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")
    return ModelShape(
        name=(path if path.is_dir() else file.parent).name or model_type,
        num_attention_heads=heads,
        num_key_value_heads=_opt_int(cfg, "num_key_value_heads", heads) or heads,
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=_opt_int(cfg, "intermediate_size"),
        vocab_size=_need_int(cfg, "vocab_size", file),
        num_experts=num_experts,
        num_experts_per_tok=_opt_int(cfg, "num_experts_per_tok") if num_experts else 0,
        moe_intermediate_size=_opt_int(cfg, "moe_intermediate_size") if num_experts else 0,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        head_dim=_opt_int(cfg, "head_dim"),
        attention_bias=bool(cfg.get("attention_bias", bias_default)),
        qk_norm=model_type.startswith("qwen3"),
        num_moe_layers=moe_layers,
        model_type=model_type,
    )


def resolve_shape(model_path: str) -> ModelShape | None:
    """The shape of `model_path`: its local config.json if it is a model folder, else the table.

    Table lookup uses the last path component, case-insensitively ("Qwen/Qwen2.5-7B-Instruct" ->
    "Qwen2.5-7B-Instruct"; base names without -Instruct map to the same shape). None when unknown,
    so the caller can say "shape checks skipped" instead of guessing. A local config.json that is
    broken raises ValueError: silently falling back to the table could check the wrong model.
    """
    if not model_path or not model_path.strip():
        return None
    p = Path(model_path.strip()).expanduser()
    try:
        local = p.is_dir() and (p / "config.json").is_file()
    except OSError:
        local = False
    if local:
        return shape_from_config_json(p)
    last = model_path.strip().rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]
    return _BY_NAME.get(last.lower())
