"""Login-node side of the evaluation: the eval job's spec and script, its clean environment, data files,
published numbers, results and the report (all without torch or lm_eval)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpc_grpo.evaluation import evaluate
from hpc_grpo.launch import render
from hpc_grpo.commands import report
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.common.yamlio import SpecError


def spec_for(tmp: Path, cluster: str = "slurm-dev", *overrides: str):
    return resolve_spec("tiny-gsm8k", cluster, [f"cluster.runs_root={tmp / 'runs'}", *overrides], run_name="r1")


def test_eval_job_has_its_own_resources_and_the_afterany_dependency(isolated: Path) -> None:
    spec = spec_for(isolated, "slurm-dev", "resources.cpus_per_task=4", "eval.resources.cpus_per_task=1",
                    "eval.resources.time=00:07:00", "eval.resources.partition=high")
    espec = evaluate.eval_spec(spec)
    assert espec.run_dir == spec.run_dir and espec.run_name == "r1-eval"
    text = render.render_sbatch(espec, "python -m submitit.core._submit /x", extra=[("dependency", evaluate.dependency("4242"))])
    assert "#SBATCH --dependency=afterany:4242" in text
    assert "#SBATCH --cpus-per-task=1" in text and "#SBATCH --time=7" in text and "#SBATCH --partition=high" in text
    assert "--gpus-per-node" not in text  # hf backend: no GPU unless asked
    assert "--dependency" not in render.render_sbatch(spec)


def test_vllm_eval_asks_for_the_clusters_gpus(isolated: Path) -> None:
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "slurm-dev", [f"cluster.runs_root={isolated}", "eval.backend=vllm",
                                                             "eval.tp=2"], run_name="r2")
    assert evaluate.eval_spec(spec).gpus_per_node == 4 and evaluate.eval_spec(spec).recipe.resources.nodes == 1
    spec = spec_for(isolated, "slurm-dev", "eval.backend=vllm", "eval.resources.gpus_per_node=2")
    assert "#SBATCH --gpus-per-node=2" in render.render_sbatch(evaluate.eval_spec(spec))


def test_eval_nodes_other_than_one_are_refused(isolated: Path) -> None:
    with pytest.raises(SpecError, match="eval.resources.nodes"):
        spec_for(isolated, "slurm-dev", "eval.resources.nodes=2")


def test_submit_eval_runs_without_the_callers_slurm_variables(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Submitted from inside a job (SLURM_* set), the eval job must not inherit them; SLURM_CONF survives.
    sbatch itself is stood in for: the environment is captured at the moment submitit would call it."""
    from hpc_grpo.launch import submit

    spec = spec_for(isolated)
    spec.path.mkdir(parents=True)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_NODELIST", "node9")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm-test.conf")
    seen: dict[str, str] = {}

    class Job:
        job_id = "501"

    def fake_submit(self, fn):
        seen.update(os.environ)
        seen["extra"] = self.extra_sbatch
        seen["callable"] = type(fn).__name__
        return Job()

    monkeypatch.setattr(submit.TemplateSlurmExecutor, "submit", fake_submit)
    # submitit's executor refuses to be built where `srun` is not on PATH (a login node without Slurm's client,
    # this test's CI box without the dev cluster): sbatch is stood in for, so is that probe
    monkeypatch.setattr(submit.TemplateSlurmExecutor, "affinity", classmethod(lambda cls: 1))
    sub = submit.submit_eval(spec, evaluate.job_argv(spec.path), after="77")
    assert sub.job_id == "501"
    assert "SLURM_JOB_ID" not in seen and "SLURM_NODELIST" not in seen
    assert seen["SLURM_CONF"] == "/etc/slurm-test.conf" and seen["extra"] == [("dependency", "afterany:77")]
    assert seen["callable"] == "EvalJob"
    assert os.environ["SLURM_JOB_ID"] == "77"  # the caller's environment is back afterwards
    assert [(e.purpose, e.job_id, e.note) for e in __import__("hpc_grpo.runstate.runs", fromlist=["x"]).read_history(spec.path)] \
        == [("eval", "501", "afterany:77")]


