"""verl's Megatron backend on CPU: runtime patches for megatron-core and mbridge, loaded in verl's worker processes.

Why: the pinned verl's Megatron engine runs megatron-core, which assumes CUDA and Transformer Engine in a few places even
when its pure-torch layers are asked for. With the configuration `render` writes for the CPU mode (padded bshd
batches, local attention, host initialisation, fusions off: hpc_grpo.engines.verl.CPU_MEGATRON_OVERRIDES) and
these patches, verl's real Megatron code trains on CPU with TP, PP and sequence parallel on gloo, so the headline
recipe's backend is tested (and rehearsed) without GPUs.

Narrow on purpose: each patch replaces one function (or gives one megatron-core module a torch whose "cuda" is the
CPU), checks that what it patches still has the shape it was written against (`expect`), and fails loudly when
megatron-core or mbridge changed, naming the patch. Each has a unit test that fails without it
(tests/unit/test_megatron_cpu.py). Nothing is patched in a process that never imports megatron-core or mbridge:
the patches run right after their module is first imported (a post-import hook), so verl's driver, TaskRunner and
vLLM processes pay nothing.

Loaded by hpc_grpo.engines.verl_cpu when the launch sets `ENABLE` (Megatron recipes in verl's CPU mode).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

ENABLE = "HPC_GRPO_MEGATRON_CPU"
# Only these releases were read and run: another one fails at the first patch, naming what to check.
MEGATRON_CORE_VERSION = "0.16.1"
MBRIDGE_VERSION = "0.15.1"
SKIP = "HPC_GRPO_MEGATRON_CPU_SKIP"  # comma-separated patch names left out (the unit tests show each one is needed)

ENV = {ENABLE: "1"}


class PatchMismatch(RuntimeError):
    """What a patch replaces is not what it was written against: megatron-core or mbridge changed."""


def expect(condition: bool, patch: str, what: str) -> None:
    if not condition:
        raise PatchMismatch(
            f"hpc-grpo's Megatron CPU patch '{patch}' no longer fits: {what}. It was written against megatron-core "
            f"{MEGATRON_CORE_VERSION} and mbridge {MBRIDGE_VERSION}. Fix: install those (bash tools/setup-env.sh "
            f"verl), or re-check the patch in hpc_grpo/engines/megatron_cpu.py against the new release.")


def _source_has(fn: Any, *needles: str) -> bool:
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return all(n in src for n in needles)


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _check_versions(patch: str, dist: str, pinned: str) -> None:
    found = _version(dist)
    expect(found == pinned, patch, f"{dist} {found} is installed, not {pinned}")


# ---------------------------------------------------------------------------------------- CUDA as the host
class _HostStream:
    """A CUDA stream's API where there is none: work is already ordered on the host."""

    def wait_stream(self, *_: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def wait_event(self, *_: Any) -> None:
        return None

    def record_event(self, *_: Any) -> None:
        return None


class _HostCuda(types.SimpleNamespace):
    """torch.cuda as the named megatron-core modules see it on CPU: the device is the host, streams are no-ops,
    and the RNG is the host's generator (megatron-core's tracker swaps per-name states of it)."""

    def __init__(self) -> None:
        import torch

        super().__init__(
            current_device=lambda: "cpu",
            device_count=lambda: 1,
            is_available=lambda: False,
            synchronize=lambda *a, **k: None,
            empty_cache=lambda: None,
            stream=lambda *_a, **_k: contextlib.nullcontext(),
            current_stream=lambda *_a, **_k: _HostStream(),
            default_stream=lambda *_a, **_k: _HostStream(),
            Stream=lambda *_a, **_k: _HostStream(),
            get_rng_state=lambda *_a, **_k: torch.get_rng_state(),
            set_rng_state=lambda state, *_a, **_k: torch.set_rng_state(state),
            manual_seed=lambda seed: torch.manual_seed(seed),
            manual_seed_all=lambda seed: torch.manual_seed(seed),
            default_generators=(torch.default_generator,),
            memory_allocated=lambda *_a, **_k: 0,
            max_memory_allocated=lambda *_a, **_k: 0,
        )


def _host_device(device: Any) -> Any:
    if device == "cuda" or (isinstance(device, str) and device.startswith("cuda:")):
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu"
    import torch

    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "empty_like", "ones_like")


