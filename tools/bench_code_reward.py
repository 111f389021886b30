#!/usr/bin/env python3
"""Throughput of the execution reward beside verl's built-in code scorer, on the same completions.

The set (default 1,000) cycles over the HumanEval problems whose tests are all `assert candidate(LITERALS) ==
LITERAL` (132 of 164; their arguments and answers survive JSON unchanged, so verl's APPS layout holds them exactly):
by default half are the reference solution (pass), a quarter return None (fail), a quarter loop forever (killed
at the scorer's time limit); --mix changes the shares. Both scorers get the same completions and the same test
pairs, one kind at a time (each kind timed on its own; one after another they are the whole set):

- ours: hpc_grpo.rewards.code.score_batch, the tests `assert f(ARGS) == EXPECTED`, on this machine's CPUs, exactly
  as the trl job and verl's reward workers run it (the sandbox, with whatever isolation it has here: printed);
- verl's: verl.utils.reward_score.default_compute_score with data source "apps" (prime_code.compute_score,
  continuous=True: what the pinned verl uses for code without a SandboxFusion URL; no isolation) through verl's prime
  reward manager's process pool (run_reward_scoring), in the venv with full verl (tools/bench_verl_code_score.py
  runs there as a subprocess: $HPC_GRPO_VERL_PYTHON, else this checkout's .venv-verl).

It prints completions per second and per CPU for each and the ratio ours / verl's (target: >= 1, the isolated
reward at least as fast per CPU as the unisolated baseline), with the load average: on a shared machine the other
work's share of the CPUs is not ours. Note the time limits differ by design: ours is grpo.code.per_test_timeout
(--per-test-timeout, the recipe's 1 s) and the first overrun ends the completion; verl's prime_code gives the whole
test set 5 s (fixed in its compute_score).

Then it sets our rate against a verl step of the 7B codegen recipe: scoring one step (batch.train x grpo.n
responses) must take at most 10% of that step. The step time is ESTIMATED (nothing measures a 7B step here), from
the recipe:
  generation: responses x mean response tokens / (rollout engines x tokens/s per engine)
  training:   10 x params x tokens / (GPUs x peak FLOP/s x MFU)  (actor fwd+bwd 6, ref and old log-prob 2 each)
with the assumptions printed (change them with the options). The node's CPUs for the reward are the cluster's
cpus_per_node minus the 3 per GPU that verl's Ray workers take.

    .venv/bin/python tools/bench_code_reward.py [--count 1000] [--mix 2:1:1] [--per-test-timeout 1.0] [--workers N]
                                                [--verl-python PATH | --no-verl] [--json]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpc_grpo.rewards.code import RewardWeights, score_batch  # noqa: E402
from hpc_grpo.evaluation.humaneval import load_humaneval  # noqa: E402

KINDS = ("pass", "fail", "timeout")
BODY = {"fail": "    return None\n", "timeout": "    while True:\n        pass\n"}
OUR_KIND = {"pass": "passed", "fail": "failed", "timeout": "timeout"}  # CodeScore.kind expected of each
VERL_SCORE = {"pass": 1.0, "fail": 0.0, "timeout": 0.0}
VERL_RUNNER = ROOT / "tools" / "bench_verl_code_score.py"


def _same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (so JSON did not turn a tuple into a list, or 1.0 into 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_pairs(problem: dict[str, Any]) -> list[tuple[list[str], str, list[Any], Any]] | None:
    """HumanEval's check(candidate) as (argument sources, expected source, arguments, expected) per assert; None
    unless every statement is `assert candidate(LITERALS) == LITERAL` (or `assert True`) with JSON-exact values."""
    tests = problem["tests"]
    if len(tests) != 1 or not isinstance(tests[0], str):
        return None
    check = [n for n in ast.parse(tests[0]).body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(check) != 1:
        return None
    pairs = []
    for st in check[0].body:
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            continue  # a docstring or a bare string
        if not isinstance(st, ast.Assert):
            return None
        t = st.test
        if isinstance(t, ast.Constant) and t.value is True:
            continue
        if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)):
            return None
        call = t.left
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "candidate"
                and not call.keywords and not any(isinstance(a, ast.Starred) for a in call.args)):
            return None
        try:
            args = [ast.literal_eval(a) for a in call.args]
            expected = ast.literal_eval(t.comparators[0])
        except (ValueError, SyntaxError, TypeError):
            return None
        for v in (*args, expected):  # verl's APPS reader turns dict keys into ints: no dicts
            if isinstance(v, dict) or not _same(json.loads(json.dumps(v)), v):
                return None
        pairs.append(([ast.unparse(a) for a in call.args], ast.unparse(t.comparators[0]), args, expected))
    return pairs or None


def ours_truth(problem: dict[str, Any], pairs: list[tuple[list[str], str, list[Any], Any]]) -> str:
    """Our ground truth with exactly these pairs, one assert each (the prompt's imports still apply)."""
    entry = problem["entry_point"]
    tests = [f"assert {entry}({', '.join(srcs)}) == {exp}" for srcs, exp, _, _ in pairs]
    return json.dumps({"tests": tests, "entry_point": entry, "prompt_code": problem["prompt_code"]})


def verl_truth(problem: dict[str, Any], pairs: list[tuple[list[str], str, list[Any], Any]]) -> str:
    """The same pairs in verl's APPS call-based layout: one JSON argument per line, the answer as JSON."""
    return json.dumps({"fn_name": problem["entry_point"],
                       "inputs": ["\n".join(json.dumps(a) for a in args) for _, _, args, _ in pairs],
                       "outputs": [json.dumps(exp) for _, _, _, exp in pairs]})


def completion_set(count: int, mix: tuple[int, int, int]) -> tuple[dict[str, dict[str, list[str]]], int]:
    """kind -> {"texts", "ours", "verl"}: `count` completions over the usable problems, kinds cycling by `mix`;
    and how many problems were usable."""
    usable = [(p, pairs) for p in load_humaneval() if (pairs := test_pairs(p))]
    cycle = [k for k, n in zip(KINDS, mix) for _ in range(n)]
    out: dict[str, dict[str, list[str]]] = {k: {"texts": [], "ours": [], "verl": []} for k in KINDS}
    for i in range(count):
        p, pairs = usable[i % len(usable)]
        kind = cycle[i % len(cycle)]
        body = p["canonical_solution"] if kind == "pass" else BODY[kind]
        group = out[kind]
        group["texts"].append("```python\n" + p["prompt_code"] + body + "\n```")
        group["ours"].append(ours_truth(p, pairs))
        group["verl"].append(verl_truth(p, pairs))
    return out, len(usable)


def run_ours(groups: dict[str, dict[str, list[str]]], weights: RewardWeights, workers: int) -> dict[str, Any]:
    res: dict[str, Any] = {"kinds": {}, "isolation": set()}
    for kind in KINDS:
        g = groups[kind]
        if not g["texts"]:
            continue
        t0 = time.monotonic()
        scores = score_batch(g["texts"], g["ours"], weights, workers=workers)
        wall = time.monotonic() - t0
        res["isolation"].update(str(s.detail.get("isolation")) for s in scores if s.detail.get("isolation"))
        res["kinds"][kind] = {"n": len(scores), "wall_s": wall,
                              "as_expected": sum(s.kind == OUR_KIND[kind] for s in scores),
                              "sandbox_s": sum(s.seconds for s in scores)}
    res["isolation"] = ",".join(sorted(res["isolation"])) or "unknown"
    return res


def verl_python(explicit: str | None) -> str:
    """$HPC_GRPO_VERL_PYTHON, else this checkout's .venv-verl (hpc_grpo.evaluation.export.verl_python's rule)."""
    if explicit:
        return explicit
    from hpc_grpo.evaluation.export import verl_python as find

    return find(ROOT)


def _leftovers(pgid: int) -> list[int]:
    """Processes still in the runner's process group (it has exited): prime_code's managers that outlived it."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    found.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return found


def run_verl(groups: dict[str, dict[str, list[str]]], python: str, workers: int, batch: int) -> dict[str, Any]:
    """verl's scorer in its own venv (a subprocess in a process group of its own, ended afterwards with whatever
    it left behind); raises RuntimeError saying why when it cannot run."""
    import signal
    import tempfile

    if not Path(python).is_file():
        raise RuntimeError(f"{python} does not exist (bash tools/setup-env.sh verl builds .venv-verl, or set "
                           "HPC_GRPO_VERL_PYTHON / --verl-python)")
    n = sum(len(groups[k]["texts"]) for k in KINDS)
    limit = 120.0 + 10.0 * n / workers  # verl's 5 s per completion, twice over, plus start-up: a hang, not a run
    with tempfile.TemporaryDirectory(prefix="bench-verl-") as tmp:
        job = {"workers": workers, "batch": batch, "data_source": "apps", "out": f"{tmp}/result.json",
               "groups": [{"kind": k, "completions": groups[k]["texts"], "ground_truths": groups[k]["verl"]}
                          for k in KINDS if groups[k]["texts"]]}
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        with open(f"{tmp}/job.json") as stdin, open(f"{tmp}/log", "w") as log:
            proc = subprocess.Popen([python, str(VERL_RUNNER)], stdin=stdin, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=tmp, start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                rc = None
        left = _leftovers(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        tail = Path(f"{tmp}/log").read_text(errors="replace").strip()[-800:]
        if rc is None:
            raise RuntimeError(f"{VERL_RUNNER.name} did not finish in {limit:.0f} s (ended): {tail}")
        if rc != 0 or not Path(job["out"]).is_file():
            raise RuntimeError(f"{python} {VERL_RUNNER.name} exited {rc}: {tail}")
        data = json.loads(Path(job["out"]).read_text())
    res: dict[str, Any] = {"kinds": {}, "verl_version": data["verl_version"], "python": python, "batch": batch,
                           "leftover_processes": len([p for p in left if p != proc.pid])}
    for g in data["groups"]:
        want = VERL_SCORE[g["kind"]]
        res["kinds"][g["kind"]] = {"n": len(g["scores"]), "wall_s": g["wall_s"],
                                   "as_expected": sum(float(s) == want for s in g["scores"])}
    return res


def rates(res: dict[str, Any], cpus: int) -> dict[str, dict[str, float]]:
    """Per kind and for the whole set: completions/s and per CPU."""
    out = {}
    kinds = dict(res["kinds"])
    kinds["all"] = {"n": sum(k["n"] for k in kinds.values()), "wall_s": sum(k["wall_s"] for k in kinds.values()),
                    "as_expected": sum(k["as_expected"] for k in kinds.values())}
    for kind, k in kinds.items():
        per_s = k["n"] / k["wall_s"] if k["wall_s"] else 0.0
        out[kind] = {"n": k["n"], "wall_s": round(k["wall_s"], 2), "per_s": round(per_s, 3),
                     "per_s_per_cpu": round(per_s / cpus, 3), "as_expected": k["as_expected"]}
    return out


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


def parse_mix(text: str) -> tuple[int, int, int]:
    try:
        mix = tuple(int(x) for x in text.split(":"))
    except ValueError:
        mix = ()
    if len(mix) != 3 or min(mix) < 0 or sum(mix) == 0:
        raise ValueError(f"--mix {text}: give PASS:FAIL:TIMEOUT as three whole numbers, not all 0 (e.g. 2:1:1)")
    return mix  # type: ignore[return-value]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--mix", default="2:1:1", help="shares of passing : failing : looping completions")
    ap.add_argument("--per-test-timeout", type=float, default=1.0, help="the recipe's grpo.code.per_test_timeout")
    ap.add_argument("--workers", type=int, default=None, help="parallel scorers, both (default: this process's CPUs)")
    ap.add_argument("--verl-python", default=None, help="interpreter with full verl (default: $HPC_GRPO_VERL_PYTHON, "
                                                        "else .venv-verl of this checkout)")
    ap.add_argument("--no-verl", action="store_true", help="only our reward")
    ap.add_argument("--verl-batch", type=int, default=None,
                    help="completions per call of verl's scorer (default: 20 per worker, as a 7B step's 1,280 "
                         "responses over verl's 64 processes; its 300 s limit per completion runs from the call's start)")
    ap.add_argument("--recipe", default="qwen2.5-7b-codegen")
    ap.add_argument("--cluster", default="a100-ib")
    ap.add_argument("--response-fill", type=float, default=0.5, help="mean response length / max_response_length")
    ap.add_argument("--prompt-fill", type=float, default=0.3, help="mean prompt length / max_prompt_length")
    ap.add_argument("--engine-tokens-per-s", type=float, default=2500.0, help="decode tokens/s of one vLLM engine")
    ap.add_argument("--peak-tflops", type=float, default=312.0, help="bf16 dense peak per GPU (A100 312, H100 989)")
    ap.add_argument("--mfu", type=float, default=0.35)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        mix = parse_mix(args.mix)
    except ValueError as exc:
        ap.error(str(exc))  # exit 2

    groups, usable = completion_set(args.count, mix)
    cpus = len(os.sched_getaffinity(0))
    workers = args.workers or cpus
    weights = RewardWeights(per_test_timeout=args.per_test_timeout)
    loads = {"start": load()}
    ours = run_ours(groups, weights, workers)
    loads["after_ours"] = load()
    verl: dict[str, Any] | None = None
    verl_error = "not run (--no-verl)" if args.no_verl else None
    if not args.no_verl:
        try:
            verl = run_verl(groups, verl_python(args.verl_python), workers, args.verl_batch or 20 * workers)
        except RuntimeError as exc:
            verl_error = f"not run: {exc}"
        loads["after_verl"] = load()
    ours_r = rates(ours, cpus)
    verl_r = rates(verl, cpus) if verl else None
    ratio = {k: round(ours_r[k]["per_s"] / verl_r[k]["per_s"], 3) for k in ours_r
             if verl_r and verl_r.get(k, {}).get("per_s")} if verl_r else None

    est = step_estimate(args)
    rate = ours_r["all"]["per_s"]
    scoring_s = est["responses"] / (rate / cpus * est["reward_cpus"])
    share = scoring_s / est["step_s"]
    result = {"completions": args.count, "mix": dict(zip(KINDS, mix)), "problems_usable": usable, "cpus": cpus,
              "workers": workers, "load_average": loads, "per_test_timeout": args.per_test_timeout,
              "ours": {"isolation": ours["isolation"], "rates": ours_r},
              "verl": ({"version": verl["verl_version"], "scorer": "default_compute_score('apps') -> prime_code, "
                        "continuous=True, via run_reward_scoring", "isolation": "none", "rates": verl_r,
                        "batch": verl["batch"], "leftover_processes": verl["leftover_processes"]}
                       if verl else {"error": verl_error}),
              "ratio_ours_over_verl": ratio,
              "target_met": (ratio["all"] >= 1.0) if ratio else None,
              "step_estimate": {k: round(v, 1) for k, v in est.items()},
              "scoring_s_per_step": round(scoring_s, 2), "share_of_step": round(share, 4), "target_share": 0.10,
              "share_met": share <= 0.10}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.count} completions over {usable} HumanEval problems (mix pass {mix[0]} : fail {mix[1]} : loop "
          f"{mix[2]}), {workers} workers on {cpus} CPUs; load average {loads}")
    head = f"{'kind':8} {'n':>5}  {'ours /s':>9} {'per CPU':>8}"
    head += f"  {'verl /s':>9} {'per CPU':>8}  {'ours/verl':>9}" if verl_r else ""
    print(f"ours: isolation {ours['isolation']}, per-test timeout {args.per_test_timeout} s; verl "
          + (f"{verl['verl_version']} prime_code (no isolation, 5 s per completion, {verl['batch']} per call; "
             f"{verl['leftover_processes']} process(es) it left behind were ended)" if verl else verl_error))
    print(head)
    for kind in (*[k for k in KINDS if k in ours_r], "all"):
        o = ours_r[kind]
        line = f"{kind:8} {o['n']:>5}  {o['per_s']:>9.2f} {o['per_s_per_cpu']:>8.2f}"
        if verl_r and kind in verl_r:
            v = verl_r[kind]
            line += f"  {v['per_s']:>9.2f} {v['per_s_per_cpu']:>8.2f}  {ratio[kind]:>9.2f}"
        print(line)
    print("outcomes as expected: ours " + ", ".join(f"{k} {ours_r[k]['as_expected']}/{ours_r[k]['n']}" for k in ours_r
                                                     if k != "all")
          + ("; verl " + ", ".join(f"{k} {verl_r[k]['as_expected']}/{verl_r[k]['n']}" for k in verl_r if k != "all")
             if verl_r else ""))
    if ratio:
        print(f"ratio ours / verl per CPU, whole set: {ratio['all']:.2f} -> target >= 1 "
              f"{'met' if ratio['all'] >= 1.0 else 'MISSED'}")
    print(f"{args.recipe} on {args.cluster}: {est['responses']} responses/step, estimated step {est['step_s']:.0f} s "
          f"(generation {est['generation_s']:.0f} s + training {est['training_s']:.0f} s); reward CPUs {est['reward_cpus']}")
    print(f"scoring one step with ours: {scoring_s:.1f} s = {share:.1%} of the step; target <= 10%: ratio "
          f"{share / 0.10:.2f} -> {'met' if share <= 0.10 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
