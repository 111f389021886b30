"""`hpc-grpo report RUN`: training curves and GSM8K accuracy per step, as one PNG and a short text summary.

Training metrics come from the engine's own logs: trl's RUN/metrics.jsonl (one line per step, written by the trl
job), or verl's console logger lines (`step:N - key:value - ...`) in the job's submitit logs. Evaluation points
come from RUN/eval/step_N.json. matplotlib (extra `report`) is imported only when drawing.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo import evaluate

# Our curve name -> the keys engines log it under (first found wins).
CURVES: dict[str, tuple[str, ...]] = {
    "reward": ("reward", "critic/score/mean", "critic/rewards/mean"),
    "kl": ("kl", "actor/kl_loss", "actor/ppo_kl"),
    "response length": ("completion_length", "response_length/mean"),
    "entropy": ("entropy", "actor/entropy"),
}
_VERL_LINE = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")
_VERL_PAIR = re.compile(r"([\w/@.\-]+):(-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))")


@dataclass
class Report:
    run_name: str
    steps: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # curve -> (step, value)
    evals: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""

    def summary(self) -> list[str]:
        lines = [f"run {self.run_name}: training metrics from {self.source or 'nowhere (none logged yet)'}"]
        for name, pts in self.steps.items():
            if pts:
                first, last = pts[0][1], pts[-1][1]
                lines.append(f"  {name}: {first:.4g} at step {pts[0][0]} -> {last:.4g} at step {pts[-1][0]} "
                             f"({len(pts)} steps)")
        for r in self.evals:
            for task, s in r["scores"].items():
                base = (r.get("base") or {}).get("scores", {}).get(task)
                keys = score_keys(s)
                beside = (" (base " + " / ".join(f"{base.get(k, 0):.1%}" for k, _ in keys) + ")" if base else "")
                lines.append(f"  eval step {r['step']} {task}: "
                             + ", ".join(f"{label} {s[k]:.1%}" for k, label in keys)
                             + f" on {s['n']} problems{beside}")
        if not self.evals:
            lines.append("  no evaluation yet: hpc-grpo eval " + self.run_name)
        return lines


GSM8K_KEYS = (("strict_match", "strict"), ("flexible_extract", "flexible"), ("verl_strict_reward", "verl strict"))


def score_keys(s: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, label) of the scores one task result holds: GSM8K's three, or humaneval's pass@k."""
    return [(k, label) for k, label in GSM8K_KEYS if k in s] or [(k, k) for k in s if k.startswith("pass@")]


def parse_verl_log(text: str) -> list[dict[str, float]]:
    """verl's console logger: one `step:N - key:value - key:value` line per step."""
    rows: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        m = _VERL_LINE.search(line)
        if not m:
            continue
        row = rows.setdefault(int(m.group(1)), {"step": float(m.group(1))})
        for key, value in _VERL_PAIR.findall(m.group(2)):
            row[key] = float(value)
    return [rows[k] for k in sorted(rows)]


def training_rows(run_dir: Path) -> tuple[list[dict[str, Any]], str]:
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        rows = []
        for line in metrics.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        return rows, str(metrics)
    rows = []
    logs = sorted((run_dir / "submitit").glob("*_0_log.out")) if (run_dir / "submitit").is_dir() else []
    for log in logs:
        rows += parse_verl_log(log.read_text(errors="replace"))
    return rows, ", ".join(map(str, logs)) if rows else ""


def build(run_dir: Path) -> Report:
    rows, source = training_rows(run_dir)
    rep = Report(run_dir.name, source=source, evals=evaluate.load_results(run_dir))
    by_step: dict[int, dict[str, Any]] = {}
    for row in rows:
        if isinstance(row.get("step"), (int, float)):
            by_step[int(row["step"])] = row  # a step logged twice (requeue): the later line wins
    for name, keys in CURVES.items():
        pts = []
        for step in sorted(by_step):
            value = next((by_step[step][k] for k in keys if isinstance(by_step[step].get(k), (int, float))), None)
            if value is not None and math.isfinite(value):
                pts.append((step, float(value)))
        rep.steps[name] = pts
    return rep


def draw(rep: Report, out: Path) -> Path:
    """A 2x3 figure: four training curves, eval accuracy per step, and the base/published comparison."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(11, 5.6), dpi=80)
    for ax, (name, pts) in zip(axes.flat[:4], rep.steps.items()):
        ax.set_title(name)
        ax.set_xlabel("step")
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", lw=1)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
    ax = axes.flat[4]
    ax.set_title("evaluation per step")
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    if rep.evals:
        task = next(iter(rep.evals[-1]["scores"]))
        xs = [r["step"] for r in rep.evals if task in r["scores"]]
        for key, label in score_keys(rep.evals[-1]["scores"][task]):
            ax.plot(xs, [r["scores"][task][key] for r in rep.evals if task in r["scores"]], marker="o", label=label)
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no evaluation yet", ha="center", va="center", transform=ax.transAxes, color="grey")
    ax = axes.flat[5]
    ax.set_title("policy vs base (last eval)")
    ax.set_ylim(0, 1)
    if rep.evals:
        last = rep.evals[-1]
        task = next(iter(last["scores"]))
        base = (last.get("base") or {}).get("scores", {}).get(task)
        pol, bas = last["scores"][task], base or {}
        labels, keys = [lb for _, lb in score_keys(pol)], [k for k, _ in score_keys(pol)]
        xs = range(len(keys))
        ax.bar([x - 0.2 for x in xs], [pol[k] for k in keys], width=0.4, label=f"step {last['step']}")
        ax.bar([x + 0.2 for x in xs], [bas.get(k, 0) for k in keys], width=0.4, label="base")
        ax.set_xticks(list(xs), labels)
        pub = last.get("published")
        if pub and task.startswith("gsm8k"):
            ax.axhline(pub["gsm8k"] / 100, ls="--", color="k", lw=1, label=f"published {pub['gsm8k']}%")
        ax.legend(fontsize=7)
        ax.set_xlabel(f"{task}, n={pol['n']}")
    fig.suptitle(f"hpc-grpo report: {rep.run_name}", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
