"""The one reader of per-step training metrics, for both engines, in one vocabulary (status, monitor, report, prune).

RUN/metrics.jsonl holds one JSON object per line in either layout:
  trl: flat rows the job's callback writes (job/trl_job.py): `{"step": 3, "reward": 0.4, "kl": 0.001, ...}`;
  verl: the rows of verl's file logger (verl.utils.tracking.FileLogger, to VERL_FILE_LOGGER_PATH =
        RUN/verl_metrics.jsonl), which the prune poller copies over: `{"step": 3, "data": {"critic/score/mean": ...}}`.
verl's console logger also prints one line per step to the driver's log, `step:12 - actor/kl_loss:0.001 - ...`
(keys `name:value` joined by " - "): read when metrics.jsonl has nothing (a run without the file logger). Only
lines that start a metric record (`step:N - `) are read, so any other output of the driver is ignored.
For prune's keep_best, `logged_metrics` adds trl's trainer_state.json log history and the eval scores
(RUN/eval/step_N.json) to metrics.jsonl's rows, by the engine's own keys.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.config.engine_traits import traits_of
from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout

# our names -> the keys engines log them under (first one present wins): trl's flat keys, then verl's
KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("reward", "critic/score/mean", "critic/rewards/mean"),
    "kl": ("kl", "actor/kl_loss", "actor/ppo_kl"),
    "grad_norm": ("grad_norm", "actor/grad_norm"),
    "response_length": ("completion_length", "response_length/mean"),
    "response_clip_ratio": ("response_length/clip_ratio",),
    "step_time": ("step_time", "timing_s/step"),
    "entropy": ("entropy", "actor/entropy"),
    "loss": ("loss", "actor/pg_loss"),
    # the sampler against the trainer (verl): runstate/health reads them
    "rollout_probs_diff": ("training/rollout_probs_diff_mean",),
    "rollout_probs_corr": ("training/rollout_actor_probs_pearson_corr",),
    "rollout_kl": ("rollout_corr/kl",),
}
_VERL_LINE = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")
_VERL_TOTAL = re.compile(r"Total training steps:\s*(\d+)")


def _num(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _pick(raw: dict[str, Any]) -> dict[str, float | None]:
    row: dict[str, float | None] = {}
    for name, candidates in KEYS.items():
        for key in candidates:
            if key in raw:
                row[name] = _num(raw[key])
                break
    return row


# ------------------------------------------------------------------------------------------- metrics.jsonl
def parse_record(line: str | bytes) -> tuple[int, dict[str, Any]] | None:
    """One metrics.jsonl line -> (step, its metrics by the engine's own keys); None for a line being written or
    anything else. verl's rows keep their metrics under "data"; trl's are flat."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    step = obj.get("step")
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    data = obj.get("data")
    raw = dict(data) if isinstance(data, dict) else {k: v for k, v in obj.items() if k != "step"}
    if "time" in obj and "time" not in raw:
        raw["time"] = obj["time"]
    return step, raw


def read_raw(path: Path) -> dict[int, dict[str, Any]]:
    """step -> metrics by the engine's own keys (prune's keep_best names them so). A step logged again (a restart
    of verl, a line copied twice) is merged, the later value winning."""
    out: dict[int, dict[str, Any]] = {}
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        rec = parse_record(line) if line.strip() else None
        if rec is not None:
            out.setdefault(rec[0], {}).update(rec[1])
    return {k: out[k] for k in sorted(out)}


def file_rows(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl (either layout) as rows in our names, plus `time` (wall clock of the step's log), by step."""
    return [{"step": step, "time": _num(raw.get("time")), **_pick(raw)} for step, raw in read_raw(path).items()]


# -------------------------------------------------------------------------------------- verl console lines
def parse_verl_line(line: str) -> dict[str, Any] | None:
    """One verl console metric line -> {"step": N, our name: value}; None for any other line."""
    m = _VERL_LINE.search(line.rstrip())
    if not m:
        return None
    raw: dict[str, Any] = {}
    for item in m.group(2).split(" - "):
        key, sep, value = item.rpartition(":")
        if sep and key.strip():
            raw[key.strip()] = value.strip()
    return {"step": int(m.group(1)), **_pick(raw)}


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


# ------------------------------------------------------------------------------------------------ one run
@dataclass
class RunMetrics:
    """A run's rows (our names, by step), the total steps verl printed (or None), and where the rows came from."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    total: int | None = None
    source: str = ""


def run_metrics(run_dir: Path, driver_logs: list[Path] | None = None) -> RunMetrics:
    """RUN/metrics.jsonl when it has rows (trl's, or verl's file logger copied by the prune poller) with verl's file
    logger's newer steps, else verl's console lines in the driver logs (oldest first: later allocations win). The
    logs also give verl's total."""
    rows: dict[int, dict[str, Any]] = {}
    total = None
    for log in driver_logs or []:
        try:
            found, t = verl_rows(log.read_text(errors="replace"))
        except OSError:
            continue
        rows.update({r["step"]: r for r in found})
        total = t or total
    path = layout.metrics_file(run_dir)
    logged = file_rows(path)
    # verl's file logger itself: the steps of the running start before the prune poller has copied them (it looks
    # every 20 s), so status and watch show a step, and its health, when verl logs it
    live = {r["step"]: r for r in file_rows(layout.verl_log(run_dir))}
    if logged or live:
        merged = {**{r["step"]: r for r in logged}, **live}
        return RunMetrics([merged[k] for k in sorted(merged)], total, str(path) if logged else str(layout.verl_log(run_dir)))
    source = "verl console metric lines (step:N - key:value) in the driver logs" if rows else ""
    return RunMetrics([rows[k] for k in sorted(rows)], total, source)


# ------------------------------------------------------------------------- every metric, for prune's keep_best
def _flatten(prefix: str, data: Any, out: dict[str, float]) -> None:
    if isinstance(data, dict):
        for k, v in data.items():
            _flatten(f"{prefix}/{k}" if prefix else str(k), v, out)
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        out[prefix] = float(data)


def logged_metrics(run_dir: Path, engine: str) -> dict[int, dict[str, float]]:
    """step -> {metric: value} from every record hpc-grpo knows, later sources winning:
    RUN_DIR/metrics.jsonl (flat lines, or verl's file-logger lines {"step", "data"}), trl's
    trainer_state.json log_history (newest checkpoint that has one), and RUN_DIR/eval/step_N.json
    (numeric leaves of its "metrics" object, else of the whole file, as eval/<path>: eval/gsm8k/strict_match)."""
    run_dir = Path(run_dir)
    out: dict[int, dict[str, float]] = {}

    def put(step: Any, row: dict[str, Any]) -> None:
        if isinstance(step, int) and not isinstance(step, bool):
            flat: dict[str, float] = {}
            _flatten("", row, flat)
            out.setdefault(step, {}).update(flat)

    for step, raw in read_raw(layout.metrics_file(run_dir)).items():
        put(step, raw)
    if traits_of(engine).metrics_in_checkpoints:
        for _, path in reversed(ck.candidates(run_dir, engine)):
            state = ck.trainer_state(path)
            if state is None or "log_history" not in state:
                continue
            history = state["log_history"]
            for row in history if isinstance(history, list) else []:
                if isinstance(row, dict):
                    put(row.get("step"), {k: v for k, v in row.items() if k != "step"})
            break
    for step, path in layout.eval_results(run_dir):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        flat: dict[str, float] = {}
        # evaluation's files keep their scores under "metrics" (eval/gsm8k/strict_match); other numbers too
        scores = data.get("metrics") if isinstance(data, dict) and isinstance(data.get("metrics"), dict) else data
        _flatten("eval", scores, flat)
        flat.pop("eval/step", None)
        out.setdefault(step, {}).update(flat)
    return out


# ------------------------------------------------------------------------------------------ learning, in one number
@dataclass(frozen=True)
class Trend:
    """The mean reward over a run's first `k` logged steps and over its last `k`."""

    k: int
    first: float
    last: float

    @property
    def gain(self) -> float:
        return self.last - self.first


def reward_trend(rows: list[dict[str, Any]], k: int | None = None) -> Trend | None:
    """Window means, not single steps: one step's reward is the mean of a few groups of samples and jumps by a
    whole correct answer's worth, so learning shows in the mean of a quarter of the run (k) against another.
    None when fewer than 2k steps logged a reward."""
    rewards = [r["reward"] for r in sorted(rows, key=lambda r: r.get("step", 0)) if r.get("reward") is not None]
    k = k or max(1, len(rewards) // 4)
    if len(rewards) < 2 * k:
        return None
    return Trend(k, sum(rewards[:k]) / k, sum(rewards[-k:]) / k)
