"""Run by tests/unit/test_verl_cpu.py in `.venv-verl` (the full pinned verl): what verl sees with hpc-grpo's CPU plugin
loaded, and what the HF rollout server samples before and after a LoRA update. Prints one JSON object."""

from __future__ import annotations

import asyncio
import json
import os
import sys

os.environ["VERL_USE_EXTERNAL_MODULES"] = "hpc_grpo.engines.verl_cpu"
os.environ["VERL_PLATFORM"] = "hpc_grpo_cpu"

import torch  # noqa: E402
import verl  # noqa: E402,F401  (imports the plugin, as in every verl process)
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from verl.utils.device import get_device_id, get_device_name, get_nccl_backend, get_torch_device  # noqa: E402
from verl.workers.rollout.base import get_rollout_class  # noqa: E402
from verl.workers.rollout.replica import RolloutReplicaRegistry  # noqa: E402

from hpc_grpo.engines.verl_hf_rollout import HFServer  # noqa: E402

model_dir = sys.argv[1]
out: dict = {
    "device": get_device_name(),
    "backend": get_nccl_backend(),
    "device_id": get_device_id(),
    "memory_allocated": get_torch_device().memory_allocated(),
    "device_label": get_torch_device().get_device_name(),
    "adapter_class": get_rollout_class("hf", "async").__qualname__,
    "replica_class": RolloutReplicaRegistry.get("hf").__qualname__,
}
# gloo takes verl's backend string once the duplicate device is dropped
import torch.distributed as dist  # noqa: E402

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29555")
dist.init_process_group(backend=f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}", rank=0, world_size=1)
out["pg_backend"] = str(dist.get_backend())
dist.destroy_process_group()

server = HFServer(model_dir, max_model_len=64, response_length=8)
prompt = [3, 5, 7, 11]
greedy = {"temperature": 0}
before = asyncio.run(server.generate(prompt, greedy, "r1"))
# the log-probs the server reports are the model's own (greedy: softmax of the raw logits)
with torch.no_grad():
    logits = server.model(input_ids=torch.tensor([prompt + before.token_ids])).logits[0]
ref = torch.log_softmax(logits[len(prompt) - 1:-1], -1).gather(1, torch.tensor(before.token_ids)[:, None])[:, 0]
out["logprob_max_err"] = float((ref - torch.tensor(before.log_probs)).abs().max())
out["sampled_len"] = len(asyncio.run(server.generate(prompt, {"temperature": 1.0, "top_p": 0.9, "top_k": 20}, "r2")).token_ids)

# a trained adapter, as verl sends it: peft's state-dict names, B not zero, in bf16; the reference model holds the
# same bf16-rounded values, so what the server computes must match it to float32 rounding, not to bf16's
torch.manual_seed(1)
peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                            LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
for name, p in peft_model.named_parameters():
    if "lora_B" in name:
        p.data.normal_(0, 0.5)
    if "lora_" in name:
        p.data = p.data.to(torch.bfloat16).to(p.dtype)
adapter = {k: v.to(torch.bfloat16) for k, v in get_peft_model_state_dict(peft_model).items()}
cfg = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
       "down_proj"], "task_type": "CAUSAL_LM", "peft_type": "LORA"}  # verl sends the config as a dict
loaded = asyncio.run(server.update_weights(adapter, peft_config=cfg, base_sync_done=True, global_steps=3))
on, off = torch.tensor(server.logits(prompt)), torch.tensor(server.logits(prompt, with_adapter=False))
with torch.no_grad():
    want = peft_model(input_ids=torch.tensor([prompt])).logits[0, -1]
out.update(loaded=loaded, adapter_active=server.adapter_active(), adapter_moves=float((on - off).abs().max()),
           matches_trained=float((on - want).abs().max()))
after = asyncio.run(server.generate(prompt, greedy, "r3"))
out["global_steps"] = after.extra_fields.get("global_steps")
try:  # an adapter whose names match nothing must fail loudly, not sample from the base model
    asyncio.run(server.update_weights({"model.layers.0.nonsense.lora_A.weight": torch.zeros(2, 2)},
                                      peft_config=cfg, base_sync_done=True))
    out["bad_names"] = "accepted"
except RuntimeError as exc:
    out["bad_names"] = str(exc)
print(json.dumps(out))
