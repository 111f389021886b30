"""GSM8K scoring: lm-eval's real filters and metric (from the installed gsm8k.yaml) against verl's strict reward
on a fixed table of tricky completions; the local task definition; the vLLM arguments (no vllm import)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from hpc_grpo.evaluation import scoring
from hpc_grpo.evaluation.evaluate import Placement
from hpc_grpo.rewards.gsm8k import gsm8k_reward

FILLER = " and that is all there is to say about it." * 10  # 430 characters without a digit

# completion, ground truth, lm-eval strict-match, lm-eval flexible-extract, verl strict reward
TRICKY = [
    ("She makes 9 * 2 = 18 dollars.\n#### 18", "18", 1, 1, 1),
    ("1000 in all\n#### 1,000", "1000", 1, 1, 1),                      # commas ignored by both
    ("#### $42", "42", 0, 1, 0),                                        # `$` stops both strict regexes
    ("#### 42.00", "42", 0, 0, 0),                                      # no numeric normalisation anywhere
    ("So the answer is \\boxed{42}", "42", 0, 1, 0),                   # boxed: flexible only
    ("#### 3\nWait, I was wrong.\n#### 42", "42", 0, 1, 1),             # lm-eval strict: FIRST ####; verl: last
    ("#### 42.", "42", 1, 1, 0),                                        # lm-eval's metric drops a final '.'
    ("#### 42" + FILLER, "42", 1, 1, 0),                                # verl reads only the last 300 chars
    ("It is #### -7", "-7", 1, 1, 1),
    ("I do not know.", "42", 0, 0, 0),
]


def _gsm8k_yaml() -> dict:
    return yaml.safe_load((scoring.lm_eval_tasks_dir() / "gsm8k" / "gsm8k.yaml").read_text())


def lm_eval_score(text: str, truth: str, filter_name: str) -> tuple[str, float]:
    """One completion through lm-eval's own filter pipeline and exact_match, configured from gsm8k.yaml."""
    import lm_eval.filters  # noqa: F401  registers the filters
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.api.registry import get_filter

    cfg = _gsm8k_yaml()
    steps = next(f for f in cfg["filter_list"] if f["name"] == filter_name)["filter"]
    resps: list = [[text]]
    for step in steps:
        kwargs = {k: v for k, v in step.items() if k != "function"}
        resps = list(get_filter(step["function"])(**kwargs).apply(resps, [{}]))
    pred = resps[0]
    metric = cfg["metric_list"][0]
    reference = f"Some worked solution <<1+1=2>>.\n#### {truth}"  # doc_to_target is the whole answer text
    score = exact_match_hf_evaluate(predictions=[pred], references=[reference], ignore_case=metric["ignore_case"],
                                    ignore_punctuation=metric["ignore_punctuation"],
                                    regexes_to_ignore=metric["regexes_to_ignore"])["exact_match"]
    return pred, float(score)


@pytest.mark.parametrize("text,truth,strict,flexible,verl", TRICKY, ids=[t[0][:24] for t in TRICKY])
def test_tricky_completions_lm_eval_filters_vs_verl(text: str, truth: str, strict: int, flexible: int,
                                                    verl: int) -> None:
    assert lm_eval_score(text, truth, "strict-match")[1] == strict
    assert lm_eval_score(text, truth, "flexible-extract")[1] == flexible
    assert gsm8k_reward(text, truth) == verl


def test_table_has_every_kind_of_disagreement() -> None:
    """The table is only useful if it shows where training reward and evaluation part ways, both directions."""
    assert any(s == 1 and v == 0 for _, _, s, _, v in TRICKY)
    assert any(s == 0 and v == 1 for _, _, s, _, v in TRICKY)
    assert any(f == 1 and s == 0 for _, _, s, f, _ in TRICKY)


