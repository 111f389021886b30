"""verl's CPU mode (hpc_grpo.engines.verl_cpu, hpc_grpo.engines.verl_hf_rollout): the plugin's own rules here, and
what the pinned verl sees with it loaded in `.venv-verl` (a probe script run there; the end-to-end run of verl's trainer
is tests/slurm/test_verl_lifecycle.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ONE_THREAD

from hpc_grpo.evaluation import export
from hpc_grpo.engines import verl_cpu
from hpc_grpo.engines.verl import modelled_overrides
from hpc_grpo.engines.verl_checks import check_verl_cpu
from hpc_grpo.config.resolve import resolve_spec

PROBE = Path(__file__).with_name("verl_cpu_probe.py")
REPO = Path(__file__).resolve().parents[2]


def test_backend_string_keeps_each_device_once() -> None:
    assert verl_cpu.dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert verl_cpu.dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"  # GPU runs: untouched
    assert verl_cpu.dedupe_backend("gloo") == "gloo" and verl_cpu.dedupe_backend(None) is None


def test_another_verl_is_refused_with_the_fix() -> None:
    verl_cpu.check_version(verl_cpu.VERL_VERSION)
    with pytest.raises(RuntimeError) as exc:
        verl_cpu.check_version("99.0.0")
    msg = str(exc.value)
    assert verl_cpu.VERL_VERSION in msg and "99.0.0" in msg and "pip" not in msg.split("Fix:")[0] and "setup-env.sh verl" in msg


def test_a_verl_recipe_without_gpus_runs_in_cpu_mode(isolated) -> None:
    spec = resolve_spec("tiny-verl", "slurm-dev", ["resources.nodes=2", "resources.cpu_workers_per_node=2"], run_name="t")
    assert spec.verl_cpu and spec.gpus_per_node == 0 and spec.procs_per_node == 2 and spec.world_size == 4
    ov = {o.key: o.value for o in modelled_overrides(spec)}
    assert ov["trainer.device"] == "cpu" and ov["trainer.n_gpus_per_node"] == 2 and ov["trainer.nnodes"] == 2
    assert ov["actor_rollout_ref.actor.strategy"] == "fsdp2" and ov["actor_rollout_ref.rollout.name"] == "vllm"
    assert ov["actor_rollout_ref.model.use_remove_padding"] is False
    assert ov["reward.custom_reward_function.path"] == "pkg://hpc_grpo.rewards.gsm8k"
    assert ov["+reward.custom_reward_function.reward_kwargs.method"] == "flexible"
    from hpc_grpo.launch.render import launch_context

    ctx = launch_context(spec)
    from hpc_grpo.engines import vllm_cpu

    assert ctx["node_env"] == verl_cpu.ENV | vllm_cpu.ENV and ctx["gpus_per_node"] == 2  # Ray's stand-in GPUs per node
    gpu = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", [], run_name="t")
    assert not gpu.verl_cpu and "trainer.device" not in {o.key for o in modelled_overrides(gpu)}
    assert launch_context(gpu)["node_env"] == {}


@pytest.mark.parametrize("recipe, overrides, key", [
    ("tiny-verl", ["rollout.name=sglang"], "rollout.name"),
    ("tiny-verl", ["rollout.name=vllm", "parallel.rollout_tp=2"], "parallel.rollout_tp"),
    ("qwen2.5-3b-gsm8k-lora", ["rollout.name=hf"], "rollout.name"),
    # Megatron on CPU: what megatron-core without Transformer Engine (or verl's CPU path) cannot run
    ("tiny-verl-megatron", ["lora.rank=8"], "lora.rank"),
    ("tiny-verl-megatron", ["parallel.ep=2"], "parallel.ep"),
    ("tiny-verl-megatron", ["parallel.cp=2"], "parallel.cp"),
    ("tiny-verl-megatron", ["parallel.pp=2", "parallel.vpp=2"], "parallel.vpp"),
    ("tiny-verl-megatron", ["offload.optimizer=true"], "offload.optimizer"),
    ("tiny-verl-megatron", ["batch.dynamic_bsz=true"], "batch.dynamic_bsz"),
])
def test_cpu_mode_refusals_name_the_key(isolated, recipe: str, overrides: list[str], key: str) -> None:
    cluster = "a100-ib" if recipe.startswith("qwen") else "slurm-dev"
    found = check_verl_cpu(resolve_spec(recipe, cluster, overrides, run_name="t"))
    errors = [f for f in found if f.severity.name == "ERROR"]
    assert [f.key for f in errors] == [key] and errors[0].fix, found


def test_verl_sees_the_cpu_platform_and_the_hf_rollout(tmp_path: Path) -> None:
    """In `.venv-verl`: device cpu on gloo, the hf rollout registered, log-probs the model's own, and a LoRA update
    that really changes what the server samples from (adapter tensors loaded into the base would not)."""
    python = export.verl_python()
    if python == os.sys.executable:
        reason = "no .venv-verl (bash tools/setup-env.sh verl builds it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "tiny")
    env = {**os.environ, "PYTHONPATH": str(REPO), **ONE_THREAD}
    proc = subprocess.run([python, str(PROBE), str(model)], capture_output=True, text=True, timeout=300, env=env,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["device"], got["backend"], got["device_id"], got["pg_backend"]) == ("cpu", "gloo", "cpu", "cpu:gloo"), got
    assert got["memory_allocated"] == 0 and got["device_label"] == "CPU"
    assert (got["adapter_class"], got["replica_class"]) == ("HFServerAdapter", "HFReplica")
    assert got["logprob_max_err"] < 1e-4 and 1 <= got["sampled_len"] <= 8, got
    assert got["adapter_active"] and got["loaded"]["adapter_tensors"] > 0
    assert got["adapter_moves"] > 1e-3, got  # the adapter changes the logits...
    assert got["matches_trained"] < 1e-3, got  # ...to the trained model's (the same bf16 values)
    assert got["global_steps"] == 3
    assert "adapter weights got none" in got["bad_names"] or "match no adapter weight" in got["bad_names"], got


def test_vllm_on_cpu_gets_its_overrides_and_environment(isolated) -> None:
    """vLLM's CPU build in verl's CPU mode: no sleep mode, nothing freed, eager, a 64 MB weight bucket, and the
    environment that turns hpc-grpo's vLLM plugin on; the plan says which sampler runs. A GPU recipe gets none."""
    from hpc_grpo.engines import vllm_cpu
    from hpc_grpo.engines.verl import node_env

    spec = resolve_spec("tiny-verl", "slurm-dev", ["rollout.name=vllm"], run_name="t")
    ov = {o.key: (o.value, o.source) for o in modelled_overrides(spec)}
    for key, value in vllm_cpu.OVERRIDES.items():
        assert ov[key][0] == value and "vLLM's CPU build" in ov[key][1], key
    assert ov["actor_rollout_ref.rollout.enforce_eager"][0] is True
    assert node_env(spec) == verl_cpu.ENV | vllm_cpu.ENV and node_env(spec)[vllm_cpu.ENABLE] == "1"
    said = " ".join(f.message for f in check_verl_cpu(spec))
    assert "vLLM's CPU build" in said
    hf = resolve_spec("tiny-verl", "slurm-dev", ["rollout.name=hf"], run_name="t")
    assert vllm_cpu.ENABLE not in node_env(hf) and "+actor_rollout_ref.rollout.enable_sleep_mode" not in {
        o.key for o in modelled_overrides(hf)}
    gpu = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", [], run_name="t")
    assert node_env(gpu) == {} and not any(k in vllm_cpu.OVERRIDES for k in (o.key for o in modelled_overrides(gpu)))
