"""The eval job asks Slurm for exactly the GPUs lm-eval (or HumanEval's generation) will use: evaluate.eval_resources decides backend, GPUs and
device once, and both the batch script (eval_spec -> scripts/eval_sbatch.sh) and lm-eval (settings_for ->
scoring.build_args) read it.

vllm cannot be installed here: the vLLM path is tested by its settings only (the lm-eval arguments build_args
makes: tensor_parallel_size x data_parallel_size GPUs), never run; it must stay importable without vllm.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from hpc_grpo.evaluation import evaluate, scoring
from hpc_grpo.launch import render
from hpc_grpo.common.findings import Severity
from hpc_grpo.planning.plan import run_plan
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.runstate import layout
from tests.unit.test_golden import MATRIX
from tests.unit.test_recipe_matrix import shipped_verdicts

# data_files() needs GSM8K files; their contents do not matter to where the evaluation runs
DATA = ["eval.test_file=/data/gsm8k/test.jsonl", "eval.train_file=/data/gsm8k/train.jsonl"]
_GPU_LINE = re.compile(r"^#SBATCH --(?:gpus-per-node=(?:\w+:)?|gres=gpu:(?:\w+:)?)(\d+)$", re.M)


def spec_of(recipe: str, cluster: str, root: Path, *overrides: str):
    return resolve_spec(recipe, cluster, [f"cluster.runs_root={root}", *DATA, *overrides], run_name="t")


def gpus_in_script(text: str) -> int:
    """The GPUs per node an #SBATCH line asks for (none: 0)."""
    found = _GPU_LINE.findall(text)
    return int(found[0]) if found else 0


def gpus_used(args: scoring.LmEvalArgs) -> int:
    """GPUs lm-eval occupies with these arguments: vLLM TP x DP; hf one on cuda, none on the CPU."""
    if args.model == "vllm":
        return args.model_args["tensor_parallel_size"] * args.model_args["data_parallel_size"]
    return 1 if args.device == "cuda" else 0


def lm_eval_args(spec) -> scoring.LmEvalArgs:
    s = evaluate.settings_for(spec)
    return scoring.build_args("/export", ["gsm8k"], s.placement, limit=s.limit, num_fewshot=s.num_fewshot,
                              batch_size=s.batch_size, max_gen_toks=s.max_gen_toks)


# Every shipped recipe x cluster pair whose plan is accepted (docs/recipe-matrix.md, which test_recipe_matrix holds
# to plan's verdict): a refused pair has no eval job to check.
PLANNED = [(r, c) for r, c in MATRIX if shipped_verdicts()[r, c]]


@pytest.mark.parametrize(("recipe", "cluster"), PLANNED, ids=[f"{r}__{c}" for r, c in PLANNED])
def test_gpus_asked_of_slurm_are_the_gpus_lm_eval_uses(recipe: str, cluster: str, isolated: Path) -> None:
    """Every planned pair: the eval job's #SBATCH GPUs are the GPUs lm-eval or vLLM uses, on the right device."""
    assert len(PLANNED) >= 30, PLANNED  # 8 recipes x 5 clusters, 9 refused: the list did not silently empty
    spec = spec_of(recipe, cluster, isolated)
    asked = evaluate.eval_spec(spec).gpus_per_node
    assert gpus_in_script(render.render_eval_sbatch(spec)) == asked
    settings = evaluate.settings_for(spec)
    args = lm_eval_args(spec)
    assert settings.gpus == gpus_used(args) == asked, (settings, args)
    assert settings.placement.device == ("cuda" if asked > 0 else "cpu")
    if args.model == "hf":
        assert args.device == settings.placement.device
    if spec.gpus_per_node > 0 and spec.recipe.eval.backend is None and evaluate.needs_files(spec.recipe.eval.tasks):
        # a GPU run evaluates GSM8K with vLLM on one training node's GPUs, TP from the rollout
        assert (args.model, asked) == ("vllm", spec.gpus_per_node)
        assert args.model_args["tensor_parallel_size"] == spec.recipe.parallel.rollout_tp
    elif spec.gpus_per_node > 0 and spec.recipe.eval.backend is None:
        # HumanEval only (a code recipe's default): transformers generates on one GPU, so the job asks for one
        assert spec.recipe.eval.tasks == ["humaneval"]
        assert (args.model, args.device, asked) == ("hf", "cuda", 1)
    if spec.gpus_per_node == 0:
        assert (args.model, args.device, asked) == ("hf", "cpu", 0)
    assert "vllm" not in sys.modules


def test_gpu_run_without_eval_section_evaluates_on_its_gpus(isolated: Path) -> None:
    """The field case: qwen2.5-3b on a100-ib asked Slurm for no GPU while lm-eval was sent to cuda."""
    spec = spec_of("qwen2.5-3b-gsm8k-lora", "a100-ib", isolated)
    assert evaluate.eval_resources(spec) == evaluate.Placement("vllm", 4, tp=1, dp=4)
    assert "#SBATCH --gpus-per-node=a100:4" in render.render_eval_sbatch(spec)


