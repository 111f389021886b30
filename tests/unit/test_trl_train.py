"""Real GRPO training with the trl job on CPU (tiny model, real GSM8K): checkpoints, retention,
metrics, W&B offline, and a kill-then-rerun resume that ends bit-identical to an uninterrupted run.

Sized for CI's CPU (these three runs were its longest unit tests): 4 steps with a checkpoint after each, 4 prompts x
4 completions of at most 16 tokens, the first TRAIN_ROWS rows of GSM8K's train split (the job tokenizes every
prompt at its start). The kill still falls between two checkpoints with steps to train after it, and the health run
keeps save_freq 2 so that its save at the flagged step is the stop's own.

The jobs run as `python -m hpc_grpo.job.trl_job --spec RUN_DIR/spec.yaml` subprocesses, exactly as the
launch script starts them. grpo.entropy_coeff is set so the adapter moves from step 1 on (a random
model scores 0 on GSM8K, so without it every GRPO gradient would be zero and "bit-identical" trivial).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ONE_THREAD, require_gsm8k

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.job.prepare_resume import prepare
from hpc_grpo.job.trl_job import prompt_lengths, target_steps, trim_metrics
from hpc_grpo.common.yamlio import dump_yaml
from hpc_grpo.runstate import layout

# One xdist worker runs the whole module (tools/run-tests.sh: --dist loadgroup):
# run A is a module fixture the resume test compares against, built once.
pytestmark = pytest.mark.xdist_group("test_trl_train")

REPO = Path(__file__).resolve().parents[2]
STEPS, SAVE_FREQ, KEEP = 4, 1, 2
KILL_AFTER = 2
TRAIN_ROWS = 256
# Small enough for CI, big enough that every step's loss has a gradient (grpo.entropy_coeff) and n > 1 samples.
SMALL = ("batch.train=4", "batch.mini=4", "batch.micro_per_gpu=4", "batch.log_prob_micro_per_gpu=4",
         "data.max_response_length=16")
JOB_TIMEOUT_S = 240
COMPARED = ("reward", "reward_std", "loss", "kl", "entropy", "grad_norm", "lr", "completion_length")


_require_shared_data = require_gsm8k


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Prepared GSM8K (real files) and the folders the jobs share: model, caches, run root."""
    from hpc_grpo.data.gsm8k import prepare_gsm8k

    src = _require_shared_data()
    root = tmp_path_factory.mktemp("trl-train")
    data = prepare_gsm8k(src, root / "data")
    train = root / "data" / f"train-{TRAIN_ROWS}.jsonl"
    with data.trl_train.open(encoding="utf-8") as fh:
        train.write_text("".join(line for _, line in zip(range(TRAIN_ROWS), fh)), encoding="utf-8")
    return {"root": root, "train": train, "test": data.trl_test, "model": root / "models" / "tiny-qwen2"}