class _HostTorch(types.ModuleType):
    """The `torch` one megatron-core module sees: torch itself, except `torch.cuda` (_HostCuda) and the factory
    functions, whose device "cuda" (or a CUDA index) is the host. Only the modules given it see it."""

    def __init__(self) -> None:
        import torch

        super().__init__("torch")
        self._torch = torch
        self.cuda = _HostCuda()
        for name in _FACTORIES:
            setattr(self, name, self._on_host(getattr(torch, name)))

    @staticmethod
    def _on_host(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if "device" in kwargs:
                kwargs["device"] = _host_device(kwargs["device"])
            return fn(*args, **kwargs)

        return call

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


def host_torch_for(module: types.ModuleType, patch: str, needles: tuple[str, ...]) -> None:
    """Give one megatron-core module the host torch, after checking its source still has the CUDA uses it is for."""
    src = inspect.getsource(module)
    missing = [n for n in needles if n not in src]
    expect(not missing, patch, f"{module.__name__} no longer contains {missing}")
    expect(getattr(module, "torch", None) is sys.modules["torch"], patch, f"{module.__name__} has no module-level torch")
    module.torch = _HostTorch()  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------ patches
def patch_layer_spec(mod: types.ModuleType) -> None:
    """mbridge asks megatron-core for Transformer Engine layers; on CPU, its local (pure-torch) layers."""
    _check_versions("layer_spec", "mbridge", MBRIDGE_VERSION)
    bridge = mod.LLMBridge
    original = bridge._get_transformer_layer_spec
    expect(_source_has(original, "get_gpt_decoder_block_spec", "use_transformer_engine=True"), "layer_spec",
           "LLMBridge._get_transformer_layer_spec no longer asks get_gpt_decoder_block_spec for TE layers")
    spec_fn = mod.get_gpt_decoder_block_spec
    expect("use_transformer_engine" in inspect.signature(spec_fn).parameters and
           "vp_stage" in inspect.signature(spec_fn).parameters, "layer_spec",
           "get_gpt_decoder_block_spec's signature changed")

    def _get_transformer_layer_spec(self: Any, vp_stage: int | None = None) -> Any:
        assert self.config.normalization == "RMSNorm", "only RMSNorm is supported for now"
        self.has_vp_stage = True
        return spec_fn(self.config, use_transformer_engine=False, vp_stage=vp_stage)

    bridge._get_transformer_layer_spec = _get_transformer_layer_spec


# megatron-core's local layers keep their norms as modules of their own; mbridge maps the TE layers' fused names
LOCAL_NORM_NAMES = {".input_layernorm.weight": ".self_attention.linear_qkv.layer_norm_weight",
                    ".pre_mlp_layernorm.weight": ".mlp.linear_fc1.layer_norm_weight"}


def te_name(name: str) -> str:
    """A local layer's norm weight under the name mbridge maps (its TE layer's); any other name unchanged."""
    for local, fused in LOCAL_NORM_NAMES.items():
        if name.endswith(local) and ".layers." in name:
            return name[: -len(local)] + fused
    return name


def patch_norm_names(mod: types.ModuleType) -> None:
    """mbridge names the norms of TE layers only: map the local layers' norm modules onto those names, both ways
    (loading HF weights and exporting them to vLLM or a Hugging Face folder go through this one mapping)."""
    bridge = mod.Bridge
    original = bridge._weight_name_mapping_mcore_to_hf
    expect(_source_has(original, "_DIRECT_MAPPING", "_weight_name_mapping_attention", "_weight_name_mapping_mlp"),
           "norm_names", "Bridge._weight_name_mapping_mcore_to_hf changed")

    @functools.wraps(original)
    def _weight_name_mapping_mcore_to_hf(self: Any, mcore_weights_name: str) -> list[str]:
        return original(self, te_name(mcore_weights_name))

    bridge._weight_name_mapping_mcore_to_hf = _weight_name_mapping_mcore_to_hf


def patch_rng(mod: types.ModuleType) -> None:
    """megatron-core's model-parallel RNG tracker keeps CUDA generator states; on CPU, the host generator's."""
    _check_versions("rng", "megatron-core", MEGATRON_CORE_VERSION)
    host_torch_for(mod, "rng", ("torch.cuda.get_rng_state()", "torch.cuda.manual_seed(", "default_generators"))
    expect(_source_has(mod._set_cuda_rng_state, "_lazy_call") and _source_has(mod._get_cuda_rng_state, "graph_safe"),
           "rng", "tensor_parallel.random's _get/_set_cuda_rng_state changed")
    import torch

    def _get_cuda_rng_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> Any:
        state = torch.get_rng_state()
        return state.clone() if clone else state

    def _set_cuda_rng_state(new_state: Any, device: int = -1, graph_safe: bool = False) -> None:
        torch.set_rng_state(new_state)

    mod._get_cuda_rng_state = _get_cuda_rng_state  # type: ignore[attr-defined]
    mod._set_cuda_rng_state = _set_cuda_rng_state  # type: ignore[attr-defined]


def patch_sp_norm(mod: types.ModuleType) -> None:
    """torch's norm refuses sequence parallel, though it is per token: build it with SP off and mark its parameters
    `sequence_parallel`, so megatron-core all-reduces their gradients over the TP group (as TE's norm does)."""
    norm = mod.WrappedTorchNorm
    original = norm.__new__
    expect(_source_has(original, "assert not config.sequence_parallel"), "sp_norm",
           "WrappedTorchNorm no longer refuses sequence parallel")

    def __new__(cls: type, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> Any:
        if not config.sequence_parallel:
            return original(cls, config, hidden_size, eps, **kwargs)
        import copy

        plain = copy.copy(config)
        plain.sequence_parallel = False
        module = original(cls, plain, hidden_size, eps, **kwargs)
        for param in module.parameters():
            param.sequence_parallel = True
        return module

    norm.__new__ = __new__


def causal_padding_mask(valid: Any) -> Any:
    """verl's padded batch mask (b, s), True where a token is, -> megatron-core's [b, 1, s, s], True where a query
    must not see a key: later positions (causal) and padding keys."""
    import torch

    s = valid.shape[1]
    future = torch.triu(torch.ones(s, s, dtype=torch.bool, device=valid.device), diagonal=1)
    return future[None, None] | ~valid.bool()[:, None, None, :]


def patch_attention_mask(mod: types.ModuleType) -> None:
    """verl's bshd path hands the model a (batch, seq) padding mask, which TE's attention reads as padding+causal;
    megatron-core's pure-torch attention needs the full [b, 1, s, s] mask (as given, it broadcasts the padding mask
    over the wrong axes and the causal mask is lost)."""
    attn = mod.DotProductAttention
    original = attn.forward
    expect(list(inspect.signature(original).parameters)[:5] == ["self", "query", "key", "value", "attention_mask"],
           "attention_mask", "DotProductAttention.forward's signature changed")

    @functools.wraps(original)
    def forward(self: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any, **kwargs: Any) -> Any:
        if attention_mask is not None and attention_mask.dim() == 2:
            attention_mask = causal_padding_mask(attention_mask)
        return original(self, query, key, value, attention_mask, *args, **kwargs)

    attn.forward = forward


# The .type() names megatron-core's optimizers accept for model parameters (CUDA only)
_CUDA_TYPES = {"torch.FloatTensor": "torch.cuda.FloatTensor", "torch.HalfTensor": "torch.cuda.HalfTensor",
               "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor"}


@contextlib.contextmanager
def cuda_type_names() -> Iterator[None]:
    """While an optimizer sorts its parameters, a host parameter's `.type()` answers its CUDA name."""
    import torch

    own = "type" in vars(torch.nn.Parameter)
    original = torch.nn.Parameter.type

    def type_(self: Any, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if dtype is None and not kwargs:
            name = original(self)
            return _CUDA_TYPES.get(name, name)
        return original(self, dtype, non_blocking, **kwargs)

    torch.nn.Parameter.type = type_  # type: ignore[method-assign]
    try:
        yield
    finally:
        if own:
            torch.nn.Parameter.type = original  # type: ignore[method-assign]
        else:
            del torch.nn.Parameter.type


def _with_cuda_type_names(cls: type, name: str, patch: str) -> None:
    fn = getattr(cls, name)
    expect(_source_has(fn, "torch.cuda.") or _source_has(cls, "'torch.cuda.FloatTensor'"), patch,
           f"{cls.__name__}.{name} no longer checks for torch.cuda tensor types")

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with cuda_type_names():
            return fn(*args, **kwargs)

    setattr(cls, name, wrapped)


def patch_optimizer(mod: types.ModuleType) -> None:
    """megatron-core's mixed-precision optimizer: scalars on 'cuda', a .type() check for torch.cuda tensors."""
    host_torch_for(mod, "optimizer", ("device='cuda'",))
    _with_cuda_type_names(mod.Float16OptimizerWithFloat16Params, "__init__", "optimizer")


def patch_distrib_optimizer(mod: types.ModuleType) -> None:
    """The distributed optimizer: buffers on torch.cuda.current_device(), .type() checks for torch.cuda tensors."""
    host_torch_for(mod, "distrib_optimizer", ("torch.cuda.current_device()",))
    _with_cuda_type_names(mod.DistributedOptimizer, "__init__", "distrib_optimizer")


def patch_resume_state(mod: types.ModuleType) -> None:
    """Without apex or TE, the distributed optimizer reads Adam's `step` from its per-parameter state, which a fresh
    optimizer (a job resuming from a dist checkpoint) does not have yet ("assert len(steps) == 1"). Create it first
    with megatron-core's own dummy step (what it does before loading), at learning rate and weight decay 0, so the
    weights do not move; the checkpoint's state then replaces it (Adam's step through `resume_step`)."""
    opt = mod.DistributedOptimizer
    original = opt.state_dict
    expect(_source_has(original, 'steps = list(set([s["step"].item() for s in inner_state_dict["state"].values()]))')
           and hasattr(opt, "_init_optimizer_states_with_dummy_values") and hasattr(mod, "HAVE_APEX_OR_TE"),
           "resume_state", "DistributedOptimizer.state_dict no longer reads step from the per-parameter state")

    @functools.wraps(original)
    def state_dict(self: Any) -> Any:
        if not mod.HAVE_APEX_OR_TE and not self.optimizer.state:
            saved = [(g.get("lr"), g.get("weight_decay")) for g in self.optimizer.param_groups]
            for group in self.optimizer.param_groups:
                group["lr"], group["weight_decay"] = 0.0, 0.0
            try:
                self._init_optimizer_states_with_dummy_values()
            finally:
                for group, (lr, wd) in zip(self.optimizer.param_groups, saved):
                    group["lr"], group["weight_decay"] = lr, wd
        return original(self)

    opt.state_dict = state_dict


def patch_resume_step(mod: types.ModuleType) -> None:
    """Without apex or TE, Adam counts its `step` per parameter, and the distributed optimizer's load_state_dict
    restores it wrongly twice over: it hands every parameter one shared step tensor (each optimizer step then
    advances it once per parameter, so the bias correction runs ahead by the rank's parameter count, which differs
    between pipeline stages: the two copies of a tied embedding part), and its dp_reshardable path then copies the
    optimizer's step from before the load (a local object of the sharded state dict) over the checkpoint's. After
    the load, give each parameter a step of its own, the checkpoint's. TE's and apex's FusedAdam keep the step in
    the param group and are not affected."""
    opt = mod.DistributedOptimizer
    original = opt.load_state_dict
    expect(_source_has(original, 'steps = list(set([g["step"] for g in state_dict["optimizer"]["param_groups"]]))',
                       's["step"] = step')
           and _source_has(opt._set_main_param_and_optimizer_states, "dst_tensors[key].copy_(tensors[key])")
           and hasattr(mod, "HybridDeviceOptimizer"),
           "resume_step", "DistributedOptimizer.load_state_dict no longer restores Adam's step as one shared tensor")
    import torch

    @functools.wraps(original)
    def load_state_dict(self: Any, state_dict: Any) -> None:
        original(self, state_dict)
        if mod.HAVE_APEX_OR_TE or self.ddp_config.use_megatron_fsdp or isinstance(self.optimizer,
                                                                                 mod.HybridDeviceOptimizer):
            return
        (step,) = {float(g["step"]) for g in state_dict["optimizer"]["param_groups"]}  # megatron-core asserts one
        for state in self.optimizer.state.values():
            if "step" in state:
                state["step"] = torch.tensor(step, dtype=state["step"].dtype, device=state["step"].device)

    opt.load_state_dict = load_state_dict


def patch_clip_grads(mod: types.ModuleType) -> None:
    """Gradient norm and clipping: the norm's all-reduce buffer on 'cuda', and the pure-torch stand-in for apex's
    l2-norm kernel (megatron.core.utils.local_multi_tensor_l2_norm) returns its norm on 'cuda'."""
    host_torch_for(mod, "clip_grads", ("device='cuda'",))
    local = getattr(mod, "l2_norm_impl", None)
    expect(getattr(local, "__name__", "") == "local_multi_tensor_l2_norm" and _source_has(local, 'device="cuda"'),
           "clip_grads", "clip_grads.l2_norm_impl is not megatron-core's local_multi_tensor_l2_norm on 'cuda'")
    import torch

    def local_multi_tensor_l2_norm(chunk_size: int, noop_flag: Any, tensor_lists: Any, per_tensor: bool,
                                   *args: Any) -> tuple[Any, None]:
        norms = [torch.norm(t) for group in tensor_lists for t in group]
        total = torch.norm(torch.stack(norms)) if norms else torch.zeros(())
        return total.reshape(1).float(), None

    mod.l2_norm_impl = local_multi_tensor_l2_norm  # type: ignore[attr-defined]
    original = mod.clip_grad_by_total_norm_fp32
    expect(_source_has(original, "assert param.grad.type() == 'torch.cuda.FloatTensor'", "max_norm / (total_norm"),
           "clip_grads", "clip_grad_by_total_norm_fp32 changed")

    @functools.wraps(original)
    def clip_grad_by_total_norm_fp32(parameters: Any, max_norm: float, total_norm: float,
                                     use_decoupled_grad: bool = False) -> None:
        grads = []
        for param in ([parameters] if isinstance(parameters, torch.Tensor) else parameters):
            grad = getattr(param, "decoupled_grad", None) if use_decoupled_grad else param.grad
            if grad is not None:
                assert grad.dtype in ((torch.float32, torch.bfloat16) if use_decoupled_grad else (torch.float32,))
                grads.append(mod.to_local_if_dtensor(grad).detach())
        coeff = max_norm / (total_norm + 1.0e-6)
        if coeff < 1.0:
            for grad in grads:
                grad.mul_(coeff)

    mod.clip_grad_by_total_norm_fp32 = clip_grad_by_total_norm_fp32  # type: ignore[attr-defined]
    rebind(original, clip_grad_by_total_norm_fp32, ("megatron.core.optimizer.optimizer",
                                                    "megatron.core.optimizer.distrib_optimizer"))


def rebind(original: Any, replacement: Any, users: tuple[str, ...]) -> None:
    """Modules imported before a patch ran hold the original by name: point them at the replacement."""
    for user in users:
        module = sys.modules.get(user)
        for name, value in list(vars(module).items()) if module else ():
            if value is original:
                setattr(module, name, replacement)


def patch_grad_buffer(mod: types.ModuleType) -> None:
    """The DDP grad buffers: allocated on torch.cuda.current_device(), reduced on a CUDA stream."""
    host_torch_for(mod, "grad_buffer", ("torch.cuda.current_device()", "torch.cuda.stream("))


@contextlib.contextmanager
def host_module_cuda() -> Iterator[None]:
    """`module.cuda(<the host>)` leaves the module where it is (torch refuses a non-CUDA device there)."""
    import torch

    original = torch.nn.Module.cuda

    def cuda(self: Any, device: Any = None) -> Any:
        if _host_device(device) != device or device == "cpu" or getattr(device, "type", None) == "cpu":
            return self
        return original(self, device)

    torch.nn.Module.cuda = cuda  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.cuda = original  # type: ignore[method-assign]


@contextlib.contextmanager
def host_tensor_cuda() -> Iterator[None]:
    """`tensor.cuda()` returns the host tensor itself (there is no CUDA device to move it to)."""
    import torch

    original = torch.Tensor.cuda

    def cuda(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self

    torch.Tensor.cuda = cuda  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = original  # type: ignore[method-assign]


def patch_pp_embedding(mod: types.ModuleType) -> None:
    """With pipeline stages and tied embeddings, the last stage's copy of the embedding is moved to CUDA
    (`weight.data.cuda()`) before the first/last-stage all-reduce that makes both copies equal."""
    module = mod.LanguageModule
    original = module.setup_embeddings_and_output_layer
    expect(_source_has(original, "weight.data = weight.data.cuda()"), "pp_embedding",
           "LanguageModule.setup_embeddings_and_output_layer no longer moves the shared embedding with .cuda()")

    @functools.wraps(original)
    def setup_embeddings_and_output_layer(self: Any) -> None:
        with host_tensor_cuda():
            original(self)

    module.setup_embeddings_and_output_layer = setup_embeddings_and_output_layer


def patch_get_model(mod: types.ModuleType) -> None:
    """mbridge's get_model moves each built module to torch.cuda.current_device(): on CPU it stays on the host."""
    host_torch_for(mod, "get_model", ("model_module.cuda(torch.cuda.current_device())",))
    original = mod.get_model

    @functools.wraps(original)
    def get_model(*args: Any, **kwargs: Any) -> Any:
        with host_module_cuda():
            return original(*args, **kwargs)

    mod.get_model = get_model  # type: ignore[attr-defined]
    rebind(original, get_model, ("mbridge.core.bridge",))


def patch_schedules(mod: types.ModuleType) -> None:
    """The forward-backward schedules count tokens in a tensor on "cuda"."""
    host_torch_for(mod, "schedules", ('torch.zeros([], dtype=torch.int, device="cuda")',))


def patch_p2p(mod: types.ModuleType) -> None:
    """Pipeline stages exchange shapes and activations in buffers on torch.cuda.current_device()."""
    host_torch_for(mod, "p2p", ("device=torch.cuda.current_device()", "torch.cuda.synchronize()"))


def patch_sp_mappings(mod: types.ModuleType) -> None:
    """Sequence parallel's gather/scatter allocate their outputs on torch.cuda.current_device()."""
    host_torch_for(mod, "sp_mappings", ("device=torch.cuda.current_device()",))


def patch_sp_layers(mod: types.ModuleType) -> None:
    """The TP linear layers' sequence-parallel all-gather allocates on torch.cuda.current_device()."""
    host_torch_for(mod, "sp_layers", ("device=torch.cuda.current_device()",))


def patch_memory_buffer(mod: types.ModuleType) -> None:
    """megatron-core's global scratch buffer (the SP all-gather's) allocates on torch.cuda.current_device()."""
    buffer = mod.GlobalMemoryBuffer
    original = buffer.get_tensor
    expect(_source_has(original, "device=torch.cuda.current_device()", "self.buffer[(name, dtype)]"),
           "memory_buffer", "GlobalMemoryBuffer.get_tensor changed")
    import torch

    @functools.wraps(original)
    def get_tensor(self: Any, tensor_shape: Any, dtype: Any, name: str, mem_alloc_context: Any = None) -> Any:
        required = 1
        for n in tensor_shape:
            required *= n
        held = self.buffer.get((name, dtype))
        if held is None or held.numel() < required:
            self.buffer[(name, dtype)] = torch.empty(required, dtype=dtype, device="cpu", requires_grad=False)
        return self.buffer[(name, dtype)][0:required].view(*tensor_shape)

    expect(list(inspect.signature(original).parameters) == ["self", "tensor_shape", "dtype", "name",
                                                            "mem_alloc_context"],
           "memory_buffer", "GlobalMemoryBuffer.get_tensor's signature changed")
    buffer.get_tensor = get_tensor


def patch_rope(mod: types.ModuleType) -> None:
    """Rotary embeddings move their inverse frequencies to torch.cuda.current_device() at the first forward."""
    host_torch_for(mod, "rope", ("self.inv_freq.to(device=torch.cuda.current_device())",))


def _host_torch_patch(patch: str, needles: tuple[str, ...]) -> Callable[[types.ModuleType], None]:
    def apply(mod: types.ModuleType) -> None:
        host_torch_for(mod, patch, needles)

    return apply


# Megatron's dist checkpoints (verl saves and resumes through them): saving synchronizes CUDA and checks results
# in CUDA tensors; loading exchanges shards through CUDA buffers.
DIST_CKPT = {
    "megatron.core.dist_checkpointing.strategies.filesystem_async": ("torch.cuda.synchronize()",),
    "megatron.core.dist_checkpointing.strategies.fully_parallel": ("torch.cuda.synchronize()",),
    "megatron.core.dist_checkpointing.strategies.state_dict_saver": ("device='cuda'",),
    "megatron.core.dist_checkpointing.exchange_utils": ('device="cuda"',),
}


# module -> [(patch name, function)]: each runs right after its module is first imported
PATCHES: dict[str, list[tuple[str, Callable[[types.ModuleType], None]]]] = {
    "mbridge.core.llm_bridge": [("layer_spec", patch_layer_spec)],
    "mbridge.core.bridge": [("norm_names", patch_norm_names)],
    "mbridge.core.util": [("get_model", patch_get_model)],
    "megatron.core.tensor_parallel.random": [("rng", patch_rng)],
    "megatron.core.transformer.torch_norm": [("sp_norm", patch_sp_norm)],
    "megatron.core.transformer.dot_product_attention": [("attention_mask", patch_attention_mask)],
    "megatron.core.optimizer.optimizer": [("optimizer", patch_optimizer)],
    "megatron.core.optimizer.distrib_optimizer": [("distrib_optimizer", patch_distrib_optimizer),
                                                  ("resume_state", patch_resume_state),
                                                  ("resume_step", patch_resume_step)],
    "megatron.core.optimizer.clip_grads": [("clip_grads", patch_clip_grads)],
    "megatron.core.distributed.param_and_grad_buffer": [("grad_buffer", patch_grad_buffer)],
    "megatron.core.pipeline_parallel.schedules": [("schedules", patch_schedules)],
    "megatron.core.pipeline_parallel.p2p_communication": [("p2p", patch_p2p)],
    "megatron.core.tensor_parallel.mappings": [("sp_mappings", patch_sp_mappings)],
    "megatron.core.tensor_parallel.layers": [("sp_layers", patch_sp_layers)],
    "megatron.core.utils": [("memory_buffer", patch_memory_buffer)],
    "megatron.core.models.common.embeddings.rotary_pos_embedding": [("rope", patch_rope)],
    "megatron.core.models.common.language_module.language_module": [("pp_embedding", patch_pp_embedding)],
    **{module: [("dist_ckpt", _host_torch_patch("dist_ckpt", needles))] for module, needles in DIST_CKPT.items()},
}
APPLIED: list[str] = []


def skipped() -> set[str]:
    return {s for s in os.environ.get(SKIP, "").split(",") if s}


def _apply(name: str, module: types.ModuleType) -> None:
    for patch, fn in PATCHES[name]:
        if patch in skipped() or f"{name}:{patch}" in APPLIED:
            continue
        fn(module)
        APPLIED.append(f"{name}:{patch}")


def apply_named(patch: str) -> None:
    """Apply one patch by name to its (already imported) module(s): for tests that show each one is needed."""
    found = False
    for name, entries in PATCHES.items():
        for entry, fn in entries:
            if entry == patch and name in sys.modules and f"{name}:{patch}" not in APPLIED:
                fn(sys.modules[name])
                APPLIED.append(f"{name}:{patch}")
                found = True
    if not found:
        raise KeyError(f"no imported module has the patch {patch!r}")


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self.inner, self.name = inner, name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        _apply(self.name, module)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of each patched module so its patch runs after it executes."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    """Patch what is already imported; hook the rest. Idempotent."""
    for name in PATCHES:
        if name in sys.modules:
            _apply(name, sys.modules[name])
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
