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


def parse_time_minutes(value: str | int) -> int:
    """Slurm's time formats -> whole minutes (seconds round up), exactly as sbatch reads them:
    "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S"."""
    if isinstance(value, bool):
        raise ValueError("time must be minutes or 'HH:MM:SS', not a boolean")
    text = str(value).strip()
    days, clock = text.split("-", 1) if "-" in text else ("", text)
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or ("-" in text and not days.isdigit()) or len(parts) > 3:
        raise ValueError(f"time {value!r} is not minutes, 'M:S', 'H:M:S' or 'D-H[:M[:S]]'")
    nums = [int(p) for p in parts]
    if days:
        h, m, sec = (nums + [0, 0])[:3]
        total_s = ((int(days) * 24 + h) * 60 + m) * 60 + sec
    elif len(nums) == 1:
        total_s = nums[0] * 60
    elif len(nums) == 2:
        total_s = nums[0] * 60 + nums[1]
    else:
        total_s = (nums[0] * 60 + nums[1]) * 60 + nums[2]
    if len(nums) > 1 and (nums[-1] >= 60 or (len(nums) == 3 and nums[1] >= 60)):
        raise ValueError(f"time {value!r}: minutes and seconds must be below 60")
    if total_s <= 0:
        raise ValueError(f"time {value!r} must be positive")
    return -(-total_s // 60)
