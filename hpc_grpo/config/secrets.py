"""Secrets never become settings: anything typed as a setting is written into spec.yaml and the job scripts, so the
names in SECRET_ENV are refused at any depth, and error messages show <hidden> in place of their values."""

from __future__ import annotations

from typing import Any

from hpc_grpo.common.yamlio import SpecError

SECRET_ENV = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
HIDDEN = "<hidden>"


def secret_in(key: str, value: Any = None) -> str | None:
    """The dotted path of a secret in `key=value` (its last key, or a key inside a mapping value), else None.

    Anything typed as a setting is written into spec.yaml and the job scripts: a secret there is readable by
    everyone who can read the run directory, so the names in SECRET_ENV are refused at any depth."""
    if key.lstrip("+~").rsplit(".", 1)[-1].upper() in SECRET_ENV:
        return key
    if isinstance(value, dict):
        for k, v in value.items():
            found = secret_in(f"{key}.{k}" if key else str(k), v)
            if found:
                return found
    return None


def secret_error(path: str) -> SpecError:
    """The refusal of a secret: names the key and the fix, never the value."""
    name = path.rsplit(".", 1)[-1].upper()
    where = ("W&B also reads ~/.netrc, which `wandb login` writes" if name == "WANDB_API_KEY"
             else "huggingface_hub also reads the token `huggingface-cli login` stores")
    return SpecError(
        f"{name} is a secret and cannot be a setting: settings are written into the run's frozen spec and the job "
        f"scripts, where anyone who can read the run directory would read it (value not shown). Fix: remove it here "
        f"and `export {name}=...` in the shell you submit from; the job inherits that environment ({where})",
        key=path,
    )


def redact(value: Any) -> Any:
    """`value` for an error message, with the value of every secret key replaced by <hidden>."""
    if isinstance(value, dict):
        return {k: HIDDEN if secret_in(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value
