"""`hpc-grpo report RUN`: training curves and GSM8K accuracy per step, as one PNG and a short text summary.

Training metrics come from the engine's own logs, read by hpc_grpo.runstate.metrics: RUN/metrics.jsonl (trl's rows,
or verl's file-logger rows), else verl's console logger lines (`step:N - key:value - ...`) in the job's submitit
logs. Evaluation points come from RUN/eval/step_N.json. matplotlib (extra `report`) is imported only when drawing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.resolve import load_frozen
from hpc_grpo.evaluation import evaluate
from hpc_grpo.runstate import layout, trained
from hpc_grpo.runstate import metrics as engine_metrics

# Our curve name -> the name hpc_grpo.runstate.metrics reads it under (from either engine's keys).
CURVES: dict[str, str] = {"reward": "reward", "kl": "kl", "response length": "response_length", "entropy": "entropy"}


@dataclass
class Report:
    run_name: str
    steps: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # curve -> (step, value)
    evals: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    reward_note: str = ""  # the recipe's health.reward_note: what its reward means (a demo's)
    early_stop: str = ""  # why training ended before its last step (train.early_stop: train_done.json's reason)

    def summary(self) -> list[str]:
        lines = [f"run {self.run_name}: training metrics from {self.source or 'nowhere (none logged yet)'}"]
        if self.reward_note:
            lines.append(f"  what the reward means: {self.reward_note}")
        if self.early_stop:
            lines.append(f"  {self.early_stop}")
        for name, pts in self.steps.items():
            if pts:
                first, last = pts[0][1], pts[-1][1]
                lines.append(f"  {name}: {first:.4g} at step {pts[0][0]} -> {last:.4g} at step {pts[-1][0]} "
                             f"({len(pts)} steps)")
        trend = engine_metrics.reward_trend([{"step": st, "reward": v} for st, v in self.steps.get("reward", [])])
        if trend is not None:
            lines.append(f"  reward, mean of the first {trend.k} steps -> the last {trend.k}: {trend.first:.4g} -> "
                         f"{trend.last:.4g} ({trend.gain:+.4g})")
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


def build(run_dir: Path) -> Report:
    """Curves from the run's metrics (hpc_grpo.runstate.metrics: metrics.jsonl, else verl's console lines in the
    driver logs of RUN/submitit) and the evaluation points."""
    got = engine_metrics.run_metrics(run_dir, layout.driver_logs(run_dir))
    rep = Report(run_dir.name, source=got.source, evals=evaluate.load_results(run_dir), reward_note=reward_note(run_dir),
                 early_stop=early_stop_reason(run_dir))
    for curve, name in CURVES.items():
        rep.steps[curve] = [(r["step"], float(r[name])) for r in got.rows if isinstance(r.get(name), (int, float))]
    return rep


def early_stop_reason(run_dir: Path) -> str:
    """The early_stop record's reason in train_done.json ("early stop at step N: ..."), else ""."""
    early = (trained.done_record(run_dir) or {}).get("early_stop")
    return str(early.get("reason") or "") if isinstance(early, dict) else ""


def reward_note(run_dir: Path) -> str:
    """The frozen recipe's health.reward_note; '' when the run has no readable spec.yaml."""
    spec_file = layout.spec_file(run_dir)
    if not spec_file.is_file():
        return ""
    try:
        return load_frozen(spec_file).recipe.health.reward_note
    except SpecError:
        return ""


def figure_path(run_dir: Path, png: Path | None = None) -> Path:
    """Where `report` writes its figure: --png, else RUN/report.png."""
    return png or layout.report_file(run_dir)


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
    draw_evals(axes.flat[4], rep)
    draw_last_eval(axes.flat[5], rep)
    return save_figure(fig, f"hpc-grpo report: {rep.run_name}", out)


