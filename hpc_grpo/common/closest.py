"""The name a user probably meant: one rule for "did you mean" across keys, recipes and cluster profiles."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.5  # difflib's similarity ratio below which no suggestion beats listing the names


def closest(name: str, names: Iterable[str], cutoff: float = CUTOFF) -> str | None:
    """The known name closest to `name`, or None when none is close enough to suggest."""
    found = difflib.get_close_matches(name, list(names), n=1, cutoff=cutoff)
    return found[0] if found else None
