"""Error messages that name the key: pydantic's errors turned into one line per bad key (where it was set, what is
wrong, "did you mean"), with the names users bring from verl, trl and guides written for them, and this project's own
retired names, each pointing at the key that means the same now."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from hpc_grpo.common.closest import closest
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.secrets import HIDDEN, redact, secret_in
from hpc_grpo.config.spec import Recipe, RunSpec


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """Walk a pydantic model class along an error location to the model that owns the last key."""
    current: type[BaseModel] = model
    for part in loc[:-1]:
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            current = ann
        else:
            return None
    return current


# Names users bring from verl, trl or guides written for them, and the recipe key that means the same.
ALIASES = {
    "grpo.group_size": "grpo.n",
    "grpo.num_generations": "grpo.n",
    "grpo.rollout_n": "grpo.n",
    "grpo.beta": "grpo.kl_coef",
    "grpo.kl_loss_coef": "grpo.kl_coef",
    "grpo.learning_rate": "grpo.lr",
    "batch.train_batch_size": "batch.train",
    "batch.ppo_mini_batch_size": "batch.mini",
    "batch.ppo_micro_batch_size_per_gpu": "batch.micro_per_gpu",
    "batch.use_dynamic_bsz": "batch.dynamic_bsz",
    "data.train_batch_size": "batch.train",
    "parallel.tensor_model_parallel_size": "parallel.tp",
    "parallel.pipeline_model_parallel_size": "parallel.pp",
    "parallel.expert_model_parallel_size": "parallel.ep",
    "parallel.context_parallel_size": "parallel.cp",
    "checkpoint.max_actor_ckpt_to_keep": "checkpoint.keep_last",
    "checkpoint.save_total_limit": "checkpoint.keep_last",
    "checkpoint.keep_latest_k": "checkpoint.keep_last",
    "checkpoint.max_mem": "checkpoint.max_bytes",
    "train.max_steps": "train.total_training_steps",
    "resources.n_gpus_per_node": "resources.gpus_per_node",
    "resources.nnodes": "resources.nodes",
    # retired recipe keys: refused like any unknown key, the message names the new one
    "checkpoint.keep": "checkpoint.keep_last",
}


def described(model: type[BaseModel], dotted: str) -> str:
    """', what the key is', from the description where its field is declared; '' for a key with none."""
    loc = tuple(dotted.split("."))
    owner = _model_at(model, loc)
    field = owner.model_fields.get(loc[-1]) if owner is not None else None
    return f", {field.description}" if field is not None and field.description else ""


def did_you_mean(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """The key the user probably meant, with what it is: a known alias, else the closest name where the key was."""
    dotted = ".".join(map(str, loc))
    if model is Recipe and dotted in ALIASES:
        return f"did you mean '{ALIASES[dotted]}'{described(Recipe, ALIASES[dotted])}? "
    if model is RunSpec and loc[:1] == ("recipe",):  # a frozen spec.yaml: its recipe section holds recipe keys
        hint = did_you_mean(Recipe, loc[1:])
        return hint.replace("did you mean '", "did you mean 'recipe.", 1) if hint.startswith("did you") else hint
    owner = _model_at(model, loc)
    if owner is None:
        return ""
    names = list(owner.model_fields)
    close = closest(str(loc[-1]), names)
    if close:
        suggestion = ".".join(map(str, (*loc[:-1], close)))
        return f"did you mean '{suggestion}'{described(model, suggestion)}? "
    return f"valid keys here: {', '.join(names)}. "


def quote_hint(err: Any, key: str) -> str:
    """Where YAML typed a value the key wants as text (`0`, `1e3`, `true`, `null`), say to quote it: the value the
    user meant is the characters they typed."""
    value = err.get("input")
    if err["type"] != "string_type" or not isinstance(value, (bool, int, float)) and value is not None:
        return ""
    typed = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    kind = {bool: "a boolean", int: "a number", float: "a number"}.get(type(value), "nothing (null)")
    return (f"; YAML read it as {kind}: quote what you typed to keep it text, e.g. {key}='\"{typed}\"' on the "
            f"command line (the single quotes keep the double ones from the shell) or {key.rsplit('.', 1)[-1]}: "
            f"\"{typed}\" in a file")


def validation_error(
    exc: ValidationError, model: type[BaseModel], where: dict[str, str], prefix: str = ""
) -> SpecError:
    """Turn pydantic's error into one message per bad key: where it was set, what is wrong, the fix."""
    parts: list[str] = []
    first_key = ""
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = prefix + ".".join(str(p) for p in loc)
        first_key = first_key or key
        dotted = ".".join(str(p) for p in loc)
        origin = where.get(dotted) or next((v for k, v in where.items() if k.startswith(dotted + ".")), "")
        origin = f" ({origin})" if origin else ""
        if err["type"] == "extra_forbidden":
            msg = f"unknown key{origin}; {did_you_mean(model, loc)}".rstrip()
        elif err["type"] == "missing":
            msg = f"required key is missing{origin}"
        else:
            text = str(err["msg"]).removeprefix("Value error, ")
            shown = HIDDEN if any(secret_in(str(p)) for p in loc) else redact(err.get("input"))
            msg = f"{text}, got {shown!r}{origin}{quote_hint(err, key)}"
        parts.append(f"{key}: {msg}")
    return SpecError("\n  ".join(parts), key=first_key)