def draw_evals(ax: Any, rep: Report) -> None:
    """Eval accuracy per step, each point labelled with its value (0% reads as 0%, not as a missing line); the step
    axis spans from 0 to past the last eval, so one eval is a labelled point, not a dot on a 23-25 axis."""
    from matplotlib.ticker import PercentFormatter

    ax.set_title("evaluation per step")
    ax.set_xlabel("step")
    ax.set_ylim(-0.05, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    if not rep.evals:
        ax.text(0.5, 0.5, "no evaluation yet", ha="center", va="center", transform=ax.transAxes, color="grey")
        return
    task = next(iter(rep.evals[-1]["scores"]))
    results = [r for r in rep.evals if task in r["scores"]]
    xs = [r["step"] for r in results]
    labelled: set[tuple[int, str]] = set()  # one label per step and value: equal scores share a point
    for key, label in score_keys(rep.evals[-1]["scores"][task]):
        ys = [r["scores"][task].get(key, 0.0) for r in results]
        ax.plot(xs, ys, marker="o", label=label)
        for x, y in zip(xs, ys):
            if len(xs) <= 4 and (x, f"{y:.0%}") not in labelled:
                labelled.add((x, f"{y:.0%}"))
                ax.annotate(f"{y:.0%}", (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlim(0, max(xs) * 1.1 + 1)
    ax.set_xticks(sorted({0, *xs}))
    ax.legend(fontsize=7, title=task, title_fontsize=7)


def draw_last_eval(ax: Any, rep: Report) -> None:
    """The last eval beside the base model: bars labelled with their value, so a 0% bar reads "0%"."""
    from matplotlib.ticker import PercentFormatter

    ax.set_title("policy vs base (last eval)")
    ax.set_ylim(0, 1.1)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    if not rep.evals:
        ax.text(0.5, 0.5, "no evaluation yet", ha="center", va="center", transform=ax.transAxes, color="grey")
        return
    last = rep.evals[-1]
    task = next(iter(last["scores"]))
    base = (last.get("base") or {}).get("scores", {}).get(task)
    pol = last["scores"][task]
    labels, keys = [lb for _, lb in score_keys(pol)], [k for k, _ in score_keys(pol)]
    xs = list(range(len(keys)))
    series = [(f"step {last['step']}", pol, -0.2)] + ([("base", base, 0.2)] if base else [])
    for label, scores, shift in series:
        bars = ax.bar([x + shift for x in xs], [scores.get(k, 0.0) for k in keys], width=0.4, label=label)
        ax.bar_label(bars, labels=[f"{scores.get(k, 0.0):.0%}" for k in keys], fontsize=7, padding=2)
    ax.set_xticks(list(xs), labels)
    pub = last.get("published")
    if pub and task.startswith("gsm8k"):
        ax.axhline(pub["gsm8k"] / 100, ls="--", color="k", lw=1, label=f"published {pub['gsm8k']}%")
    ax.legend(fontsize=7)
    ax.set_xlabel(f"{task}, n={pol['n']}")


# ------------------------------------------------------------------------------------------------ a sweep
@dataclass
class SweepReport:
    """Each member's reward and validation curves, for one figure with the members overlaid."""

    name: str
    metric: str
    mode: str
    members: list[tuple[str, str, Report, list[tuple[int, float]]]]  # (name, overrides, its report, its metric)
    best: str | None = None  # the member with the best value of the sweep's metric

    def summary(self) -> list[str]:
        lines = [f"sweep {self.name}: {len(self.members)} members, best by {self.metric} ({self.mode}): "
                 f"{self.best or 'none logged yet'}"]
        for name, overrides, rep, pts in self.members:
            reward = rep.steps.get("reward", [])
            last = f"reward {reward[-1][1]:.4g} at step {reward[-1][0]}" if reward else "no reward logged"
            best = _best(pts, self.mode)
            at = f"; best {self.metric} {best[1]:.4g} at step {best[0]}" if best else ""
            lines.append(f"  {'*' if name == self.best else ' '} {name} ({overrides}): {last}{at}")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {"sweep": self.name, "metric": self.metric, "mode": self.mode, "best": self.best,
                "members": [{"name": n, "overrides": o, "reward": r.steps.get("reward", []), self.metric: pts}
                            for n, o, r, pts in self.members]}


def _best(pts: list[tuple[int, float]], mode: str) -> tuple[int, float] | None:
    if not pts:
        return None
    return (max if mode == "max" else min)(pts, key=lambda p: p[1])


def build_sweep(folder: Path) -> SweepReport:
    """Every member's report and the sweep's metric per step (runstate.metrics.logged_metrics: the engine's keys
    and eval/... scores), the best member marked."""
    from hpc_grpo.runstate import sweeps

    manifest = sweeps.read_manifest(folder)
    members = []
    for m in manifest.members:
        run_dir = manifest.member_dir(folder, m)
        if not layout.spec_file(run_dir).is_file():
            continue
        engine = load_frozen(layout.spec_file(run_dir)).recipe.engine
        logged = engine_metrics.logged_metrics(run_dir, engine)
        pts = [(step, row[manifest.metric]) for step, row in logged.items() if manifest.metric in row]
        members.append((m.name, " ".join(m.overrides), build(run_dir), pts))
    rep = SweepReport(manifest.name, manifest.metric, manifest.mode, members)
    bests = [(b[1], name) for name, _, _, pts in members if (b := _best(pts, manifest.mode)) is not None]
    if bests:
        rep.best = (max if manifest.mode == "max" else min)(bests)[1]
    return rep


def draw_sweep(rep: SweepReport, out: Path) -> Path:
    """Two panels, the members overlaid: the training reward, and the sweep's metric (a validation's where the
    members validate); the best member drawn thicker and starred in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=80)
    for ax, title in zip(axes, ("reward (training)", rep.metric)):
        ax.set_title(title)
        ax.set_xlabel("step")
    for name, overrides, member, pts in rep.members:
        best = name == rep.best
        style = {"lw": 2.5 if best else 1.0, "marker": "."}
        label = ("* " if best else "") + (overrides or name)
        reward = member.steps.get("reward", [])
        if reward:
            axes[0].plot([p[0] for p in reward], [p[1] for p in reward], label=label, **style)
        if pts:
            axes[1].plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
    return save_figure(fig, f"hpc-grpo report: sweep {rep.name}", out)


def save_figure(fig: Any, title: str, out: Path) -> Path:
    """Title, lay out, write and close a report figure (pyplot keeps every open figure until it is closed)."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
