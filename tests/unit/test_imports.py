"""The commands people wait on import no heavy stack (each is 0.4-4 s of start-up per call)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "trl", "wandb", "lm_eval", "peft", "datasets", "ray", "hydra", "vllm")

PROBE = """
import json, sys
sys.argv = ["hpc-grpo", *json.loads(sys.argv[1])]
from hpc_grpo.cli import app as cli
try:
    cli.main()
except SystemExit:
    pass
print("\\nMODULES=" + json.dumps(sorted({m.split('.')[0] for m in sys.modules})))
"""


def loaded(*argv: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(argv))], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "WANDB_MODE": "offline"}, timeout=120)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES=")]
    assert line, proc.stdout + proc.stderr
    return set(json.loads(line[-1].removeprefix("MODULES=")))


def test_plan_without_schema_imports_nothing_heavy() -> None:
    mods = loaded("plan", "recipe=qwen2.5-7b-codegen", "cluster=a100-ib", "--no-schema")
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_render_imports_nothing_heavy(tmp_path) -> None:
    mods = loaded("render", "recipe=tiny-gsm8k", "cluster=local", "--no-schema", "-o", str(tmp_path / "out"))
    assert (tmp_path / "out" / "scripts" / "sbatch.sh").exists()
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_plan_with_schema_imports_only_hydra() -> None:
    mods = loaded("plan", "recipe=qwen2.5-7b-codegen", "cluster=a100-ib")
    assert not mods & (set(HEAVY) - {"hydra"}), mods & set(HEAVY)


def test_status_and_runs_import_nothing_heavy(tmp_path) -> None:
    for argv in (("status", str(tmp_path / "no-such-run")), ("runs", "--json")):
        mods = loaded(*argv)
        assert "hpc_grpo" in mods, argv
        assert not mods & set(HEAVY), (argv, mods & set(HEAVY))


def test_status_with_monitor_and_logs_import_nothing_heavy(tmp_path) -> None:
    """status (with its progress and hints) and logs read a real run directory without the training stack."""
    from hpc_grpo.config.resolve import resolve_spec
    from hpc_grpo.launch.render import render_all, write_files
    from hpc_grpo.runstate import runs

    spec = resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={tmp_path}"], run_name="r")
    write_files(spec.path, render_all(spec))
    (spec.path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.1, "kl": 0.0, "time": 1.0}\n')
    runs.append_history(spec.path, "99999999", "train", "local")
    (spec.path / "submitit").mkdir(exist_ok=True)
    (spec.path / "submitit" / "99999999_0_log.out").write_text("hello from the driver\n")
    for argv in (("status", str(spec.path)), ("logs", str(spec.path)), ("plan", "recipe=tiny-gsm8k", "cluster=slurm-dev")):
        mods = loaded(*argv)
        assert "hpc_grpo" in mods, argv
        assert not mods & set(HEAVY), (argv, mods & set(HEAVY))


def test_prune_imports_nothing_heavy(tmp_path) -> None:
    mods = loaded("prune-ckpts", str(tmp_path / "no-such-run"), "--dry-run", "--json")
    assert "hpc_grpo" in mods
    assert not mods & set(HEAVY), mods & set(HEAVY)
    import hpc_grpo.runstate.prune  # noqa: F401  (the module itself: the CLI path above may stop at locating the run)

    probe = "import sys, hpc_grpo.runstate.prune, hpc_grpo.commands.prune, hpc_grpo.job.prune_poller; print(sorted({m.split('.')[0] for m in sys.modules}))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert not set(eval(proc.stdout)) & set(HEAVY), proc.stdout


def test_eval_and_report_front_ends_import_nothing_heavy(tmp_path) -> None:
    """`eval` runs lm-eval in a child process; its own process (argument checks, table) stays light."""
    mods = loaded("eval", "--model", str(tmp_path / "missing"), "--test-file", "/x", "--train-file", "/x")
    assert not mods & set(HEAVY), mods & set(HEAVY)
    mods = loaded("report", str(tmp_path / "no-such-run"))
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_resume_planning_imports_nothing_heavy(tmp_path) -> None:
    """`resume` decides (live job, finished run, overrides, newest checkpoint) before anything heavy loads."""
    from hpc_grpo.launch.render import render_all, write_files
    from hpc_grpo.config.resolve import resolve_spec

    spec = resolve_spec("tiny-gsm8k", "local", overrides=[f"cluster.runs_root={tmp_path}"], run_name="done")
    write_files(spec.path, render_all(spec))
    (spec.path / "train_done.json").write_text('{"final_step": 24}')
    mods = loaded("resume", str(spec.path), "resources.time=01:00:00")
    assert "hpc_grpo" in mods and not mods & set(HEAVY), mods & set(HEAVY)
    assert not (spec.path / "history.jsonl").exists()


def test_plan_of_a_verl_job_on_local_imports_nothing_heavy() -> None:
    """plan asks the job's interpreter whether it runs verl's trainer in a child process: torch, Ray and verl are
    imported there, never here."""
    mods = loaded("plan", "recipe=tiny-verl", "cluster=local", "--no-schema")
    assert "hpc_grpo" in mods and not mods & set(HEAVY) and "verl" not in mods, mods & {*HEAVY, "verl"}
