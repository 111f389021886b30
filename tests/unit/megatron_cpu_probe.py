"""Run by tests/unit/test_megatron_cpu.py in `.venv-verl`: each Megatron CPU patch (hpc_grpo.engines.megatron_cpu),
shown needed and shown working, on the real megatron-core, mbridge and verl's bridge entry, in 2 gloo processes
(tensor parallel 2, sequence parallel on, the tiny model).

No patch is installed at import: every step first runs the real call unpatched and records how it fails, then applies
the patch(es) of that step to the already imported module and runs it again. Prints one JSON line per rank:
{"rank": r, "steps": {name: {"without": "<error>" or null, "with": "ok" or "<error>", ...}}}.
Usage: python megatron_cpu_probe.py MODEL_DIR OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

TP = 2


def _err(exc: BaseException) -> str:
    """The error and where it was raised: the deepest frame outside torch (the call that assumed CUDA)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in f.filename]
    where = f"{frames[-1].filename.split('site-packages/')[-1]}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300] + f" @ {where}"


def step(results: dict[str, Any], name: str, patches: list[str], call: Any, check: Any = None) -> Any:
    """Run `call` unpatched (it must fail), apply `patches`, run it again (it must work); `check` judges the result."""
    from hpc_grpo.engines import megatron_cpu

    out: dict[str, Any] = {}
    try:
        got = call()
        out["without"] = None if check is None else check(got, False)
    except Exception as exc:  # noqa: BLE001 - the failure is the evidence
        out["without"] = _err(exc)
    for patch in patches:
        megatron_cpu.apply_named(patch)
    try:
        got = call()
        out["with"] = "ok" if check is None else (check(got, True) or "ok")
    except Exception as exc:  # noqa: BLE001
        out["with"] = _err(exc)
        got = None
    results[name] = out
    return got


def adam_steps(optimizer: Any) -> list[Any]:
    """Adam's step tensor of each parameter's state (torch's Adam keeps one per parameter)."""
    inner = [o.optimizer for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    return [state["step"] for o in inner for state in o.state.values()]


def rank_main(rank: int, model_dir: str, out_dir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch

    torch.distributed.init_process_group("gloo", rank=rank, world_size=TP)
    results: dict[str, Any] = {}
    try:
        run(rank, model_dir, results, out_dir)
    except Exception:  # noqa: BLE001 - reported, and the test fails on the missing steps
        results["_crash"] = traceback.format_exc()[-3000:]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"rank": rank, "steps": results}))


