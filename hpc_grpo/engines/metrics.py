"""Where each engine reports its per-step numbers, in one vocabulary for `status`.

trl: the job's callback writes metrics.jsonl (job/trl_job.py), one JSON object per step. verl has no such file: its
console logger prints one line per step to the driver's log, `step:12 - actor/kl_loss:0.001 - critic/score/mean:0.55
- ...` (keys `name:value` joined by " - "), which is what is parsed here. Only lines that start a metric record
(`step:N - `) are read, so any other output of the driver is ignored.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

# status's names -> the keys each engine logs (first one present wins)
TRL_KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("reward",),
    "kl": ("kl",),
    "grad_norm": ("grad_norm",),
    "response_length": ("completion_length",),
    "step_time": ("step_time",),
}
VERL_KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("critic/score/mean", "critic/rewards/mean"),
    "kl": ("actor/kl_loss", "actor/ppo_kl"),
    "grad_norm": ("actor/grad_norm",),
    "response_length": ("response_length/mean",),
    "response_clip_ratio": ("response_length/clip_ratio",),
    "step_time": ("timing_s/step",),
}
_VERL_LINE = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")
_VERL_TOTAL = re.compile(r"Total training steps:\s*(\d+)")


def _num(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _pick(raw: dict[str, Any], keys: dict[str, tuple[str, ...]]) -> dict[str, float | None]:
    row: dict[str, float | None] = {}
    for name, candidates in keys.items():
        for key in candidates:
            if key in raw:
                row[name] = _num(raw[key])
                break
    return row


def parse_verl_line(line: str) -> dict[str, Any] | None:
    """One verl console metric line -> {"step": N, status name: value}; None for any other line."""
    m = _VERL_LINE.search(line.rstrip())
    if not m:
        return None
    raw: dict[str, Any] = {}
    for item in m.group(2).split(" - "):
        key, sep, value = item.rpartition(":")
        if sep and key.strip():
            raw[key.strip()] = value.strip()
    return {"step": int(m.group(1)), **_pick(raw, VERL_KEYS)}


def verl_rows(log_text: str) -> tuple[list[dict[str, Any]], int | None]:
    """Metric rows and verl's "Total training steps" from a driver log (later lines win for a repeated step)."""
    rows: dict[int, dict[str, Any]] = {}
    total = None
    for line in log_text.splitlines():
        if "Total training steps" in line and (t := _VERL_TOTAL.search(line)):
            total = int(t.group(1))
        row = parse_verl_line(line)
        if row is not None:
            rows[row["step"]] = row
    return [rows[k] for k in sorted(rows)], total


def trl_rows(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl rows in status's names, plus `time` (wall clock of the step's log)."""
    out: list[dict[str, Any]] = []
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            raw = json.loads(line)
            step = int(raw["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a line being written
        out.append({"step": step, "time": _num(raw.get("time")), **_pick(raw, TRL_KEYS)})
    return out
