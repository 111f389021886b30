#!/usr/bin/env python3
"""Benchmark `hpc-grpo plan` against what it replaces, side by side in one run:

  plan (verl schema)  vs  verl's own `python -m verl.trainer.main_ppo --config-name X <overrides> --cfg job`
                          with the same overrides (needs a full verl install: --verl-python, default
                          .venv-verl/bin/python of this checkout; the row is skipped, with the reason, without it)
  plan --no-schema    vs  a bare Hydra compose of the same overrides against verl's YAMLs

Targets: plan with schema >= 10x faster than `--cfg job`; plan --no-schema >= 3x faster than the bare compose.
Every run is a fresh process. Printed: the median wall time and the median CPU time (user + sys of the child,
from getrusage): on a shared machine the wall time mostly measures the other tenants, so both ratios are shown
and the verdict names the one it used. `plan`'s schema cache is warmed once before timing (it is built once per
verl version and config hash; a cold first run composes like the bare compose does).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BARE = """
import json, sys, importlib.util, warnings
warnings.simplefilter("ignore")
from hydra import compose, initialize_config_dir
folder = importlib.util.find_spec("verl").submodule_search_locations[0] + "/trainer/config"
name, overrides = json.load(open(sys.argv[1]))
with initialize_config_dir(config_dir=folder, version_base=None):
    compose(config_name=name, overrides=overrides)
"""


def timed(argv: list[str], repeat: int, env: dict[str, str]) -> tuple[float, float]:
    """(median wall s, median CPU s) of `repeat` fresh runs; any run that does not exit 0 aborts the benchmark
    (so a rejected override can never pass for a fast `--cfg job`)."""
    walls, cpus = [], []
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        walls.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:6])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return statistics.median(walls), statistics.median(cpus)


def verl_importable(python: str) -> str | None:
    """None if `python` can import verl's trainer entry point, else why not."""
    if not Path(python).exists():
        return f"{python} does not exist (build it with `bash tools/setup-env.sh verl`, or pass --verl-python)"
    proc = subprocess.run([python, "-c", "import verl.trainer.main_ppo"], capture_output=True, text=True)
    if proc.returncode:
        return f"{python} cannot import verl.trainer.main_ppo: {proc.stderr.strip().splitlines()[-1:]}"
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="qwen2.5-7b-codegen")
    p.add_argument("--cluster", default="a100-ib")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--verl-python", default=str(REPO / ".venv-verl" / "bin" / "python"),
                   help="an interpreter with full verl (torch, ray) for the `main_ppo --cfg job` row")
    a = p.parse_args()

    sys.path.insert(0, str(REPO))
    from hpc_grpo.engines.verl import VerlEngine
    from hpc_grpo.config.resolve import resolve_spec

    cmd = VerlEngine().command(resolve_spec(a.recipe, a.cluster, ["cluster.runs_root=/nonexistent/runs"], run_name="bench"))
    py = sys.executable
    env = {**os.environ, "WANDB_MODE": "offline"}
    plan = [py, "-m", "hpc_grpo.cli.app", "plan", f"recipe={a.recipe}", f"cluster={a.cluster}",
            "cluster.runs_root=/nonexistent/runs", "--name", "bench", "--json"]
    subprocess.run(plan, capture_output=True, env=env)  # warm the schema cache (once per verl version + config hash)
    rows: list[tuple[str, str, tuple[float, float], tuple[float, float] | None, float, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "overrides.json"
        spec_file.write_text(json.dumps([cmd.config_name, cmd.overrides]))
        with_schema = timed(plan, a.repeat, env)
        why = verl_importable(a.verl_python)
        cfg_job = None
        if why is None:
            cfg_job = timed([a.verl_python, "-m", "verl.trainer.main_ppo", "--config-name", cmd.config_name,
                             *cmd.overrides, "--cfg", "job"], a.repeat, env)
        rows.append(("plan (verl schema)", "verl main_ppo --cfg job", with_schema, cfg_job, 10.0, why or ""))
        no_schema = timed([*plan, "--no-schema"], a.repeat, env)
        bare = timed([py, "-c", BARE, str(spec_file)], a.repeat, env)
        rows.append(("plan --no-schema", "bare hydra compose", no_schema, bare, 3.0, ""))

    load = os.getloadavg()[0]
    print(f"{a.recipe} on {a.cluster}: {len(cmd.overrides)} overrides; median of {a.repeat} fresh processes; "
          f"load average {load:.1f} on {os.cpu_count()} CPUs")
    print(f"{'ours':20} {'wall s':>7} {'cpu s':>6}   {'baseline':26} {'wall s':>7} {'cpu s':>6}   "
          f"{'wall x':>6} {'cpu x':>6}  target")
    for ours, theirs, (w, c), base, target, skipped in rows:
        if base is None:
            print(f"{ours:20} {w:7.3f} {c:6.3f}   {theirs:26} skipped: {skipped}")
            continue
        bw, bc = base
        wall_x, cpu_x = bw / w, bc / c
        verdict = "MET" if cpu_x >= target else "MISSED"
        print(f"{ours:20} {w:7.3f} {c:6.3f}   {theirs:26} {bw:7.3f} {bc:6.3f}   {wall_x:5.1f}x {cpu_x:5.1f}x  "
              f">= {target:g}x (CPU): {verdict}; wall {'met' if wall_x >= target else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
