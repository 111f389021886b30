"""Where recipes, cluster profiles and templates are found.

Search order: each folder in HPC_GRPO_PATH (colon-separated; each may hold recipes/, clusters/
and templates/), the source checkout this package runs from, then the copies shipped inside the
wheel. The first match wins, so a user can shadow a shipped recipe without editing it.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpc_grpo.common.closest import closest
from hpc_grpo.config.fields import check_name
from hpc_grpo.common.yamlio import SpecError

_PACKAGE = Path(__file__).resolve().parents[1]
_CHECKOUT = _PACKAGE.parent
_SHIPPED = _PACKAGE / "_shipped"

DATA_ENV = "HPC_GRPO_DATA"  # where `hpc-grpo data` writes and evaluation looks, when set
DEFAULT_DATA_ROOT = "~/hpc-grpo-data"  # the shipped recipes' data paths are under it
TINY_MODEL_DIR = "~/.cache/hpc-grpo/tiny-qwen2"  # `hpc-grpo model tiny` writes it, the tiny recipes and rehearse read it


def data_root() -> Path:
    """The data folder: $HPC_GRPO_DATA, else ~/hpc-grpo-data. The one place this is decided, so what
    `hpc-grpo data` writes is where evaluation looks for it."""
    return Path(os.environ.get(DATA_ENV) or DEFAULT_DATA_ROOT).expanduser()


def search_roots() -> list[Path]:
    roots = [Path(p).expanduser() for p in os.environ.get("HPC_GRPO_PATH", "").split(":") if p]
    if (_CHECKOUT / "pyproject.toml").exists() and (_CHECKOUT / "recipes").is_dir():
        roots.append(_CHECKOUT)
    roots.append(_SHIPPED)
    return roots


def folders(kind: str) -> list[Path]:
    return [root / kind for root in search_roots() if (root / kind).is_dir()]


def is_path(name: str) -> bool:
    """A recipe or profile typed as a file (`./my.yaml`, `/abs/x.yaml`, `~/r.yml`) rather than a name."""
    return "/" in name or name.endswith((".yaml", ".yml"))


def stem(name: str) -> str:
    """The name a recipe or profile goes by: a file's stem when it was typed as a path."""
    return Path(name).stem if is_path(name) else name


def find(kind: str, name: str) -> Path:
    """The YAML file for a recipe or cluster, by name (checked so no name escapes the folders) or by its path."""
    what = kind.rstrip("s")
    if is_path(name):
        path = Path(name).expanduser()
        if not name.endswith((".yaml", ".yml")):
            raise SpecError(f"{name!r} is not a {what} file: a {what} named by its path ends in .yaml",
                            key=what)
        if not path.is_file():
            raise SpecError(f"no {what} file {name} (from {Path.cwd()}): give the path of a {what} YAML, or a "
                            f"name from `hpc-grpo {kind}`", key=what)
        check_name(path.stem, what)
        return path.resolve()
    check_name(name, what)
    for folder in folders(kind):
        candidate = folder / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    names = list_names(kind)
    close = closest(name, names)
    hint = f"did you mean {what}={close}? " if close else ""
    raise SpecError(f"no {what} named {name!r}; {hint}known: {', '.join(names) or 'none'}", key=what)


def list_names(kind: str) -> list[str]:
    names: dict[str, None] = {}
    for folder in folders(kind):
        for path in sorted(folder.glob("*.yaml")):
            names.setdefault(path.stem, None)
    return sorted(names)


def template_dir() -> Path:
    found = folders("templates")
    if not found:
        raise RuntimeError("hpc-grpo's templates are missing: reinstall the package")
    return found[0]