def test_explicit_settings_win(isolated: Path) -> None:
    spec = spec_of("qwen2.5-3b-gsm8k-lora", "a100-ib", isolated, "eval.backend=hf")
    assert evaluate.eval_resources(spec) == evaluate.Placement("hf", 1)
    assert lm_eval_args(spec).device == "cuda" and evaluate.eval_spec(spec).gpus_per_node == 1
    spec = spec_of("qwen2.5-3b-gsm8k-lora", "a100-ib", isolated, "eval.backend=hf", "eval.resources.gpus_per_node=0")
    assert lm_eval_args(spec).device == "cpu" and evaluate.eval_spec(spec).gpus_per_node == 0
    spec = spec_of("qwen2.5-3b-gsm8k-lora", "a100-ib", isolated, "eval.resources.gpus_per_node=2", "eval.tp=2")
    assert evaluate.eval_resources(spec) == evaluate.Placement("vllm", 2, tp=2, dp=1)


@pytest.mark.parametrize(("recipe", "overrides", "key", "words", "in_job"), [
    ("qwen2.5-3b-gsm8k-lora", ["eval.backend=vllm", "eval.resources.gpus_per_node=0"], "eval.backend",
     ["eval.resources.gpus_per_node=0", "set eval.backend=hf"], True),
    ("tiny-gsm8k", ["eval.backend=vllm", "eval.resources.gpus_per_node=null"], "eval.backend",
     ["the training job has no GPUs", "set eval.backend=hf"], True),
    ("qwen2.5-3b-gsm8k-lora", ["eval.backend=hf", "eval.resources.gpus_per_node=4"], "eval.resources.gpus_per_node",
     ["eval.resources.gpus_per_node=4", "3 would sit idle", "eval.backend=vllm"], True),
    ("qwen2.5-3b-gsm8k-lora", ["eval.tp=3"], "eval.tp", ["eval.tp=3 does not divide", "4 GPU(s)"], True),
    # the node's size is the cluster profile's: plan checks it, the job on that node need not
    ("qwen2.5-3b-gsm8k-lora", ["eval.resources.gpus_per_node=16"], "eval.resources.gpus_per_node",
     ["16 GPUs", "have 8"], False),
    ("qwen2.5-7b-codegen", ["eval.backend=vllm"], "eval.backend",
     ["eval.backend=vllm", "eval.tasks=['humaneval']", "set it to hf"], True),
], ids=["vllm-0-gpus", "vllm-cpu-run", "hf-idle-gpus", "tp-not-divisor", "more-than-the-node", "vllm-no-lm-eval-task"])
def test_contradictions_are_plan_errors_naming_the_key(recipe: str, overrides: list[str], key: str,
                                                       words: list[str], in_job: bool, isolated: Path) -> None:
    spec = spec_of(recipe, "a100-ib", isolated, *overrides)
    findings = run_plan(spec, schema=False).findings
    found = [f for f in findings if f.key == key and f.severity is Severity.ERROR]
    assert found, [str(f) for f in findings]
    for word in words:
        assert word in str(found[0]), str(found[0])
    if in_job:
        with pytest.raises(SpecError, match=re.escape(key)):
            evaluate.settings_for(spec)  # the eval job refuses the same settings


def test_render_writes_the_eval_script_beside_the_training_one(isolated: Path) -> None:
    files = render.render_all(spec_of("qwen2.5-3b-gsm8k-lora", "a100-ib", isolated))
    assert files[layout.EVAL_SBATCH_SCRIPT] == render.render_eval_sbatch(spec_of("qwen2.5-3b-gsm8k-lora", "a100-ib", isolated))
    assert "#SBATCH --job-name=t-eval" in files[layout.EVAL_SBATCH_SCRIPT]
    assert "--name=t " in files[layout.EVAL_SBATCH_SCRIPT]  # its re-create command renders the run, not a run "t-eval"
    # no eval job on cluster=local (training evaluates itself), in chained mode, or with eval disabled
    for cluster, extra in (("local", []), ("a100-ib", ["cluster.restart=chain"]), ("a100-ib", ["eval.enabled=false"])):
        files = render.render_all(spec_of("qwen2.5-3b-gsm8k-lora", cluster, isolated, *extra))
        assert layout.EVAL_SBATCH_SCRIPT not in files, (cluster, extra)


def test_submit_dry_run_shows_the_eval_script(isolated: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Only the plan's submit-time checks (data and model on disk) are relaxed: the files do not exist here."""
    from hpc_grpo.cli import app as cli
    from hpc_grpo.planning import plan

    real = plan.run_plan
    monkeypatch.setattr(plan, "run_plan", lambda spec, schema=True, for_submit=False, **kw: real(spec, schema=False, **kw))
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "submit", "--dry-run", "recipe=qwen2.5-3b-gsm8k-lora",
                                      "cluster=a100-ib", "--name=t", f"cluster.runs_root={isolated}", *DATA])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    text = capsys.readouterr().out
    assert exc.value.code in (0, None), text
    assert "scripts/eval_sbatch.sh" in text and "afterany:<its job id>" in text
    eval_part = text[text.rindex("scripts/eval_sbatch.sh"):]
    assert "#SBATCH --job-name=t-eval" in eval_part and "#SBATCH --gpus-per-node=a100:4" in eval_part
    assert not (isolated / "t").exists()