def run(rank: int, model_dir: str, results: dict[str, Any], out_dir: str) -> None:
    import torch
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel

    mpu.initialize_model_parallel(tensor_model_parallel_size=TP)
    # the verl import order: its mbridge entry, then mbridge's modules (the patch hook is not installed here)
    from verl.models.mcore.mbridge import AutoBridge
    import mbridge.core.bridge  # noqa: F401
    import mbridge.core.llm_bridge  # noqa: F401
    import mbridge.core.util  # noqa: F401
    import megatron.core.distributed.param_and_grad_buffer  # noqa: F401
    import megatron.core.optimizer.clip_grads  # noqa: F401
    import megatron.core.optimizer.distrib_optimizer  # noqa: F401
    import megatron.core.optimizer.optimizer  # noqa: F401
    import megatron.core.pipeline_parallel.schedules  # noqa: F401
    import megatron.core.tensor_parallel.layers  # noqa: F401
    import megatron.core.tensor_parallel.mappings  # noqa: F401
    import megatron.core.transformer.dot_product_attention  # noqa: F401
    import megatron.core.transformer.torch_norm  # noqa: F401
    import megatron.core.utils  # noqa: F401
    import megatron.core.models.common.embeddings.rotary_pos_embedding  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM

    from hpc_grpo.engines.verl import CPU_MEGATRON_OVERRIDES

    step(results, "rng", ["rng"],
         lambda: tensor_parallel.model_parallel_cuda_manual_seed(42))

    def forked_draws(_: Any, patched: bool) -> str | None:
        tracker = tensor_parallel.get_cuda_rng_tracker()
        with tracker.fork():
            a = torch.rand(3)
        with tracker.fork():
            b = torch.rand(3)
        return None if not torch.equal(a, b) else "the tracker's fork repeats its draws"

    results["rng"]["fork"] = forked_draws(None, True)

    hf_config = AutoConfig.from_pretrained(model_dir)
    if not hasattr(hf_config, "rope_theta"):  # transformers 5 keeps it in rope_parameters; mbridge reads the old name
        hf_config.rope_theta = hf_config.rope_parameters["rope_theta"]
    bridge = AutoBridge.from_config(hf_config, dtype=torch.float32)
    extra = {k.rsplit(".", 1)[1]: v for k, v in CPU_MEGATRON_OVERRIDES.items() if "override_transformer_config" in k}
    bridge.set_extra_args(**extra, sequence_parallel=True)

    step(results, "layer_spec", ["layer_spec"], lambda: bridge._get_transformer_layer_spec(None))
    step(results, "sp_norm", ["sp_norm"],
         lambda: megatron.core.transformer.torch_norm.WrappedTorchNorm(bridge.config, 64),
         lambda norm, _: None if all(getattr(p, "sequence_parallel", False) for p in norm.parameters())
         else "norm parameters not marked sequence_parallel")

    bare = step(results, "get_model", ["get_model"],
                lambda: bridge.get_model(wrap_with_ddp=False, fp16=False, bf16=False))
    if bare is None:
        return
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True)
    model = step(results, "grad_buffer", ["grad_buffer"],
                 lambda: [DistributedDataParallel(bridge.config, ddp, bare[0])])
    if model is None:
        return
    step(results, "norm_names", ["norm_names"], lambda: bridge.load_weights(model, model_dir))

    # the padded bshd batch verl builds: right padding, a (batch, seq) mask of real tokens
    hf = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    torch.manual_seed(0)
    ids = torch.randint(3, hf_config.vocab_size, (2, 8))
    valid = torch.ones(2, 8, dtype=torch.bool)
    valid[1, 5:] = False
    ids = ids * valid
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=valid.long()).logits

    def megatron_logits() -> Any:
        model[0].eval()
        with torch.no_grad():
            out = model[0](input_ids=ids, position_ids=torch.arange(8).expand(2, 8), attention_mask=valid)
        return tensor_parallel.gather_from_tensor_model_parallel_region(out)[..., : hf_config.vocab_size]

    def same_logits(got: Any, _: bool) -> str | None:
        err = (got[valid] - want[valid]).abs().max().item()
        return None if err < 1e-3 else f"logits differ from transformers' by {err:.3g}"

    # sequence parallel gathers and scatters through these: the first forward needs them too
    step(results, "sp_mappings", ["sp_mappings"], megatron_logits)
    step(results, "rope", ["rope"], megatron_logits)
    step(results, "memory_buffer", ["memory_buffer"], megatron_logits)
    step(results, "attention_mask", ["attention_mask"], megatron_logits, same_logits)

    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=True, clip_grad=1.0, bf16=False)
    optimizer = step(results, "optimizers", ["optimizer", "distrib_optimizer"],
                     lambda: get_megatron_optimizer(config, model))
    if optimizer is None:
        return
    # a job resuming from a dist checkpoint asks a fresh optimizer for its state dict before loading
    fresh = [p.detach().clone() for p in model[0].parameters()]
    step(results, "resume_state", ["resume_state"], lambda: optimizer.state_dict(),
         lambda sd, patched: None if not patched or all(torch.equal(a, p) for a, p in zip(fresh, model[0].parameters()))
         else "the weights moved")
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    model[0].config.finalize_model_grads_func = finalize_model_grads  # as verl's training hooks set it

    def loss_step(model: Any = model, optimizer: Any = optimizer) -> Any:
        def forward_step(_: Any, module: Any) -> Any:
            out = module(input_ids=ids, position_ids=torch.arange(8).expand(2, 8), attention_mask=valid)
            return out, lambda o: (o.float().pow(2).mean(), {})

        model[0].train()
        model[0].zero_grad_buffer()
        optimizer.zero_grad()
        get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter([None]), model=model,
                                    num_microbatches=1, seq_length=8, micro_batch_size=2, forward_only=False)
        return optimizer.step()

    step(results, "schedules", ["schedules"], lambda: get_forward_backward_func()(
        forward_step_func=lambda _, m: (m(input_ids=ids, position_ids=torch.arange(8).expand(2, 8),
                                          attention_mask=valid), lambda o: (o.float().mean(), {})),
        data_iterator=iter([None]), model=model, num_microbatches=1, seq_length=8, micro_batch_size=2,
        forward_only=True))
    before = [p.detach().clone() for p in model[0].parameters()]
    step(results, "sp_layers", ["sp_layers"], loss_step)
    stepped = step(results, "clip_grads", ["clip_grads"], loss_step)
    moved = sum((a - p.detach()).abs().sum().item() for a, p in zip(before, model[0].parameters()))
    results["clip_grads"]["update"] = {"ok": bool(stepped and stepped[0]), "grad_norm": stepped[1] if stepped else None,
                                       "moved": moved}
    # the norm's gradients were all-reduced over TP: both ranks hold the same norm weights after the step
    norm = [p for n, p in model[0].named_parameters() if "input_layernorm" in n][0].detach().clone()
    others = [torch.zeros_like(norm) for _ in range(TP)]
    torch.distributed.all_gather(others, norm)
    results["sp_norm"]["same_on_tp_ranks"] = all(torch.equal(others[0], o) for o in others)

    # Megatron's dist checkpoint through verl's own save/load functions (what verl writes at each save_freq)
    import megatron.core.dist_checkpointing.strategies.filesystem_async  # noqa: F401
    from verl.utils.megatron.dist_checkpointing import load_dist_checkpointing, save_dist_checkpointing

    tries = iter(range(10))

    def save_and_load() -> Any:
        folder = Path(out_dir, f"dist_ckpt_{next(tries)}")
        if rank == 0:
            folder.mkdir()
        torch.distributed.barrier()
        save_dist_checkpointing(model[0].sharded_state_dict(), str(folder))
        torch.distributed.barrier()
        return load_dist_checkpointing(model[0].sharded_state_dict(), str(folder))

    def same_weights(loaded: Any, _: bool) -> str | None:
        mine = model[0].sharded_state_dict()
        bad = [k for k, v in loaded.items() if hasattr(v, "shape") and k in mine
               and not torch.equal(v, mine[k].data)]
        return None if not bad and loaded else f"loaded weights differ: {bad[:3]}"

    step(results, "dist_ckpt", ["dist_ckpt"], save_and_load, same_weights)

    # A resume: the optimizer's dist checkpoint as verl writes and reads it (dp_reshardable), loaded into a fresh model
    # and optimizer holding the saved weights, must take the step the uninterrupted run takes from there.
    metadata = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False,
                "chained_optim_avoid_prefix": True}
    optim_dir = Path(out_dir, "optim_ckpt")
    if rank == 0:
        optim_dir.mkdir()
    torch.distributed.barrier()
    save_dist_checkpointing({"optimizer": optimizer.sharded_state_dict(
        model[0].sharded_state_dict(metadata=metadata), metadata=metadata)}, str(optim_dir), content_metadata=metadata)
    saved = [p.detach().clone() for p in model[0].parameters()]
    saved_step = float(adam_steps(optimizer)[0])
    loss_step()
    want = [p.detach().clone() for p in model[0].parameters()]

    def resumed() -> dict[str, Any]:
        fresh_model = [DistributedDataParallel(bridge.config, ddp, bridge.get_model(
            wrap_with_ddp=False, fp16=False, bf16=False)[0])]
        fresh_model[0].config.finalize_model_grads_func = finalize_model_grads
        with torch.no_grad():
            for p, v in zip(fresh_model[0].parameters(), saved):
                p.copy_(v)
        fresh = get_megatron_optimizer(config, fresh_model)
        sharded = {"optimizer": fresh.sharded_state_dict(fresh_model[0].sharded_state_dict(metadata=metadata),
                                                         is_loading=True, metadata=metadata)}
        loaded = load_dist_checkpointing(sharded, str(optim_dir))
        with torch.no_grad():  # fp32 main params are views of the model's here (verl's bf16 models keep copies)
            fresh.load_state_dict(loaded["optimizer"])
        steps = adam_steps(fresh)
        after_load, tensors = [float(t) for t in steps], len({id(t) for t in steps})
        loss_step(fresh_model, fresh)
        apart = max((a - p.detach()).abs().max().item() for a, p in zip(want, fresh_model[0].parameters()))
        return {"saved": saved_step, "after_load": after_load, "tensors": tensors, "apart": apart}

    runs: list[dict[str, Any]] = []

    def same_step(got: dict[str, Any], _: bool) -> str | None:
        runs.append(got)
        return None if got["apart"] == 0 else (
            f"a resumed step is {got['apart']:.3g} from the uninterrupted one (Adam's step after the load: "
            f"{sorted(set(got['after_load']))} in {got['tensors']} tensor(s) for {len(got['after_load'])} parameters, "
            f"saved {got['saved']})")

    step(results, "resume_step", ["resume_step"], resumed, same_step)
    results["resume_step"]["runs"] = runs  # unpatched, then patched
    exported = dict(bridge.export_weights(model))  # what verl sends to vLLM and writes as Hugging Face weights
    results["norm_names"]["exported"] = sorted(n for n in exported if "layernorm" in n)


if __name__ == "__main__":
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(rank_main, args=(sys.argv[1], sys.argv[2], free), nprocs=TP, join=True)
    print("\n" + json.dumps([json.loads(Path(sys.argv[2], f"rank{r}.json").read_text()) for r in range(TP)]))