def test_data_files_from_the_recorded_source_or_an_error_naming_the_key(isolated: Path, gsm8k_dir: Path) -> None:
    from hpc_grpo.data.gsm8k import prepare_gsm8k

    data = prepare_gsm8k(gsm8k_dir, isolated / "data")
    spec = spec_for(isolated, "local", f"data.val_files={data.trl_test}", f"data.train_files={data.trl_train}")
    assert evaluate.data_files(spec) == (str(gsm8k_dir.resolve() / "train.jsonl"), str(gsm8k_dir.resolve() / "test.jsonl"))
    bare = isolated / "elsewhere" / "test.jsonl"
    bare.parent.mkdir()
    bare.write_text("")
    spec = spec_for(isolated, "local", f"data.val_files={bare}")
    with pytest.raises(SpecError, match="eval.test_file") as exc:
        evaluate.data_files(spec)
    assert exc.value.key == "eval.test_file"
    spec = spec_for(isolated, "local", f"data.val_files={bare}", f"eval.test_file={gsm8k_dir}/test.jsonl",
                    f"eval.train_file={gsm8k_dir}/train.jsonl")
    assert evaluate.data_files(spec)[1] == f"{gsm8k_dir}/test.jsonl"


def test_published_numbers_by_model_name() -> None:
    assert evaluate.published("Qwen/Qwen2.5-3B-Instruct")["gsm8k"] == 86.7
    assert evaluate.published("/models/qwen2.5-7b-instruct/")["grpo"]["trained"] == 93.4
    assert evaluate.published("/tmp/tiny-qwen2") is None


def result(step: int, strict: float, base_strict: float = 0.1) -> dict:
    s = {"strict_match": strict, "flexible_extract": strict + 0.1, "verl_strict_reward": strict, "n": 10, "samples": []}
    b = dict(s, strict_match=base_strict)
    return {"step": step, "model": f"/r/exports/step_{step}", "scores": {"gsm8k": s},
            "base": {"model": "/m/Qwen2.5-3B-Instruct", "scores": {"gsm8k": b}},
            "published": evaluate.published("Qwen2.5-3B-Instruct"), "wall_time_s": 1.0, "problems_per_s": 10.0}


def test_table_rows_put_policy_base_and_published_side_by_side() -> None:
    rows = evaluate.table_rows(result(8, 0.5))
    assert [r["what"] for r in rows] == ["step 8", "base", "published", "published GRPO"]
    assert rows[0]["strict"] == 0.5 and rows[1]["strict"] == 0.1 and rows[2]["flexible"] == pytest.approx(0.867)


def test_settings_cache_key_changes_with_model_settings_and_data(tmp_path: Path) -> None:
    f = tmp_path / "test.jsonl"
    f.write_text("a\n")
    s = evaluate.EvalSettings(("gsm8k",), 5, 0, "hf", 8, 32, str(f), str(f))
    k = s.cache_key("/m")
    assert k == s.cache_key("/m") and k != s.cache_key("/other")
    assert k != evaluate.EvalSettings(("gsm8k",), 6, 0, "hf", 8, 32, str(f), str(f)).cache_key("/m")
    f.write_text("a\nb\n")
    assert k != s.cache_key("/m")


VERL_LOG = """(TaskRunner pid=1) step:1 - actor/entropy:1.25 - actor/kl_loss:0.001 - critic/score/mean:0.5 - \
response_length/mean:290.0 - timing_s/step:206.1
(TaskRunner pid=1) step:2 - actor/entropy:1.0 - actor/kl_loss:0.0027 - critic/score/mean:0.75 - response_length/mean:250.5
"""


def test_report_from_verl_logs_and_eval_results(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "submitit").mkdir(parents=True)
    (run / "submitit" / "11_0_log.out").write_text("noise\n" + VERL_LOG)
    (run / "eval").mkdir()
    for step, strict in ((1, 0.2), (2, 0.4)):
        (run / "eval" / f"step_{step}.json").write_text(json.dumps(result(step, strict)))
    rep = report.build(run)
    assert rep.steps["reward"] == [(1, 0.5), (2, 0.75)]
    assert rep.steps["kl"] == [(1, 0.001), (2, 0.0027)]
    assert rep.steps["response length"] == [(1, 290.0), (2, 250.5)]
    assert rep.steps["entropy"] == [(1, 1.25), (2, 1.0)]
    text = "\n".join(rep.summary())
    assert "reward: 0.5 at step 1 -> 0.75 at step 2" in text and "eval step 2 gsm8k: strict 40.0%" in text
    assert "base 10.0%" in text
    pytest.importorskip("matplotlib")
    png = report.draw(rep, run / "report.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 150_000


def test_report_from_trl_metrics(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 1, "reward": 0.1, "kl": 0.0, "completion_length": 30.0, "entropy": 6.0},
             {"step": 2, "reward": 0.3, "kl": 0.01, "completion_length": 28.0, "entropy": None}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "{cut")
    rep = report.build(run)
    assert rep.steps["reward"] == [(1, 0.1), (2, 0.3)] and rep.steps["entropy"] == [(1, 6.0)]
    assert "no evaluation yet" in "\n".join(rep.summary())


