"""Rules many settings share: names that become folders and job names, paths expanded on the login node, words
that go on #SBATCH lines, sizes, and the strict base every recipe and profile model derives from."""

from __future__ import annotations

import getpass
import os
import re

from pydantic import BaseModel, ConfigDict

from hpc_grpo.common.yamlio import SpecError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}\Z")
# Values that land on #SBATCH lines, which no shell parses, so quoting cannot protect them.
SLURM_WORD_RE = re.compile(r"^[A-Za-z0-9_.,:@+=-]+\Z")


def check_name(value: str, what: str) -> str:
    """Names become folder and job names: no path separators, no `..`, no shell metacharacters."""
    if not isinstance(value, str) or not NAME_RE.match(value) or ".." in value:
        raise SpecError(
            f"invalid {what} name {value!r}: use letters, digits, '.', '_' and '-' only "
            "(no '/', no '..', at most 80 characters)",
            key=what,
        )
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, validate_default=True)


def expand_vars(value: str) -> str:
    """`~` and `$VAR` expanded; $USER falls back to the login name (containers often leave it unset)."""
    env = dict(os.environ)
    env.setdefault("USER", getpass.getuser())
    expanded = re.sub(
        r"\$(\w+)|\$\{(\w+)\}",
        lambda m: env.get(m.group(1) or m.group(2), m.group(0)),
        value,
    )
    return os.path.expanduser(expanded)


def expand_path(value: str) -> str:
    """Expand `~` and `$VAR` now, on the login node: the job script quotes paths, so no shell would."""
    if not isinstance(value, str) or not ("~" in value or "$" in value):
        return value
    expanded = expand_vars(value)
    if "$" in expanded:
        raise ValueError(f"{value!r} names an environment variable that is not set")
    return expanded


def slurm_word(v: str | None) -> str | None:
    """Values on #SBATCH lines: no shell parses those lines, so quoting cannot protect them."""
    if v is not None and not SLURM_WORD_RE.match(v):
        raise ValueError(f"{v!r} cannot go on an #SBATCH line: use letters, digits and . , : @ + = _ - only")
    return v


SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?)?\s*\Z", re.IGNORECASE)
KEEP_BEST_RE = re.compile(r"^[^:\s]+(:(max|min))?\Z")


def parse_size(value: int | str) -> int:
    """Bytes from 123, "500M", "1.5T", "200GiB" (powers of 1024: disk tools and quotas count that way)."""
    if isinstance(value, bool):
        raise ValueError("is a boolean, not a size")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("must be > 0 bytes")
        return value
    m = SIZE_RE.match(str(value))
    if not m:
        raise ValueError("is not a size: use bytes or a number with K, M, G, T or P (e.g. 200G)")
    unit = m.group(2).upper()
    n = int(float(m.group(1)) * 1024 ** ("KMGTP".index(unit) + 1 if unit else 0))
    if n <= 0:
        raise ValueError("must be > 0 bytes")
    return n
