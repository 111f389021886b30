"""prune-ckpts: the recipe's policy section, the lock, leases, quarantine, metrics for keep-best, exports, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import leases, metrics, prune, retention
from hpc_grpo.engines import get_engine
from hpc_grpo.engines.trl import grpo_config_kwargs
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.runstate.runs import checkpoint_lock
from hpc_grpo.config.spec import Checkpoint as CkptCfg
from hpc_grpo.common.yamlio import SpecError, dump_yaml
from hpc_grpo.runstate import layout
from tests.prune_trees import set_mtime, trl_checkpoint, verl_fsdp_checkpoint

OLD = time.time() - 86400


def trl_run(root: Path, steps: list[int], *overrides: str) -> Path:
    spec = resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={root}", *overrides], run_name="r")
    spec.path.mkdir(parents=True)
    (spec.path / "spec.yaml").write_text(dump_yaml(spec.model_dump(mode="json")), encoding="utf-8")
    for s in steps:
        set_mtime(trl_checkpoint(spec.path / "checkpoints", s), OLD + s)
    return spec.path


# ------------------------------------------------------------------------------------ the recipe
def test_the_policy_keys_validate() -> None:
    assert CkptCfg.model_validate({"keep_last": 2}).keep_last == 2
    with pytest.raises(ValueError, match="keep"):
        CkptCfg.model_validate({"keep": 2})  # the retired name is unknown, like any other
    assert CkptCfg.model_validate({"max_bytes": "1.5G"}).max_bytes == int(1.5 * 2**30)
    assert CkptCfg.model_validate({"max_bytes": 4096}).max_bytes == 4096
    for bad in ("lots", "-3G", 0, True):
        with pytest.raises(ValueError):
            CkptCfg.model_validate({"max_bytes": bad})
    with pytest.raises(ValueError, match="METRIC:max"):
        CkptCfg.model_validate({"keep_best": "reward:up"})


def test_every_shipped_recipe_still_resolves_and_engines_leave_retention_to_hpc_grpo(tmp_path: Path) -> None:
    for recipe in ("qwen2.5-3b-gsm8k-lora", "qwen2.5-7b-codegen", "tiny-gsm8k", "ray-probe"):
        spec = resolve_spec(recipe, "local", [f"cluster.runs_root={tmp_path}"])
        assert spec.recipe.checkpoint.keep_last >= 1
        if spec.recipe.engine == "verl":
            argv = get_engine("verl").command(spec).argv
            assert "trainer.max_actor_ckpt_to_keep=null" in argv
            assert any(a.startswith("trainer.logger=") and "file" in a for a in argv)
        else:
            assert grpo_config_kwargs(spec)["save_total_limit"] is None


def test_unknown_key_names_the_new_one(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="keep_last"):
        resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={tmp_path}", "checkpoint.save_total_limit=2"])


# ------------------------------------------------------------------------------ lock and leases
def test_a_second_prune_waits_for_the_lock(tmp_path: Path) -> None:
    run = trl_run(tmp_path, [1, 2, 3])
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with checkpoint_lock(run):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    try:
        with pytest.raises(TimeoutError, match="is held by"):
            prune.prune_run(run, "trl", retention.Policy(keep_last=1, grace_s=0), lock_timeout_s=0.3)
        assert sorted(s for s, _ in ck.candidates(run, "trl")) == [1, 2, 3]  # nothing removed meanwhile
    finally:
        release.set()
        t.join()
    prune.prune_run(run, "trl", retention.Policy(keep_last=1, grace_s=0), lock_timeout_s=5)
    assert [s for s, _ in ck.candidates(run, "trl")] == [3]


def test_lease_protects_a_step_and_a_dead_holder_does_not(tmp_path: Path) -> None:
    run = trl_run(tmp_path, [1, 2, 3])
    policy = retention.Policy(keep_last=1, grace_s=0)
    with leases.lease(run, 1) as path:
        assert path.exists() and leases.active_leases(run) == {1}
        result = prune.prune_run(run, "trl", policy, dry_run=True)
        v1 = next(v for v in result.verdicts if v.step == 1)
        assert v1.keep and v1.protected and "leased" in v1.reason
    assert not path.exists()
    # A lease left by a process that died (same host) is stale.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run / layout.LEASES_DIR / f"step_2.{os.uname().nodename}.abcd.{int(dead.stdout)}.lease").write_text("{}")
    assert leases.active_leases(run) == frozenset()
    prune.prune_run(run, "trl", policy)
    assert [s for s, _ in ck.candidates(run, "trl")] == [3]


def test_grace_period_and_tracker_protect(tmp_path: Path) -> None:
    ckpts = tmp_path / "run" / "checkpoints"
    for s in (10, 20, 30, 40):
        set_mtime(verl_fsdp_checkpoint(ckpts, s), OLD + s)
    set_mtime(ckpts / "global_step_20", time.time() - 5)  # a fresh save (of another writer)
    (ckpts / "latest_checkpointed_iteration.txt").write_text("10")
    result = prune.prune_run(tmp_path / "run", "verl", retention.Policy(keep_last=1, grace_s=60))
    reasons = {v.step: v.reason for v in result.verdicts}
    assert [s for s, _ in ck.candidates(tmp_path / "run", "verl")] == [10, 20, 40]
    assert "tracker" in reasons[10] and "grace" in reasons[20] and "newest complete" in reasons[40]


# ---------------------------------------------------------------------------- quarantine, exports
def test_quarantine_is_emptied_after_its_retention(tmp_path: Path) -> None:
    run = trl_run(tmp_path, [5])
    q = run / "checkpoints-incomplete"
    for name in ("checkpoint-3.old", "checkpoint-4.new"):
        (q / name).mkdir(parents=True)
        (q / name / "optimizer.pt").write_bytes(b"x" * 10)
    now = time.time() + 3 * 86400  # three days on
    policy = retention.Policy(keep_last=1, grace_s=0, quarantine_s=2 * 86400)
    result = prune.prune_run(run, "trl", policy, now=now)
    assert sorted(p.name for p in q.iterdir()) == []
    assert all(not v.keep for v in result.quarantine)
    (q / "checkpoint-6.x").mkdir()
    prune.prune_run(run, "trl", policy)  # just set aside: stays
    assert [p.name for p in q.iterdir()] == ["checkpoint-6.x"]


def test_exports_count_against_max_bytes_and_go_with_their_checkpoint(tmp_path: Path) -> None:
    run = trl_run(tmp_path, [2, 4, 6])
    size = prune.footprint(run / "checkpoints" / "checkpoint-2")[0]
    for s in (2, 4):
        (run / "exports" / f"step_{s}").mkdir(parents=True)
        (run / "exports" / f"step_{s}" / "model.safetensors").write_bytes(b"m" * 5000)
    policy = retention.Policy(keep_last=3, grace_s=0, max_bytes=3 * size + 6000)  # fits 3 checkpoints + 1 export
    result = prune.prune_run(run, "trl", policy)
    assert [s for s, _ in ck.candidates(run, "trl")] == [4, 6]
    assert sorted(os.listdir(run / "exports")) == ["step_4"]
    gone = next(v for v in result.verdicts if v.step == 2)
    assert "max_bytes" in gone.reason and result.freed_bytes == size + 5000


# ------------------------------------------------------------------------------------ keep-best
def test_keep_best_reads_verl_trl_and_eval_records(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 10, "data": {"val-core/openai/gsm8k/reward/mean@1": 0.30}}) + "\n"
        + json.dumps({"step": 20, "data": {"val-core/openai/gsm8k/reward/mean@1": 0.55}}) + "\n"
        + json.dumps({"step": 30, "data": {"val-core/openai/gsm8k/reward/mean@1": 0.41}}) + "\n")
    (run / "eval").mkdir()
    (run / "eval" / "step_30.json").write_text(json.dumps({"step": 30, "metrics": {"gsm8k/strict_match": 0.6},
                                                           "samples": [{"score": 1.0}]}))
    (run / "eval" / "step_20.json").write_text(json.dumps({"gsm8k": {"strict_match": 0.5}}))
    logged = metrics.logged_metrics(run, "verl")
    assert retention.metric_per_checkpoint(logged, [10, 20, 30], "val-core/*/reward/mean@1") == {10: 0.30, 20: 0.55,
                                                                                              30: 0.41}
    assert retention.metric_per_checkpoint(logged, [10, 20, 30], "eval/gsm8k/strict_match") == {20: 0.5, 30: 0.6}
    ckpts = run / "checkpoints"
    for s in (10, 20, 30, 40):
        set_mtime(verl_fsdp_checkpoint(ckpts, s), OLD + s)
    result = prune.prune_run(run, "verl", retention.Policy(keep_last=1, grace_s=0, keep_best="val-core/*/mean@1"))
    assert [s for s, _ in ck.candidates(run, "verl")] == [20, 40]
    assert "best" in next(v.reason for v in result.verdicts if v.step == 20)
    # trl: trainer_state.json's log_history (min mode)
    trl = trl_run(tmp_path / "t", [1, 2, 3])
    state = trl / "checkpoints" / "checkpoint-3" / "trainer_state.json"
    state.write_text(json.dumps({"global_step": 3, "log_history": [{"step": s, "loss": v} for s, v in
                                                                   ((1, 0.9), (2, 0.1), (3, 0.5))]}))
    set_mtime(trl / "checkpoints" / "checkpoint-3", OLD + 3)
    prune.prune_run(trl, "trl", retention.Policy(keep_last=1, grace_s=0, keep_best="loss", best_mode="min"))
    assert [s for s, _ in ck.candidates(trl, "trl")] == [2, 3]


def test_keep_best_on_humaneval_pass_at_1(tmp_path: Path) -> None:
    """`--keep-best eval/humaneval/pass@1:max`: the '@' and '/' stay in the name, the mode after the last ':'."""
    assert retention.split_best("eval/humaneval/pass@1:max") == ("eval/humaneval/pass@1", "max")
    assert retention.split_best("eval/humaneval/pass@10:min") == ("eval/humaneval/pass@10", "min")
    assert retention.split_best("val-core/*/reward/mean@1") == ("val-core/*/reward/mean@1", "max")
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    for step, score in ((10, 0.2), (20, 0.7), (30, 0.4)):
        (run / "eval" / f"step_{step}.json").write_text(json.dumps({"step": step, "metrics": {"humaneval/pass@1": score}}))
        set_mtime(verl_fsdp_checkpoint(run / "checkpoints", step), OLD + step)
    set_mtime(verl_fsdp_checkpoint(run / "checkpoints", 40), OLD + 40)
    metric, mode = retention.split_best("eval/humaneval/pass@1:max")
    prune.prune_run(run, "verl", retention.Policy(keep_last=1, grace_s=0, keep_best=metric, best_mode=mode))
    assert [s for s, _ in ck.candidates(run, "verl")] == [20, 40]


# ------------------------------------------------------------------------------------------ CLI
def cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "prune-ckpts", *args], capture_output=True,
                          text=True, env={**os.environ, "HOME": str(home)}, timeout=60)


def test_cli_dry_run_json_and_table(tmp_path: Path) -> None:
    run = trl_run(tmp_path, [2, 4, 6, 8, 10], "checkpoint.keep_every=4", "checkpoint.grace_s=0")
    dry = cli(str(run), "--dry-run", "--json", "--keep-last", "1", home=tmp_path)
    assert dry.returncode == 0, dry.stderr
    data = json.loads(dry.stdout)
    assert {v["step"]: v["keep"] for v in data["checkpoints"]} == {2: False, 4: True, 6: False, 8: True, 10: True}
    assert data["freed_bytes"] > 0 and data["dry_run"] is True
    assert sorted(s for s, _ in ck.candidates(run, "trl")) == [2, 4, 6, 8, 10]  # nothing changed
    table = cli(str(run), "--keep-last", "1", home=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "milestone (every 4 steps)" in table.stdout and "freed" in table.stdout
    assert sorted(s for s, _ in ck.candidates(run, "trl")) == [4, 8, 10]
    bad = cli(str(run), "--max-bytes", "lots", home=tmp_path)
    assert bad.returncode == 2 and "--max-bytes 'lots'" in bad.stderr


# ----------------------------------------------------------------------------------------- plan
def test_plan_warns_when_what_retention_keeps_does_not_fit(tmp_path: Path) -> None:
    from hpc_grpo.planning.disk import kept_checkpoints
    from hpc_grpo.planning.plan import run_plan

    base = [f"cluster.runs_root={tmp_path}", "train.total_training_steps=100", "checkpoint.save_freq=10"]
    spec = resolve_spec("qwen2.5-7b-codegen", "local", [*base, "checkpoint.keep_last=2", "checkpoint.keep_every=50",
                                                         "checkpoint.keep_best=val-core/*/mean@1"])
    assert kept_checkpoints(spec)[0] == 2 + 2 + 1 + 1  # newest, milestones 50 and 100, best, one being written
    disk = [f for f in run_plan(spec, schema=False).findings if f.key == "checkpoint.keep_last"]
    assert disk and disk[0].severity.value == "warning", disk  # a 7B full fine-tune: ~100 GiB per checkpoint
    assert "2 newest + up to 2 milestones + the best + 1 being written" in disk[0].message
    small = resolve_spec("tiny-gsm8k", "local", [*base])
    disk = [f for f in run_plan(small, schema=False).findings if f.key == "checkpoint.keep_last"]
    assert all(f.severity.value == "info" for f in disk), disk


# ------------------------------------------------------------------------------ the verl poller
def test_poller_copies_verl_metrics_across_restarts_and_prunes(tmp_path: Path) -> None:
    from hpc_grpo.job import prune_poller

    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "local", [f"cluster.runs_root={tmp_path}", "checkpoint.keep_last=1",
                                                           "checkpoint.grace_s=0"], run_name="v")
    run = spec.path
    run.mkdir(parents=True)
    (run / "spec.yaml").write_text(dump_yaml(spec.model_dump(mode="json")), encoding="utf-8")
    for s in (5, 10, 15):
        set_mtime(verl_fsdp_checkpoint(run / "checkpoints", s), OLD + s)
    src, dst = run / "verl_metrics.jsonl", run / "metrics.jsonl"
    src.write_text('{"step":5,"data":{"val-core/a/reward/mean@1":0.2}}\n{"step":10,"data":{"x":1}}\n{"step":1')
    seen = prune_poller.seen_lines(dst)
    assert prune_poller.merge_metrics(src, dst, seen) == 2  # the half-written last line waits
    src.write_text('{"step":10,"data":{"x":1}}\n{"step":15,"data":{"x":2}}\n')  # verl restarted: file rewritten
    assert prune_poller.merge_metrics(src, dst, prune_poller.seen_lines(dst)) == 1
    assert [json.loads(line)["step"] for line in dst.read_text().splitlines()] == [5, 10, 15]
    state = prune_poller.folder_state(run)
    assert prune_poller.main(["--run-dir", str(run), "--once"]) == 0
    assert [s for s, _ in ck.candidates(run, "verl")] == [15]
    assert prune_poller.folder_state(run) != state  # what the polling loop watches changed