def zero_result(step: int) -> dict:
    """A random tiny model's eval: every score 0, base and policy."""
    zero = {"strict_match": 0.0, "flexible_extract": 0.0, "verl_strict_reward": 0.0, "n": 10, "samples": []}
    return {"step": step, "model": f"/r/exports/step_{step}", "scores": {"gsm8k": zero},
            "base": {"model": "/m/tiny", "scores": {"gsm8k": dict(zero)}}, "published": None}


def test_report_reads_zero_as_zero_percent(isolated: Path) -> None:
    """One eval at 0% (the tiny demo's expected score): the eval panel's step axis starts at 0 and the point and
    every bar are labelled 0%, so the panels read as a measured 0%, not as missing data; the summary says what the
    demo's reward means."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={isolated}"], run_name="demo")
    render.write_files(spec.path, render.render_all(spec))
    (spec.path / "eval").mkdir()
    (spec.path / "eval" / "step_24.json").write_text(json.dumps(zero_result(24)))
    rep = report.build(spec.path)
    assert f"  what the reward means: {spec.recipe.health.reward_note}" in rep.summary()
    assert "0% on GSM8K" in spec.recipe.health.reward_note
    fig, (ax_steps, ax_bars) = plt.subplots(1, 2)
    report.draw_evals(ax_steps, rep)
    report.draw_last_eval(ax_bars, rep)
    low, high = ax_steps.get_xlim()
    assert low == 0 and high > 24 and 24 in list(ax_steps.get_xticks())
    assert [t.get_text() for t in ax_steps.texts] == ["0%"]  # strict, flexible, verl strict share the point
    bar_labels = [t.get_text() for t in ax_bars.texts]
    assert bar_labels == ["0%"] * 6  # three scores, policy and base
    plt.close(fig)


def test_plan_refuses_an_eval_that_cannot_run(isolated: Path) -> None:
    from hpc_grpo.planning.plan import run_plan

    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "slurm-dev", [f"cluster.runs_root={isolated}", "eval.backend=vllm",
                                                             "eval.tp=2", "eval.resources.gpus_per_node=1"])
    keys = {f.key for f in run_plan(spec, schema=False).findings if f.severity.value == "error"}
    assert "eval.tp" in keys
    spec = spec_for(isolated, "slurm-dev", f"data.val_files={isolated}/nowhere/test.jsonl")
    found = [f for f in run_plan(spec, schema=False, for_submit=True).findings if f.key == "eval.test_file"]
    assert found and found[0].severity.value == "error"
    spec = spec_for(isolated, "slurm-dev", f"data.val_files={isolated}/nowhere/test.jsonl", "eval.enabled=false")
    assert not [f for f in run_plan(spec, schema=False, for_submit=True).findings if f.key.startswith("eval.")]


def test_choose_newest_all_kept_or_named_steps(isolated: Path) -> None:
    """Which checkpoints the eval job takes, read through checkpoints.py (a torn one is never chosen)."""
    pytest.importorskip("torch")
    from tests.ckpt_trees import trl_checkpoint, truncate_half

    from hpc_grpo.job.eval_job import EvalError, choose

    spec = spec_for(isolated, "local")
    for step in (2, 4, 6):
        trl_checkpoint(spec.path, step)
    truncate_half(spec.path / "checkpoints" / "checkpoint-6" / "optimizer.pt")
    assert [c.step for c in choose(spec, [], False)] == [4]
    assert [c.step for c in choose(spec, [], True)] == [2, 4]
    assert [c.step for c in choose(spec, [2], False)] == [2]
    with pytest.raises(EvalError, match=r"--step 6: no complete checkpoint with that step \(complete: 2, 4\)"):
        choose(spec, [6], False)


def test_the_eval_table_fits_80_columns(isolated: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Model paths shown relative to the run directory (or with ~), and only the score columns some row has: the
    table of a run under a long runs root fits 80 columns without folding a path."""
    from hpc_grpo.cli import eval_cmds

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(Path, "home", lambda: isolated)
    run = isolated / "hpc-grpo" / "runs" / "tiny-gsm8k-20261206-131500"
    res = zero_result(24)
    res["model"] = str(run / "exports" / "step_24")
    res["base"]["model"] = str(isolated / ".cache" / "hpc-grpo" / "tiny-qwen2")
    res.update(wall_time_s=12.0, problems_per_s=0.8, path=str(run / "eval" / "step_24.json"))
    eval_cmds.print_eval_rows([res])
    text = capsys.readouterr().out
    table = text.split("wall time")[0]
    assert max(len(line) for line in table.splitlines()) <= 80, table
    assert "exports/step_24" in table and "~/.cache/hpc-grpo/tiny-qwen2" in table
    assert "pass@1" not in table  # no row has it
