#!/usr/bin/env python3
"""Throughput of the execution reward: scores a fixed set of completions and sets the rate against a verl step.

The set (default 1,000) cycles over HumanEval problems: half are the reference solution (pass), a quarter return
None (fail), a quarter loop forever (each is killed after grpo.code.per_test_timeout). All run through
hpc_grpo.rewards.code.score_batch on this machine's CPUs, exactly as the trl job and verl's reward workers do.

The target: scoring one step of the 7B codegen recipe (batch.train x grpo.n responses) must take at most 10% of
that step. The step time is ESTIMATED here (nothing measures a 7B step on this machine), from the recipe:
  generation: responses x mean response tokens / (rollout engines x tokens/s per engine)
  training:   10 x params x tokens / (GPUs x peak FLOP/s x MFU)  (actor fwd+bwd 6, ref and old log-prob 2 each)
with the assumptions printed (change them with the options). The node's CPUs for the reward are the cluster's
cpus_per_node minus the 3 per GPU that verl's Ray workers take.

    .venv/bin/python tools/bench_code_reward.py [--count 1000] [--per-test-timeout 1.0] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpc_grpo.rewards.code import RewardWeights, score_batch  # noqa: E402
from hpc_grpo.data.codegen import ground_truth  # noqa: E402
from hpc_grpo.evaluation.humaneval import load_humaneval  # noqa: E402


def completion_set(count: int) -> tuple[list[str], list[str], list[str]]:
    problems = load_humaneval()
    texts, gts, kinds = [], [], []
    for i in range(count):
        p = problems[i % len(problems)]
        slot = i % 4
        if slot in (0, 1):
            body, kind = p["canonical_solution"], "pass"
        elif slot == 2:
            body, kind = "    return None\n", "fail"
        else:
            body, kind = "    while True:\n        pass\n", "timeout"
        texts.append("```python\n" + p["prompt_code"] + body + "\n```")
        gts.append(ground_truth(p))
        kinds.append(kind)
    return texts, gts, kinds


def step_estimate(args: argparse.Namespace) -> dict[str, float]:
    from hpc_grpo.config.models import resolve_shape
    from hpc_grpo.config.resolve import resolve_spec

    spec = resolve_spec(args.recipe, args.cluster)
    r = spec.recipe
    responses = r.batch.train * r.grpo.n
    resp_tok = r.data.max_response_length * args.response_fill
    prompt_tok = r.data.max_prompt_length * args.prompt_fill
    gpus = r.resources.nodes * spec.gpus_per_node
    engines = gpus // r.parallel.rollout_tp
    gen_s = responses * resp_tok / (engines * args.engine_tokens_per_s)
    params = resolve_shape(r.model.path).params
    train_s = 10 * params * responses * (resp_tok + prompt_tok) / (gpus * args.peak_tflops * 1e12 * args.mfu)
    reward_cpus = max(1, spec.cluster.cpus_per_node * r.resources.nodes - 3 * gpus)
    return {"responses": responses, "gpus": gpus, "generation_s": gen_s, "training_s": train_s,
            "step_s": gen_s + train_s, "reward_cpus": reward_cpus, "params": params}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--per-test-timeout", type=float, default=1.0, help="the recipe's grpo.code.per_test_timeout")
    ap.add_argument("--workers", type=int, default=None, help="parallel sandboxes (default: this process's CPUs)")
    ap.add_argument("--recipe", default="qwen2.5-7b-codegen")
    ap.add_argument("--cluster", default="a100-ib")
    ap.add_argument("--response-fill", type=float, default=0.5, help="mean response length / max_response_length")
    ap.add_argument("--prompt-fill", type=float, default=0.3, help="mean prompt length / max_prompt_length")
    ap.add_argument("--engine-tokens-per-s", type=float, default=2500.0, help="decode tokens/s of one vLLM engine")
    ap.add_argument("--peak-tflops", type=float, default=312.0, help="bf16 dense peak per GPU (A100 312, H100 989)")
    ap.add_argument("--mfu", type=float, default=0.35)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    texts, gts, kinds = completion_set(args.count)
    weights = RewardWeights(per_test_timeout=args.per_test_timeout)
    cpus = len(os.sched_getaffinity(0))
    t0 = time.monotonic()
    scores = score_batch(texts, gts, weights, workers=args.workers or cpus)
    wall = time.monotonic() - t0
    got = {k: sum(1 for kind, s in zip(kinds, scores) if kind == k and s.kind == {"pass": "passed", "fail": "failed", "timeout": "timeout"}[k])
           for k in ("pass", "fail", "timeout")}
    expected = {k: kinds.count(k) for k in got}
    cost = {k: sum(s.seconds for kind, s in zip(kinds, scores) if kind == k) for k in got}
    rate = args.count / wall
    est = step_estimate(args)
    scoring_s = est["responses"] / (rate / cpus * est["reward_cpus"])
    share = scoring_s / est["step_s"]
    result = {"completions": args.count, "wall_s": round(wall, 2), "cpus": cpus, "per_s": round(rate, 2),
              "per_s_per_cpu": round(rate / cpus, 3), "outcomes_as_expected": got, "expected": expected,
              "sandbox_seconds_by_kind": {k: round(v, 1) for k, v in cost.items()},
              "per_test_timeout": args.per_test_timeout, "step_estimate": {k: round(v, 1) for k, v in est.items()},
              "scoring_s_per_step": round(scoring_s, 2), "share_of_step": round(share, 4),
              "target_share": 0.10, "ratio_to_target": round(share / 0.10, 3), "met": share <= 0.10}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.count} completions in {wall:.1f} s on {cpus} CPUs: {rate:.2f}/s ({rate / cpus:.2f}/s per CPU)")
        print(f"outcomes as expected: {got} of {expected}; sandbox seconds by kind: {result['sandbox_seconds_by_kind']}")
        print(f"{args.recipe} on {args.cluster}: {est['responses']} responses/step, estimated step {est['step_s']:.0f} s "
              f"(generation {est['generation_s']:.0f} s + training {est['training_s']:.0f} s); reward CPUs {est['reward_cpus']}")
        print(f"scoring one step: {scoring_s:.1f} s = {share:.1%} of the step; target <= 10%: ratio {share / 0.10:.2f} "
              f"-> {'met' if share <= 0.10 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
