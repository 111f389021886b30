"""`lora.target_modules` against the model's real module names, before the queue wait rather than after it.

peft wraps every module whose name equals a listed target or ends with "." + target (a string other than
"all-linear" is a regular expression matched against the whole name). When nothing matches, peft raises
"Target modules ... not found in the base model" at model load, in the job; a target that matches only a norm
layer is refused there too (LoRA wraps linear, embedding and convolution layers). Both engines load LoRA
through peft, so this check is engine-neutral.

The module names come from the weights' own index, read without torch: the JSON header at the start of every
*.safetensors file (8 bytes of little-endian length, then the JSON: tensor name -> dtype, shape, offsets). A
tensor "model.layers.0.self_attn.q_proj.weight" belongs to module "model.layers.0.self_attn.q_proj"; a module
whose tensors are all one-dimensional is a norm. With tied embeddings `lm_head` holds no tensor of its own and is
added from config.json. Where the weights are not readable here (a Hub id not in the local cache, a path on the
compute nodes only), an info finding says the check was not made.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from hpc_grpo.common.findings import Finding, error, info, warning
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.engines import get_engine

ALL_LINEAR = "all-linear"  # peft's special value: every linear layer but the output head
KEY = "lora.target_modules"
MAX_HEADER = 100 * 2**20  # safetensors refuses headers over 100 MB; anything larger is not a safetensors file


def read_header(path: Path) -> dict[str, dict]:
    """The tensor table of one .safetensors file (its metadata entry left out)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path} is shorter than a safetensors header")
        (size,) = struct.unpack("<Q", raw)
        if size > MAX_HEADER:
            raise ValueError(f"{path}: header length {size} is not a safetensors header")
        header = json.loads(f.read(size))
    return {k: v for k, v in header.items() if k != "__metadata__"}


def module_shapes(folder: Path) -> dict[str, int]:
    """Module name -> the largest rank of its tensors, from every *.safetensors header in `folder`."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    modules: dict[str, int] = {}
    for f in files:
        for tensor, entry in read_header(f).items():
            module = tensor.rpartition(".")[0]
            modules[module] = max(modules.get(module, 0), len(entry.get("shape", [])))
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if config.get("tie_word_embeddings") and "lm_head" not in modules:
        modules["lm_head"] = 2
    return modules


def matches(target: str, module: str) -> bool:
    """peft's rule for one listed target."""
    return module == target or module.endswith("." + target)


def model_folder(spec: RunSpec) -> Path | None:
    """The model's folder on this machine: a local folder, or a Hub id's snapshot in the local cache."""
    path = spec.recipe.model.path
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    from hpc_grpo.planning.preflight import hf_cache_dir

    snapshots = hf_cache_dir() / f"models--{path.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []
    return found[-1].parent if found else None


LORA_RANK_KEYS = ("lora.rank", "actor_rollout_ref.model.lora_rank", "actor_rollout_ref.model.lora.rank")


def lora_off(spec: RunSpec) -> list[Finding]:
    """A typed rank 0 is accepted (it is the default) and turns LoRA off: say so, as a user who typed it may
    have meant a small adapter."""
    typed = [o for o in spec.overrides if o.split("=", 1)[0].lstrip("+") in LORA_RANK_KEYS]
    if spec.recipe.lora.rank or not typed:
        return []
    return [info("lora.rank", f"{typed[-1]}: rank 0 turns LoRA off: the whole model trains (every weight, with its "
                 "optimizer state), and lora.alpha / lora.target_modules are not used",
                 "for an adapter give a rank such as lora.rank=32; for full fine-tuning this is right")]


def check_lora_targets(spec: RunSpec) -> list[Finding]:
    """Errors where peft would refuse the targets at model load; a warning for a listed name matching nothing."""
    lora = spec.recipe.lora
    if not lora.rank or lora.target_modules == ALL_LINEAR:
        return []
    unchecked = get_engine(spec.recipe.engine).lora_targets_unchecked(spec)
    if unchecked:
        return [info(KEY, f"not checked against the model: {unchecked}")]
    folder = model_folder(spec)
    if folder is None:
        return [info(KEY, f"not checked against the model: {spec.recipe.model.path} is not a folder here and not in "
                     "the local Hugging Face cache (peft checks the names when the job loads the model)")]
    try:
        modules = module_shapes(folder)
    except (OSError, ValueError) as exc:
        return [info(KEY, f"not checked against the model: cannot read its weights' names ({exc})")]
    targets = lora.target_modules
    if isinstance(targets, str):
        try:
            pattern = re.compile(targets)
        except re.error as exc:
            return [error(KEY, f"{targets!r} is not a valid regular expression ({exc}); peft matches a string "
                          "target as one", f"list the module names instead, e.g. {KEY}=[q_proj,v_proj]")]
        hit = {m for m in modules if pattern.fullmatch(m)}
        per_target = {targets: hit}
    else:
        per_target = {t: {m for m in modules if matches(t, m)} for t in targets}
        hit = set().union(*per_target.values())
    examples = _leaf_names(modules)
    if not hit:
        return [error(KEY, f"{targets!r} matches no module of the model in {folder}: peft would fail at model load "
                      f"(\"Target modules ... not found in the base model\"); its linear and embedding layers are named "
                      f"{', '.join(examples)}", f"use names from that list, or {KEY}={ALL_LINEAR}")]
    out: list[Finding] = []
    norms = sorted(m for m in hit if modules[m] < 2)
    if norms:
        out.append(error(KEY, f"{targets!r} matches {norms[0]}" + (f" and {len(norms) - 1} more" if len(norms) > 1 else "")
                         + ", a norm layer (one-dimensional weights): peft refuses it at model load (LoRA wraps "
                         "linear, embedding and convolution layers)", f"target only linear or embedding layers: {', '.join(examples)}"))
    missing = [t for t, found in per_target.items() if not found]
    if missing:
        out.append(warning(KEY, f"{', '.join(missing)} matches no module of the model in {folder} (peft ignores it "
                           "while another target matches)", f"check the spelling; the linear and embedding layers are {', '.join(examples)}"))
    return out


def _leaf_names(modules: dict[str, int]) -> list[str]:
    """The distinct last name parts of the two-dimensional modules (q_proj, ...), in order of first appearance."""
    seen: dict[str, None] = {}
    for m, rank in modules.items():
        if rank >= 2:
            seen.setdefault(m.rpartition(".")[2], None)
    return list(seen)