def test_task_yaml_includes_installed_lm_eval_task_and_local_files(tmp_path: Path) -> None:
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    for f in (train, test):
        f.write_text(json.dumps({"question": "1+1?", "answer": "2\n#### 2"}) + "\n")
    folder = scoring.write_task_dir(tmp_path / "tasks", ["gsm8k", "gsm8k_cot"], train, test)
    for task, base in (("gsm8k", "gsm8k.yaml"), ("gsm8k_cot", "gsm8k-cot.yaml")):
        doc = yaml.safe_load((folder / f"{task}.yaml").read_text())
        assert Path(doc["include"]) == scoring.lm_eval_tasks_dir() / "gsm8k" / base
        assert Path(doc["include"]).is_file()
        assert doc["task"] == f"hpc_grpo_{task}"
        assert doc["dataset_path"] == "json" and doc["dataset_name"] is None
        assert doc["dataset_kwargs"]["data_files"] == {"train": str(train), "test": str(test)}


def test_missing_data_file_names_the_key(tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    train.write_text("{}\n")
    with pytest.raises(FileNotFoundError, match=r"nope.jsonl does not exist: set eval.test_file .*`hpc-grpo data gsm8k`"):
        scoring.write_task_dir(tmp_path / "t", ["gsm8k"], train, tmp_path / "nope.jsonl")


def test_hf_args_on_cpu() -> None:
    a = scoring.build_args("/m", ["gsm8k"], Placement("hf", 0), limit=5, num_fewshot=0, batch_size=4, max_gen_toks=32)
    assert (a.model, a.device, a.limit, a.num_fewshot) == ("hf", "cpu", 5, 0)
    assert a.model_args["pretrained"] == "/m" and a.tasks == ["hpc_grpo_gsm8k"]
    cli = a.cli(Path("/tasks"))
    assert cli[:3] == ["lm_eval", "--model", "hf"] and "--include_path" in cli and "/tasks" in cli
    a = scoring.build_args("/m", ["gsm8k"], Placement("hf", 1), limit=5, num_fewshot=0, batch_size=4, max_gen_toks=32)
    assert a.device == "cuda" and a.model_args["dtype"] == "auto"


def test_vllm_args_tensor_and_data_parallel_from_the_placement() -> None:
    """vllm is not installed here: the arguments are checked, never run."""
    a = scoring.build_args("/m", ["gsm8k", "gsm8k_cot"], Placement("vllm", 8, tp=4, dp=2), limit=None,
                           num_fewshot=None, batch_size=8, max_gen_toks=None, gpu_memory_utilization=0.7,
                           dtype="bfloat16")
    assert a.model == "vllm" and a.device is None and a.batch_size == "auto"
    assert a.model_args == {"pretrained": "/m", "tensor_parallel_size": 4, "dtype": "bfloat16",
                            "gpu_memory_utilization": 0.7, "data_parallel_size": 2}
    assert a.tasks == ["hpc_grpo_gsm8k", "hpc_grpo_gsm8k_cot"]
    assert "tensor_parallel_size=4" in a.cli(Path("/t"))[a.cli(Path("/t")).index("--model_args") + 1]
    with pytest.raises(ValueError, match="unknown eval.backend 'tgi'"):
        scoring.build_args("/m", ["gsm8k"], Placement("tgi", 1), limit=None, num_fewshot=None, batch_size=8,
                           max_gen_toks=None)
    assert "vllm" not in sys.modules


def test_task_score_folds_filters_and_computes_verl_reward() -> None:
    """lm-eval logs one sample per (problem, filter): one row per problem comes out, verl's reward beside."""
    doc = {"question": "q", "answer": "w\n#### 1,200"}
    samples = []
    for name, resp, ok in (("strict-match", "3", 0.0), ("flexible-extract", "1,200", 1.0)):
        samples.append({"doc_id": 0, "doc": doc, "target": doc["answer"], "resps": [["#### 3 no #### 1,200"]],
                        "filtered_resps": [resp], "filter": name, "exact_match": ok})
    score = scoring.gsm8k_scores({"exact_match,strict-match": 0.0, "exact_match,flexible-extract": 1.0}, samples)
    assert score["n"] == 1 and score["strict_match"] == 0.0 and score["flexible_extract"] == 1.0
    row = score["samples"][0]
    assert row["target"] == "1200" and row["strict_answer"] == "3" and row["flexible_answer"] == "1,200"
    assert row["verl_strict"] == 1.0 and score["verl_strict_reward"] == 1.0