def job_env(root: Path) -> dict[str, str]:
    """No network, every cache inside the test's temp dir, this checkout importable."""
    env = dict(os.environ)
    env.update({
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(root / "hf_home"),
        "WANDB_MODE": "offline",
        "WANDB_CACHE_DIR": str(root / "wandb_cache"),
        "WANDB_CONFIG_DIR": str(root / "wandb_config"),
        "WANDB_SILENT": "true",
        "CUDA_VISIBLE_DEVICES": "",
        "TOKENIZERS_PARALLELISM": "false",
        **ONE_THREAD,
        "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    })
    env.pop("WANDB_API_KEY", None)
    return env


def make_run(work: dict[str, Path], name: str, *extra: str) -> RunSpec:
    """The tiny-gsm8k recipe shortened to STEPS steps of a SMALL batch, frozen into RUN_DIR/spec.yaml."""
    spec = resolve_spec(
        "tiny-gsm8k",
        "local",
        overrides=[
            f"cluster.runs_root={work['root'] / 'runs'}",
            f"model.path={work['model']}",
            f"data.train_files={work['train']}",
            f"data.val_files={work['test']}",
            f"train.total_training_steps={STEPS}",
            f"checkpoint.save_freq={SAVE_FREQ}",
            f"checkpoint.keep_last={KEEP}",
            "grpo.entropy_coeff=0.01",
            *SMALL,
            *extra,
        ],
        run_name=name,
    )
    spec.path.mkdir(parents=True)
    (spec.path / "spec.yaml").write_text(dump_yaml(spec.model_dump(mode="json")), encoding="utf-8")
    return spec


def job_argv(spec: RunSpec) -> list[str]:
    return [sys.executable, "-m", "hpc_grpo.job.trl_job", "--spec", str(spec.path / "spec.yaml")]


def run_job(spec: RunSpec, env: dict[str, str]) -> tuple[str, float]:
    t0 = time.monotonic()
    proc = subprocess.run(job_argv(spec), cwd=REPO, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, f"job failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout, elapsed


def metrics(spec: RunSpec) -> list[dict]:
    return [json.loads(line) for line in (spec.path / "metrics.jsonl").read_text().splitlines()]


def adapter(spec: RunSpec, step: int) -> dict:
    from safetensors.torch import load_file

    return load_file(layout.checkpoints_dir(spec.path) / f"checkpoint-{step}" / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def run_a(work: dict[str, Path]) -> RunSpec:
    """Run A: STEPS uninterrupted steps, W&B offline on; the job builds the tiny model on first use."""
    spec = make_run(work, "a", "logging.logger=[console,wandb]")
    out, elapsed = run_job(spec, job_env(work["root"]))
    print(f"\nrun A: {STEPS} steps in {elapsed:.1f} s (job wall time incl. start-up and the tiny-model build)")
    print("\n".join(line for line in out.splitlines() if line.startswith("[hpc-grpo")))
    assert "building the tiny model" in out and "no complete checkpoint: starting from step 0" in out
    return spec


# --------------------------------------------------------------------------------------- the tests
def test_run_writes_checkpoints_metrics_and_done(run_a: RunSpec) -> None:
    ckpts = ck.list_checkpoints(run_a.path, "trl")
    assert [(c.step, c.complete) for c in ckpts] == [(3, True), (4, True)], ckpts  # keep=2: the in-job prune removed 1 and 2

    rows = metrics(run_a)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert isinstance(r["reward"], float) and 0.0 <= r["reward"] <= 1.0
        assert isinstance(r["loss"], float) and isinstance(r["kl"], float) and r["lr"] == pytest.approx(2e-2)

    done = json.loads((run_a.path / "train_done.json").read_text())
    assert done["final_step"] == STEPS and done["resumed_from"] is None
    assert done["last_checkpoint"] == str(layout.checkpoints_dir(run_a.path) / f"checkpoint-{STEPS}")
    assert done["wall_time_s"] > 0

    assert list((run_a.path / "wandb").glob("offline-run-*")), "W&B offline run not inside the run directory"
    assert (run_a.path / "prompt_lengths.json").is_file()

    # the adapter really trains, so the resume comparison below is not trivially equal
    before, last = adapter(run_a, STEPS - SAVE_FREQ), adapter(run_a, STEPS)
    assert any(not (before[k] == last[k]).all() for k in last)


def test_kill_then_rerun_is_bit_identical(work: dict[str, Path], run_a: RunSpec) -> None:
    env = job_env(work["root"])
    spec = make_run(work, "b")  # the SAME settings as run A (max_steps STEPS): only the schedule stays identical
    ckpt_dir = layout.checkpoints_dir(spec.path)

    t0 = time.monotonic()
    proc = subprocess.Popen(job_argv(spec), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    killed_at = None
    try:
        while time.monotonic() - t0 < JOB_TIMEOUT_S and proc.poll() is None:
            newest = ck.newest_complete(ck.list_checkpoints(spec.path, "trl"))
            if newest is not None and newest.step >= KILL_AFTER:
                os.killpg(proc.pid, signal.SIGKILL)  # preemption without warning: no chance to save
                killed_at = newest.step
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None and killed_at is None:
            os.killpg(proc.pid, signal.SIGKILL)
        out_b = proc.communicate(timeout=60)[0].decode(errors="replace")
    elapsed_b = time.monotonic() - t0
    assert killed_at is not None, f"job B never reached checkpoint-{KILL_AFTER}:\n{out_b[-4000:]}"
    assert proc.returncode == -signal.SIGKILL
    assert killed_at < STEPS

    # A kill in the middle of the next save leaves a half-written folder: the rerun must not trust it.
    half = ckpt_dir / f"checkpoint-{killed_at + SAVE_FREQ}"
    if not half.exists():
        half.mkdir()
        (half / "adapter_model.safetensors").write_bytes(b"\0" * 10)
        (half / "trainer_state.json").write_text('{"global_step": ')
    steps_before = [r["step"] for r in metrics(spec)]
    assert steps_before[:killed_at] == list(range(1, killed_at + 1))

    out, elapsed_rerun = run_job(spec, env)
    print(f"\nrun B: killed after checkpoint-{killed_at} at {elapsed_b:.1f} s; rerun to step {STEPS} in {elapsed_rerun:.1f} s")
    assert f"resuming from {ckpt_dir / f'checkpoint-{killed_at}'} (step {killed_at})" in out
    assert f"moved incomplete checkpoint-{killed_at + SAVE_FREQ}" in out
    assert list((spec.path / layout.QUARANTINE_DIR).glob(f"checkpoint-{killed_at + SAVE_FREQ}.*"))

    # the final adapter equals run A's bit for bit
    a, b = adapter(run_a, STEPS), adapter(spec, STEPS)
    assert sorted(a) == sorted(b)
    import torch

    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"

    # one metrics line per step, and every logged number equals run A's
    rows_a, rows_b = metrics(run_a), metrics(spec)
    assert [r["step"] for r in rows_b] == list(range(1, STEPS + 1))
    for ra, rb in zip(rows_a, rows_b):
        assert {k: ra.get(k) for k in COMPARED} == {k: rb.get(k) for k in COMPARED}, ra["step"]

    done = json.loads((spec.path / "train_done.json").read_text())
    assert done["final_step"] == STEPS and done["resumed_from"] == str(ckpt_dir / f"checkpoint-{killed_at}")

    # A requeue of the finished run trains nothing (transformers would otherwise run one extra step).
    out, elapsed_again = run_job(spec, env)
    assert f"already trained: checkpoint-{STEPS} is step {STEPS} of {STEPS}" in out
    assert ck.newest_complete(ck.list_checkpoints(spec.path, "trl")).step == STEPS and len(metrics(spec)) == STEPS
    assert elapsed_again < 30


def test_a_health_stop_saves_the_flagged_step_and_resume_goes_on(work: dict[str, Path]) -> None:
    """trl's side of health.stop_on: with GSM8K's strict scorer the random tiny model scores 0 on every sample, so
    zero_reward is flagged at step 5; the job saves that step, stops (exit status 3), says why in its log, in the
    run's history and as a W&B alert (offline: W&B's own client, its run file standing in for the server), and the
    run is not trained. A rerun (what a resume starts) does not stop again on the earlier job's finding."""
    from hpc_grpo.job.health_watch import HEALTH_STOPPED, PREFIX
    from hpc_grpo.runstate import runs, trained
    from hpc_grpo.runstate.health import ZERO_REWARD_STEPS

    env = job_env(work["root"])
    spec = make_run(work, "zero", "grpo.reward=gsm8k_strict", "grpo.format_score=0", "health.stop_on=[zero_reward]",
                    "logging.logger=[console,wandb]", "train.total_training_steps=6", "checkpoint.save_freq=2")
    t0 = time.monotonic()
    proc = subprocess.run(job_argv(spec), cwd=REPO, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    print(f"\nzero-reward run: stopped in {time.monotonic() - t0:.1f} s")
    assert proc.returncode == HEALTH_STOPPED, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    lines = [line for line in proc.stdout.splitlines() if PREFIX in line]
    assert len(lines) == 1 and f"zero_reward: step {ZERO_REWARD_STEPS}:" in lines[0], lines
    assert [r["step"] for r in metrics(spec)] == list(range(1, ZERO_REWARD_STEPS + 1))
    newest = ck.newest_complete(ck.list_checkpoints(spec.path, "trl"))
    assert newest is not None and newest.step == ZERO_REWARD_STEPS  # saved at the flagged step (save_freq is 2)
    (stop,) = [e for e in runs.read_history(spec.path) if e.purpose == "failed"]
    assert stop.note.startswith(f"stopped by health: zero_reward at step {ZERO_REWARD_STEPS} (mean reward 0 for ")
    assert f"checkpoint step {ZERO_REWARD_STEPS} saved" in stop.note
    assert not (spec.path / "train_done.json").exists() and not trained.decide(spec).trained
    (record,) = list((spec.path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert f"hpc-grpo health: zero_reward at step {ZERO_REWARD_STEPS}".encode() in record.read_bytes()

    # the rerun (what `hpc-grpo resume` starts) goes on from the saved step and judges its own steps only: one
    # more zero-reward step is no finding, and it trains to the end
    again = subprocess.run(job_argv(spec), cwd=REPO, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert again.returncode == 0, again.stdout[-3000:]
    assert f"resuming from {newest.path} (step {ZERO_REWARD_STEPS})" in again.stdout
    assert PREFIX not in again.stdout and [r["step"] for r in metrics(spec)] == list(range(1, 7))
    assert trained.decide(spec).trained and trained.health_stop(spec.path) is None


# -------------------------------------------------------------------------- job helpers (no training)
def fake_checkpoint(root: Path, step: int, skip: tuple[str, ...] = ()) -> Path:
    """A checkpoint-N folder in the formats transformers writes (safetensors, torch zip files)."""
    import struct
    import zipfile

    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (d / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        if name not in skip:
            with zipfile.ZipFile(d / name, "w") as zf:
                zf.writestr("archive/data.pkl", b"x")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 8}))
    return d


def test_trim_metrics_drops_steps_to_be_retrained(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert trim_metrics(path, 4) == 0
    lines = [json.dumps({"step": s, "reward": 0.0}) for s in range(1, 7)] + ['{"step": 7, "rew']
    path.write_text("\n".join(lines))
    assert trim_metrics(path, 4) == 3
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3, 4]
    assert trim_metrics(path, 4) == 0


def test_quarantine_moves_only_incomplete(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    fake_checkpoint(ckpts, 2)
    fake_checkpoint(ckpts, 4, skip=("optimizer.pt",))
    moved = [Path(new) for _old, new, _why in prepare(tmp_path, "trl").quarantined]
    assert [p.parent for p in moved] == [tmp_path / layout.QUARANTINE_DIR] and moved[0].name.startswith("checkpoint-4.")
    assert (moved[0] / "trainer_state.json").is_file()  # moved, not deleted
    assert [c.step for c in ck.list_checkpoints(tmp_path, "trl")] == [2]


def test_target_steps(tmp_path: Path) -> None:
    fake_checkpoint(tmp_path / "checkpoints", 2)
    ckpt = ck.newest_complete(ck.list_checkpoints(tmp_path, "trl"))
    assert target_steps(24, None) == 24 and target_steps(-1, None) is None
    assert target_steps(-1, ckpt) == 8  # epoch-based: what trl recorded in trainer_state.json


def test_prompt_lengths_are_cached_per_key(tmp_path: Path) -> None:
    class CountingTokenizer:
        calls = 0

        def apply_chat_template(self, chats: list, add_generation_prompt: bool, tokenize: bool) -> dict:
            CountingTokenizer.calls += 1
            return {"input_ids": [[0] * len(c[0]["content"]) for c in chats]}

    prompts = [[{"role": "user", "content": "x" * n}] for n in (3, 1, 4)]
    cache, key = tmp_path / "prompt_lengths.json", {"train_file": "t", "tokenizer_sha256": "a"}
    tok = CountingTokenizer()
    assert prompt_lengths(prompts, tok, cache, key) == [3, 1, 4] and tok.calls == 1
    assert prompt_lengths(prompts, tok, cache, key) == [3, 1, 4] and tok.calls == 1  # from the cache
    assert prompt_lengths(prompts, tok, cache, {**key, "tokenizer_sha256": "b"}) == [3, 1, 4] and tok.calls == 2
    cache.write_text("{broken")
    assert prompt_lengths(prompts, tok, cache, key) == [3, 1, 4] and tok.calls == 3
