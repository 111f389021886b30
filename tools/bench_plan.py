#!/usr/bin/env python3
"""Benchmark: `hpc-grpo plan` with and without verl's schema check, against a bare Hydra compose.

All three start the same way, as a fresh Python process, and the bare compose composes exactly
the overrides plan renders (baseline: what any tool that checks against verl's config must pay).
Targets (issue 2): plan --no-schema >= 3x faster than the bare compose; plan with the schema
check within 1.5x of it. Prints medians over --repeat runs and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARE = """
import json, sys, importlib.util, warnings
warnings.simplefilter("ignore")
from hydra import compose, initialize_config_dir
folder = importlib.util.find_spec("verl").submodule_search_locations[0] + "/trainer/config"
name, overrides = json.load(open(sys.argv[1]))
with initialize_config_dir(config_dir=folder, version_base=None):
    compose(config_name=name, overrides=overrides)
"""


def timed(argv: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{argv} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="qwen2.5-7b-codegen")
    p.add_argument("--cluster", default="a100-ib")
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hpc_grpo.engines.verl import VerlEngine
    from hpc_grpo.resolve import resolve_spec

    cmd = VerlEngine().command(resolve_spec(a.recipe, a.cluster, run_name="bench"))
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "overrides.json"
        spec_file.write_text(json.dumps([cmd.config_name, cmd.overrides]))
        py = sys.executable
        plan = [py, "-m", "hpc_grpo.cli", "plan", f"recipe={a.recipe}", f"cluster={a.cluster}", "--name", "bench", "--json"]
        runs = {
            "plan --no-schema": timed([*plan, "--no-schema"], a.repeat),
            "plan (verl schema)": timed(plan, a.repeat),
            "bare hydra compose": timed([py, "-c", BARE, str(spec_file)], a.repeat),
        }
    med = {k: statistics.median(v) for k, v in runs.items()}
    base = med["bare hydra compose"]
    print(f"{a.recipe} on {a.cluster}, {len(cmd.overrides)} overrides, median of {a.repeat} fresh processes")
    print(f"{'':22} {'median s':>9} {'min s':>7}  ratio to bare compose")
    for k, v in runs.items():
        print(f"{k:22} {med[k]:9.3f} {min(v):7.3f}  {med[k] / base:.2f}x")
    speedup = base / med["plan --no-schema"]
    overhead = med["plan (verl schema)"] / base
    print(f"plan --no-schema is {speedup:.1f}x faster than the bare compose (target >= 3x): "
          f"{'PASS' if speedup >= 3 else 'MISS'}")
    print(f"plan with schema is {overhead:.2f}x the bare compose (target <= 1.5x): {'PASS' if overhead <= 1.5 else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
