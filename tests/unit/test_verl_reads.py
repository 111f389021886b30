"""Checks that read what verl reads: offload typed as verl's own key counts in the memory estimate,
megatron-core's pipeline split, and accepting an estimate explicitly through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpc_grpo.common.findings import Severity
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.engines.megatron_pipeline import PipelineSplit, Refused, stage_layers
from hpc_grpo.engines.verl_offload import CPU_OFFLOAD_KEY, FRACTION_KEY
from hpc_grpo.planning.plan import run_plan

MOE = "qwen3-30b-a3b-moe"
# One node and EP 2: the optimizer no longer fits beside the gradients (as a user shrinks the MoE recipe)
SMALL = ["resources.nodes=1", "parallel.ep=2"]
CPU_OFF = f"+{CPU_OFFLOAD_KEY}=True"
FRACTION = f"+{FRACTION_KEY}=1.0"
OTC = "+actor_rollout_ref.actor.megatron.override_transformer_config"


def plan_of(*overrides: str, recipe: str = MOE):
    spec = resolve_spec(recipe, "h100-efa", ["cluster.runs_root=/nonexistent/runs", *overrides], run_name="t")
    return run_plan(spec, schema=False)


def finding(plan, key: str):
    return [f for f in plan.findings if f.key == key]


# ------------------------------------------------------------------------------------------ memory
def test_moe_refused_without_the_flag_and_fits_with_it() -> None:
    before = plan_of(*SMALL)
    (mem,) = finding(before, "memory")
    assert mem.severity is Severity.ERROR and mem.estimate, mem
    after = plan_of(*SMALL, CPU_OFF, FRACTION)
    assert not finding(after, "memory") or finding(after, "memory")[0].severity is not Severity.ERROR
    saved = before.memory.training_gib - after.memory.training_gib
    # the whole optimizer (fp32 master + moments) leaves the GPU in the training phase; the peak is then the rollout's
    assert saved == pytest.approx(before.memory.terms["optimizer"], abs=0.1), (before.memory.training_gib, after.memory.training_gib)
    assert after.memory.total_gib < after.memory.capacity_gib < before.memory.total_gib


def test_flag_alone_moves_nothing_and_advice_names_the_fraction_not_the_flag() -> None:
    """megatron-core's optimizer_offload_fraction defaults to 0.0: the flag alone offloads nothing."""
    p = plan_of(*SMALL, CPU_OFF)
    (mem,) = finding(p, "memory")
    assert mem.severity is Severity.ERROR
    assert p.memory.total_gib == pytest.approx(plan_of(*SMALL).memory.total_gib)
    advice = " ".join(p.memory.advice)
    assert f"+{CPU_OFFLOAD_KEY}=True" not in advice, advice  # never the flag already typed
    assert f"+{FRACTION_KEY}=1.0" in advice, advice
    warned = finding(p, f"passthrough.{CPU_OFF.split('=')[0]}")
    assert warned and "moves nothing" in warned[0].message and FRACTION_KEY in warned[0].fix


def test_235b_style_script_with_the_flag_typed_is_not_told_to_type_it() -> None:
    p = plan_of("model.path=Qwen/Qwen3-235B-A22B", "resources.nodes=8", "parallel.pp=8", "parallel.ep=8",
                f"{OTC}.account_for_embedding_in_pipeline_split=True", f"{OTC}.account_for_loss_in_pipeline_split=True",
                "offload.optimizer=false", "offload.param=false", CPU_OFF, FRACTION)
    texts = " ".join(f.fix + " " + f.message for f in p.findings) + " ".join(p.memory.advice)
    assert "optimizer_cpu_offload=True" not in texts and "optimizer_offload_fraction=1.0" not in texts, texts
    assert p.memory.phases["training"]["optimizer"] == 0.0


def test_recipe_key_and_verl_key_are_one_source() -> None:
    """offload.optimizer is rendered as verl's megatron.optimizer_offload; typing verl's key beside it is refused."""
    p = plan_of(*SMALL, "+actor_rollout_ref.actor.megatron.optimizer_offload=False")
    assert any(f.severity is Severity.ERROR and "offload.optimizer" in f.fix for f in p.findings)


def test_misplaced_megatron_optimizer_key_is_refused_with_the_real_one() -> None:
    p = plan_of(*SMALL, "+actor_rollout_ref.actor.megatron.override_optimizer_config.optimizer_cpu_offload=True")
    (bad,) = [f for f in p.findings if "override_optimizer_config" in f.key]
    assert bad.severity is Severity.ERROR and CPU_OFFLOAD_KEY in bad.fix


# ---------------------------------------------------------------------------------------- pipeline
CASES = [  # (layers, pp, vpp, first, last, embedding, loss) -> split or None (refused)
    ((94, 8, None, None, None, True, True), [11, 12, 12, 12, 12, 12, 12, 11]),
    ((94, 8, None, None, None, False, False), None),
    ((94, 8, None, None, None, True, False), None),
    ((94, 8, None, 10, 12, False, False), [10, 12, 12, 12, 12, 12, 12, 12]),
    ((94, 8, None, 11, 11, True, False), None),  # first/last cannot be combined with account_for_*
    ((48, 2, None, None, None, False, False), [24, 24]),
    ((48, 4, 4, None, None, False, False), [12, 12, 12, 12]),
    ((48, 4, 5, None, None, False, False), None),
    ((62, 4, 2, None, None, True, True), [15, 16, 16, 15]),
    ((10, 2, None, 4, 6, False, False), [4, 6]),
    ((10, 3, None, 4, 6, False, False), None),  # no layers left for the middle stage
]


