"""Slurm's time strings, parsed exactly as Slurm reads and prints them. Pure and stdlib only: the spec
validates recipe times with it and the cluster module reads squeue's and sinfo's with it."""

from __future__ import annotations


def parse_duration(text: str) -> int | None:
    """Seconds in a Slurm time string; None for no limit or unknown.

    Slurm prints "M:SS", "H:MM:SS", "D-HH:MM:SS" and accepts "M" (minutes), "D-H", "D-H:M" on input.
    """
    t = text.strip()
    if not t or t.upper() in {"INFINITE", "UNLIMITED", "NONE", "N/A", "(NULL)", "INVALID", "UNKNOWN"}:
        return None
    days = 0
    if "-" in t:
        d, _, t = t.partition("-")
        if not d.isdigit():
            raise ValueError(f"not a Slurm time: {text!r}")
        days = int(d)
        parts = t.split(":")
        if len(parts) == 1:  # D-H
            parts = [parts[0], "0", "0"]
        elif len(parts) == 2:  # D-H:M
            parts = [*parts, "0"]
    else:
        parts = t.split(":")
        if len(parts) == 1:  # M
            parts = ["0", parts[0], "0"]
        elif len(parts) == 2:  # M:S
            parts = ["0", *parts]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a Slurm time: {text!r}")
    h, m, s = (int(p) for p in parts)
    return ((days * 24 + h) * 60 + m) * 60 + s
