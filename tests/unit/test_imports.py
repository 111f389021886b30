"""The commands people wait on import no heavy stack (each is 0.4-4 s of start-up per call)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "trl", "wandb", "lm_eval", "peft", "datasets", "ray", "hydra", "vllm")

PROBE = """
import json, sys
sys.argv = ["hpc-grpo", *json.loads(sys.argv[1])]
from hpc_grpo import cli
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


def test_resume_planning_imports_nothing_heavy(tmp_path) -> None:
    """`resume` decides (live job, finished run, overrides, newest checkpoint) before anything heavy loads."""
    from hpc_grpo.render import render_all, write_files
    from hpc_grpo.resolve import resolve_spec

    spec = resolve_spec("tiny-gsm8k", "local", overrides=[f"cluster.runs_root={tmp_path}"], run_name="done")
    write_files(spec.path, render_all(spec))
    (spec.path / "train_done.json").write_text('{"final_step": 24}')
    mods = loaded("resume", str(spec.path), "resources.time=01:00:00")
    assert "hpc_grpo" in mods and not mods & set(HEAVY), mods & set(HEAVY)
    assert not (spec.path / "history.jsonl").exists()
