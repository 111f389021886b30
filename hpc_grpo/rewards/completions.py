"""What trl hands a reward function: completions (plain text or chat messages) and one ground truth each. Every
trl reward reads them here, so the text it scores and the count check are the same for all of them. Stdlib only."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def completion_text(completion: Any) -> str:
    """Text of one trl completion: a plain string, or a chat list whose last assistant message counts."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return str(completion.get("content") or "")
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, Mapping)]
        assistant = [m for m in messages if m.get("role") == "assistant"]
        chosen = assistant[-1] if assistant else (messages[-1] if messages else None)
        if chosen is None:
            return ""
        content = chosen.get("content")
        if isinstance(content, list):  # multimodal-style content parts
            return "".join(
                str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"
            )
        return str(content or "")
    raise TypeError(f"unsupported completion type {type(completion).__name__}: expected str or list of messages")


def check_counts(n_completions: int, n_truths: int) -> None:
    """One ground truth per completion: a mismatch means the data's column and the batch disagree, and zip would
    silently score the wrong pairs."""
    if n_completions != n_truths:
        raise ValueError(f"{n_completions} completions but {n_truths} ground truths")


def texts_and_truths(completions: Iterable[Any], ground_truth: Iterable[Any]) -> tuple[list[str], list[Any]]:
    """trl's arguments as the texts to score and their ground truths, checked to pair up."""
    texts = [completion_text(c) for c in completions]
    truths = list(ground_truth)
    check_counts(len(texts), len(truths))
    return texts, truths