@pytest.mark.parametrize("args,expected", CASES)
def test_stage_layers(args, expected) -> None:
    split = PipelineSplit(*args)
    if expected is None:
        with pytest.raises(Refused):
            stage_layers(split)
    else:
        assert stage_layers(split) == expected


# megatron-core's own arithmetic, run where megatron-core is installed (.venv-verl): TransformerConfig's validation and
# get_num_layers_to_build per pipeline rank and virtual stage; no GPU is needed for either.
MCORE_SPLITS = """
import json, sys
import torch
from megatron.core.transformer.transformer_block import get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig
out = []
for layers, pp, vpp, first, last, embedding, loss in json.loads(sys.argv[1]):
    try:
        cfg = TransformerConfig(num_layers=layers, hidden_size=64, num_attention_heads=4,
                                pipeline_dtype=torch.bfloat16, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
                                num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
                                account_for_embedding_in_pipeline_split=embedding,
                                account_for_loss_in_pipeline_split=loss)
        chunks = range(vpp) if vpp else [None]
        out.append([sum(get_num_layers_to_build(cfg, vp_stage=v, pp_rank=r) for v in chunks) for r in range(pp)])
    except (ValueError, AssertionError) as exc:  # megatron-core's refusals
        print(repr(exc), file=sys.stderr)
        out.append(None)
print(json.dumps(out))
"""


def test_stage_layers_match_megatron_core() -> None:
    """Every case of the table, split by megatron-core itself: the same stages, refused in the same cases."""
    from hpc_grpo.evaluation.export import verl_python

    python = verl_python()
    has = subprocess.run([python, "-c", "import megatron.core"], capture_output=True, text=True, timeout=120)
    if has.returncode:
        reason = (f"megatron-core is not importable by {python} (bash tools/setup-env.sh verl builds .venv-verl with "
                  "it, or set HPC_GRPO_VERL_PYTHON); test_stage_layers still checks the table")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    proc = subprocess.run([python, "-c", MCORE_SPLITS, json.dumps([list(a) for a, _ in CASES])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == [expected for _, expected in CASES], proc.stderr[-3000:]


def test_plan_shows_the_split_and_refuses_only_what_megatron_core_refuses() -> None:
    base = ["model.path=Qwen/Qwen3-235B-A22B", "resources.nodes=8", "parallel.pp=8", "parallel.ep=8"]
    refused = plan_of(*base)
    (pp,) = finding(refused, "parallel.pp")
    assert pp.severity is Severity.ERROR and "94 layers do not divide by PP 8" in pp.message
    assert "account_for_embedding_in_pipeline_split" in pp.fix
    ok = plan_of(*base, f"{OTC}.account_for_embedding_in_pipeline_split=True",
                 f"{OTC}.account_for_loss_in_pipeline_split=True")
    (pp,) = finding(ok, "parallel.pp")
    assert pp.severity is Severity.INFO and "[11, 12, 12, 12, 12, 12, 12, 11]" in pp.message


# -------------------------------------------------------------------------------------- --accept
def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "COLUMNS": "250", "HOME": str(home)})


def test_accept_memory_through_the_cli(tmp_path: Path) -> None:
    base = ["recipe=" + MOE, "cluster=h100-efa", f"cluster.runs_root={tmp_path / 'runs'}", *SMALL, "--no-schema"]
    refused = cli("plan", *base, home=tmp_path)
    assert refused.returncode == 1 and "does not fit" in refused.stdout, refused.stdout + refused.stderr
    accepted = cli("plan", *base, "--accept", "memory", home=tmp_path)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "accepted (--accept memory)" in " ".join(accepted.stdout.split())
    out = tmp_path / "run"
    rendered = cli("render", *base, "--accept", "memory", "-o", str(out), home=tmp_path)
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    spec = yaml.safe_load((out / "spec.yaml").read_text())
    (acc,) = spec["accepted"]
    assert acc["check"] == "memory" and "does not fit" in acc["finding"] and "GiB" in acc["finding"]
    status = cli("status", str(out), home=tmp_path)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "accepted when the run was made (--accept memory)" in " ".join(status.stdout.split())


def test_accept_refuses_a_rule_and_unknown_names(tmp_path: Path) -> None:
    base = ["recipe=" + MOE, "cluster=h100-efa", f"cluster.runs_root={tmp_path / 'runs'}", "--no-schema"]
    for name in ("parallel.pp", "bogus"):
        proc = cli("plan", *base, "--accept", name, home=tmp_path)
        text = " ".join(proc.stderr.split())
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"--accept {name}" in text and "Acceptable: memory" in text and "rule" in text, text
    out = tmp_path / "never"
    proc = cli("render", *base, "--accept", "bogus", "-o", str(out), home=tmp_path)
    assert proc.returncode == 2 and not out.exists()


def test_a_run_without_acceptances_records_none() -> None:
    p = plan_of()
    assert p.spec.accepted == []
