"""verl's real trainer on CPU: a plugin loaded into every verl process through `VERL_USE_EXTERNAL_MODULES`.

Why: vLLM and NCCL need GPUs, but everything else a GPU user runs (main_ppo, Hydra, the Ray worker groups, FSDP2,
the reward, the actor update, checkpoint saves and resume, the file logger) does not. With this module verl runs its
own GRPO loop on CPU, so the launch path, resume preparation, prune and the eval chain are tested through verl's
real code, and users can rehearse a recipe before spending GPU hours (`hpc-grpo rehearse`).

What it does, using the pinned verl's extension points only (no installed file is changed):
- registers a CPU platform (`VERL_PLATFORM=hpc_grpo_cpu`): device "cpu", collectives on gloo, Ray's fake GPUs as
  the per-process resource (each training process holds one "GPU" bundle, as on a GPU node);
- makes `torch.distributed.init_process_group` accept verl's "cpu:gloo,cpu:gloo" (verl builds `cpu:gloo,<dev>:<be>`,
  which on a cpu device names the cpu twice);
- replaces FSDP2's pinned CPU offload policy with an unpinned one (verl's reference model asks for pinning, which
  needs an accelerator: without this no full-weight run with a KL loss starts on CPU);
- registers the HF-sampling rollout server (`actor_rollout_ref.rollout.name=hf`, hpc_grpo.engines.verl_hf_rollout)
  in verl's two rollout registries;
- for Megatron recipes (the launch sets hpc_grpo.engines.megatron_cpu.ENABLE), hooks megatron-core's and mbridge's
  runtime patches, which run only when those modules are first imported (verl's training workers).

Imported by verl's own `__init__` in every process (the driver, the TaskRunner, every worker): keep it cheap and
free of side effects beyond the registrations. Nothing here runs on the path of render, plan, status or prune.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from hpc_grpo.config.verl_keys import VERL_VERSION  # the only verl this plugin was built and tested against
from hpc_grpo.engines import megatron_cpu

PLATFORM = "hpc_grpo_cpu"
ROLLOUT = "hf"
ADAPTER = "hpc_grpo.engines.verl_hf_rollout.HFServerAdapter"

# What the launch sets in every verl process (the driver's and `ray start`'s environment, so Ray's workers inherit
# it): this module is the plugin, its platform is the device, and verl picks its FSDP engines, which are
# registered for cuda/npu only (the engines themselves place tensors on get_device_name(), "cpu").
ENV = {
    "VERL_USE_EXTERNAL_MODULES": __name__,
    "VERL_PLATFORM": PLATFORM,
    "VERL_ENGINE_DEVICE": "cuda",
    "OMP_NUM_THREADS": "1",
    "RAY_DEDUP_LOGS": "0",
}


def check_version(found: str) -> None:
    """Refuse any other verl: the plugin leans on registries and call shapes of this exact release."""
    if found != VERL_VERSION:
        raise RuntimeError(
            f"hpc-grpo's verl CPU mode was built against verl {VERL_VERSION}, but verl {found} is installed. "
            f"Fix: install verl=={VERL_VERSION} (bash tools/setup-env.sh verl), or run on GPUs (resources.gpus_per_node > 0)."
        )


class _CPUDeviceModule(SimpleNamespace):
    """What verl calls on `get_torch_device()` (torch.cuda's API): device queries answer for the CPU, memory
    queries answer 0, everything else is a no-op, so verl's memory logging and cache freeing just pass."""

    def __getattr__(self, name: str) -> Any:
        import torch

        if name.startswith("__"):  # abc asks for __isabstractmethod__: answer as any plain object does
            raise AttributeError(name)

        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if "memory" in name or name.startswith("max_") or name == "mem_get_info":
            return lambda *a, **k: (0, 0) if name == "mem_get_info" else 0
        return lambda *a, **k: None

    @staticmethod
    def current_device() -> str:
        # verl does `model.to(device=get_device_id())`: the CPU's device is the string "cpu", not an index
        return "cpu"

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def get_device_name(*_: Any) -> str:
        return "CPU"  # verl's flops counter looks the name up in its table (unknown: infinite peak, MFU 0)

    @staticmethod
    def is_available() -> bool:
        return True


def _register_platform() -> None:
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    device = _CPUDeviceModule()

    @PlatformRegistry.register(platform=PLATFORM)
    class CPUPlatform(PlatformBase):
        """verl on CPU processes; Ray's fake GPUs stand for the training processes' slots."""

        device_name = "cpu"
        vendor_name = "cpu"
        device_module = device  # type: ignore[assignment]  # an object with torch.cuda's names, not a module

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:  # type: ignore[override]
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            import torch

            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            self.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None


def dedupe_backend(backend: str | None) -> str | None:
    """"cpu:gloo,cpu:gloo" -> "cpu:gloo": torch refuses a device named twice ("Duplicate device type cpu")."""
    if not backend or "," not in backend:
        return backend
    seen: dict[str, str] = {}
    for part in backend.split(","):
        dev, _, be = part.partition(":")
        seen.setdefault(dev, part)
    return ",".join(seen.values())


def _patch_init_process_group() -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_hpc_grpo", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = dedupe_backend(kwargs["backend"])
        elif args:
            args = (dedupe_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._hpc_grpo = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def _unpin_cpu_offload() -> None:
    """verl gives its reference model FSDP2's `CPUOffloadPolicy(pin_memory=True)` (transformer_impl.py, forward-only
    engines). Pinned memory needs an accelerator ("Cannot access accelerator device when none is available"), so a
    full-weight run with a KL loss died at init on CPU. Here the parameters already live in host memory: the policy
    keeps its meaning (host-resident shards) without the pinning. verl's fsdp_utils imports the class from torch
    after this plugin runs, so replacing it on torch's module reaches verl."""
    import torch.distributed.fsdp as fsdp

    base = fsdp.CPUOffloadPolicy
    if getattr(base, "_hpc_grpo", False):
        return

    class UnpinnedCPUOffloadPolicy(base):  # type: ignore[misc, valid-type]
        _hpc_grpo = True

        def __init__(self, pin_memory: bool = False) -> None:
            super().__init__(pin_memory=False)

    fsdp.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy  # type: ignore[misc]


def _register_rollout() -> None:
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def load_replica() -> type:
        from hpc_grpo.engines.verl_hf_rollout import HFReplica

        return HFReplica

    RolloutReplicaRegistry.register(ROLLOUT, load_replica)
    # the pinned verl has no register function for the in-worker adapter: the module-level dict is the registry
    base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = ADAPTER


def install() -> None:
    """Everything above, once per process."""
    import verl.version

    version = getattr(verl.version, "__version__", None) or _installed_verl_version()
    check_version(version)
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    _register_platform()
    _patch_init_process_group()
    _unpin_cpu_offload()
    _register_rollout()
    if os.environ.get(megatron_cpu.ENABLE) == "1":  # a Megatron recipe: megatron-core's patches, on first import
        megatron_cpu.install()


def _installed_verl_version() -> str:
    from importlib.metadata import version

    return version("verl")


if os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",").count(__name__):
    install()
