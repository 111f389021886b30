#!/usr/bin/env python3
"""verl's built-in code scorer on a set of completions, run the way verl runs it: the other half of
tools/bench_code_reward.py, which starts this file in the venv that has full verl (`.venv-verl`).

The pinned verl scores code data sources ("apps", "codecontests", "codeforces", "taco") with
verl.utils.reward_score.default_compute_score -> prime_code.compute_score(..., continuous=True) when no
SandboxFusion URL is set: each completion runs in a multiprocessing child of the scoring process with
reliability_guard (some os/shutil/subprocess functions set to None) and no other isolation. Its prime reward
manager spreads the calls over a ProcessPoolExecutor (verl.workers.reward_manager.prime.run_reward_scoring);
this runner calls that same function with `workers` processes.

stdin: {"groups": [{"kind": "pass", "completions": [...], "ground_truths": [APPS in/out JSON strings]}, ...],
        "workers": N, "batch": B, "data_source": "apps", "out": PATH}
Each group is scored in calls of B completions (verl scores one step's batch per call; its per-completion limit of
300 s runs from the call's start, so a call must not hold more than its processes finish in that time) and timed
on its own, so the caller gets a rate per kind of completion (the groups one after another are the whole set).
The result goes to PATH as JSON: {"groups": [{"kind", "wall_s", "scores"}], "verl_version", "data_source",
"workers", "batch"}. Not stdout: prime_code's multiprocessing managers can outlive a call (verl's pool terminates
its workers at the end of each call) and would hold a pipe open; the caller ends this process group afterwards.
Only verl and the standard library are imported here (not hpc_grpo): this runs in verl's venv.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    job = json.loads(sys.stdin.read())
    import verl
    from verl.utils.reward_score import default_compute_score
    from verl.workers.reward_manager.prime import run_reward_scoring

    source, workers, batch = job.get("data_source", "apps"), int(job["workers"]), int(job["batch"])
    out = []
    for group in job["groups"]:
        texts, gts = group["completions"], group["ground_truths"]
        scores: list[float] = []
        t0 = time.monotonic()
        for i in range(0, len(texts), batch):
            chunk = texts[i:i + batch]
            scores += run_reward_scoring(default_compute_score, chunk, gts[i:i + batch], [source] * len(chunk),
                                         num_processes=workers)
        out.append({"kind": group["kind"], "wall_s": time.monotonic() - t0, "scores": scores})
    with open(job["out"], "w") as f:
        json.dump({"groups": out, "verl_version": verl.__version__, "data_source": source, "workers": workers,
                   "batch": batch}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
