"""Megatron on CPU (hpc_grpo.engines.megatron_cpu and the CPU settings in hpc_grpo.engines.verl): what render writes,
which bridge the install pins, and each runtime patch shown needed and working on the real megatron-core and mbridge
in `.venv-verl` (tests/unit/megatron_cpu_probe.py: 2 gloo processes, TP 2 with sequence parallel, the tiny model).
The end-to-end run of verl's Megatron trainer is tests/local/test_learning.py (tiny-verl-megatron)."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
import types
from pathlib import Path

import pytest

from tests.conftest import ONE_THREAD

from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.engines import megatron_cpu
from hpc_grpo.engines.verl import (BRIDGE_PIN, CPU_MEGATRON_MODE, CPU_MEGATRON_OVERRIDES, MEGATRON_CPU_FUSIONS,
                                   modelled_overrides, node_env)
from hpc_grpo.engines.verl_checks import check_verl_cpu
from hpc_grpo.evaluation import export

# One xdist worker runs the whole module (tools/run-tests.sh: --dist loadgroup):
# the probe (one megatron-core process, ~30 s) is a module fixture, built once.
pytestmark = pytest.mark.xdist_group("test_megatron_cpu")

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("megatron_cpu_probe.py")
OTC = "actor_rollout_ref.actor.megatron.override_transformer_config"


def overrides(recipe: str, cluster: str, *extra: str) -> dict[str, tuple[object, str]]:
    spec = resolve_spec(recipe, cluster, list(extra), run_name="t")
    return {o.key: (o.value, o.source) for o in modelled_overrides(spec)}


def test_cpu_megatron_renders_the_cpu_configuration_with_its_source(isolated) -> None:
    ov = overrides("tiny-verl-megatron", "slurm-dev", "parallel.sequence_parallel=true")
    assert ov["trainer.device"][0] == "cpu"
    assert ov["actor_rollout_ref.actor.megatron.use_remove_padding"] == (False, CPU_MEGATRON_MODE)
    assert ov[f"{OTC}.attention_backend"] == ("local", CPU_MEGATRON_MODE)
    assert ov[f"+{OTC}.use_cpu_initialization"] == (True, CPU_MEGATRON_MODE)
    for fusion in MEGATRON_CPU_FUSIONS:
        assert ov[f"+{OTC}.{fusion}"] == (False, CPU_MEGATRON_MODE), fusion
    # mbridge decides sequence parallel from override_transformer_config (the reference inherits it)
    assert ov[f"+{OTC}.sequence_parallel"] == (True, "parallel.sequence_parallel")
    for role in ("actor", "ref"):
        assert ov[f"actor_rollout_ref.{role}.megatron.use_mbridge"][0] is True
        assert ov[f"actor_rollout_ref.{role}.megatron.vanilla_mbridge"][0] is True
        assert ov[f"actor_rollout_ref.{role}.megatron.sequence_parallel"][0] is True
    assert "actor_rollout_ref.actor.strategy" not in ov  # the FSDP CPU settings are FSDP's only
    assert node_env(resolve_spec("tiny-verl-megatron", "local", [], run_name="t"))[megatron_cpu.ENABLE] == "1"
    assert megatron_cpu.ENABLE not in node_env(resolve_spec("tiny-verl", "local", [], run_name="t"))
    said = " ".join(f.message for f in check_verl_cpu(resolve_spec("tiny-verl-megatron", "local", [], run_name="t")))
    assert "Megatron (megatron-core without Transformer Engine" in said and "refused here: LoRA" in said


def test_gpu_megatron_gets_the_bridge_and_none_of_the_cpu_settings(isolated) -> None:
    ov = overrides("qwen2.5-7b-codegen", "a100-ib")
    assert ov["actor_rollout_ref.actor.megatron.vanilla_mbridge"][0] is True and "mbridge" in ov[
        "actor_rollout_ref.actor.megatron.vanilla_mbridge"][1]
    assert not any(k.lstrip("+") in {c.lstrip("+") for c in CPU_MEGATRON_OVERRIDES} for k in ov if k != "trainer.device")
    assert "trainer.device" not in ov
    lora = overrides("qwen2.5-7b-codegen", "a100-ib", "lora.rank=8")  # verl's Megatron LoRA: Megatron-Bridge only
    assert lora["actor_rollout_ref.actor.megatron.vanilla_mbridge"][0] is False


def test_both_verl_extras_pin_the_bridge() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("train-verl", "train-verl-cpu"):
        assert BRIDGE_PIN in extras[extra], extra
    assert megatron_cpu.MBRIDGE_VERSION == BRIDGE_PIN.split("==")[1]


def test_a_changed_target_fails_loudly_naming_the_patch() -> None:
    """A megatron-core or mbridge release where the patched code looks different: no silent half-patch."""
    def changed(self, name):  # noqa: ANN001, ANN202 - a mapping function of another mbridge release
        return [name]

    with pytest.raises(megatron_cpu.PatchMismatch) as exc:
        megatron_cpu.patch_norm_names(types.SimpleNamespace(Bridge=type("Bridge", (), {
            "_weight_name_mapping_mcore_to_hf": changed})))
    msg = str(exc.value)
    assert "'norm_names'" in msg and megatron_cpu.MEGATRON_CORE_VERSION in msg and "setup-env.sh verl" in msg


def test_local_norm_names_map_onto_the_te_names() -> None:
    assert megatron_cpu.te_name("decoder.layers.3.input_layernorm.weight") == \
        "decoder.layers.3.self_attention.linear_qkv.layer_norm_weight"
    assert megatron_cpu.te_name("decoder.layers.0.pre_mlp_layernorm.weight") == \
        "decoder.layers.0.mlp.linear_fc1.layer_norm_weight"
    assert megatron_cpu.te_name("decoder.final_layernorm.weight") == "decoder.final_layernorm.weight"


# Each step: the patch it applies, and the file the unpatched call fails in (where megatron-core/mbridge assumed CUDA
# or Transformer Engine). "with": the call gets past that place once it is applied (a forward or training step then
# stops at the next step's module, still unpatched); the last forward and the training step run through.
NEEDED = {
    "rng": "megatron/core/tensor_parallel/random.py",
    "layer_spec": "megatron/core/models/gpt/gpt_layer_specs.py",  # TE's norm class, absent without TE
    "sp_norm": "megatron/core/transformer/torch_norm.py",
    "get_model": "mbridge/core/util.py",
    "grad_buffer": "megatron/core/distributed/param_and_grad_buffer.py",
    "norm_names": "mbridge/core/bridge.py",
    "sp_mappings": "megatron/core/tensor_parallel/mappings.py",
    "rope": "megatron/core/models/common/embeddings/rotary_pos_embedding.py",
    "memory_buffer": "megatron/core/utils.py",
    "attention_mask": "megatron/core/transformer/utils.py",  # the mask broadcast over the wrong axes
    "optimizers": "megatron/core/optimizer/optimizer.py",
    "schedules": "megatron/core/pipeline_parallel/schedules.py",
    "sp_layers": "megatron/core/tensor_parallel/layers.py",
    "resume_state": "megatron/core/optimizer/distrib_optimizer.py",
    "clip_grads": "megatron/core/optimizer/clip_grads.py",
    "dist_ckpt": "megatron/core/dist_checkpointing/strategies/filesystem_async.py",  # verl's save, then its load
}


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    python = export.verl_python()
    if python == os.sys.executable:
        reason = "no .venv-verl (bash tools/setup-env.sh verl builds it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    root = tmp_path_factory.mktemp("megatron-cpu")
    model = ensure_tiny_model(root / "tiny")
    env = {**os.environ, "PYTHONPATH": str(REPO), **ONE_THREAD}
    proc = subprocess.run([python, str(PROBE), str(model), str(root)], capture_output=True, text=True, timeout=600,
                          env=env, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = json.loads(proc.stdout.strip().splitlines()[-1])
    for rank in ranks:
        assert "_crash" not in rank["steps"], rank["steps"]["_crash"]
    return ranks


@pytest.mark.parametrize("name", list(NEEDED))
def test_each_patch_is_needed_and_works(probed: list[dict], name: str) -> None:
    for rank in probed:
        got = rank["steps"][name]
        assert got["without"] and f"@ {NEEDED[name]}:" in got["without"], got
        assert got["with"] == "ok" or f"@ {NEEDED[name]}:" not in got["with"], got
    if name in ("attention_mask", "clip_grads", "optimizers", "get_model", "norm_names", "rng", "sp_norm",
                "resume_state", "dist_ckpt"):
        assert all(rank["steps"][name]["with"] == "ok" for rank in probed)


def test_a_resumed_optimizer_takes_the_uninterrupted_step(probed: list[dict]) -> None:
    """Adam's step restored from the distributed optimizer's dist checkpoint: unpatched, one tensor shared by every
    parameter and holding the step from before the load; patched, each parameter's own, the checkpoint's."""
    for rank in probed:
        got = rank["steps"]["resume_step"]
        unpatched, patched = got["runs"]
        assert got["without"] and unpatched["apart"] > 0, got
        assert unpatched["tensors"] == 1 and set(unpatched["after_load"]) != {unpatched["saved"]}, got
        assert got["with"] == "ok" and patched["apart"] == 0, got
        assert patched["tensors"] == len(patched["after_load"]) and set(patched["after_load"]) == {patched["saved"]}


def test_the_patched_megatron_model_is_the_hf_model_and_trains(probed: list[dict]) -> None:
    for rank in probed:
        s = rank["steps"]
        assert s["rng"]["fork"] is None  # the tracker's named states really fork the host generator
        update = s["clip_grads"]["update"]
        assert update["ok"] and update["grad_norm"] > 0 and update["moved"] > 0, update
        assert s["sp_norm"]["same_on_tp_ranks"]  # SP norm grads were all-reduced over TP
        assert s["norm_names"]["exported"] == [f"model.layers.{i}.{n}.weight" for i in (0, 1)
                                               for n in ("input_layernorm", "post_attention_layernorm")]
