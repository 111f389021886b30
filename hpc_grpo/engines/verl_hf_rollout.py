"""An HF-sampling rollout server for verl's CPU mode: the stand-in for vLLM, behind verl's own rollout interfaces.

The pinned verl generates only through a rollout *server* (a Ray actor per replica that the agent loop calls with
token ids) plus an in-worker *adapter* through which the trainer pushes its weights after each update. vLLM needs a
GPU; this server samples with a plain transformers model on the CPU, so everything around generation (the agent
loop, log-probs, rewards, the weight sync, LoRA adapters) is verl's real code. Only sampling speed differs.

Pieces, as verl's vLLM backend has them:
- `HFServer`: the Ray actor. `generate` returns verl's `TokenOutput` (token ids and their log-probs under the
  sampling temperature); `update_weights` loads the trainer's tensors: full weights, or the LoRA base once and then
  the adapter through peft (loading adapter tensors into the plain model would silently keep sampling from the base).
- `HFReplica`: starts one server per replica on the node of the replica's first training worker.
- `HFServerAdapter`: lives in each training worker; every rank walks the weight generator (FSDP gathers shards
  collectively), and the replica's rank 0 sends the tensors to its server.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import ray
import torch

from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

logger = logging.getLogger(__name__)


def server_name(replica_rank: int, suffix: str = "") -> str:
    """The server actor's name: the adapter in the training workers finds its server by it."""
    return f"hpc_grpo_hf_server_{replica_rank}{suffix}"


def _adapter_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """verl's adapter names -> peft's state-dict names (peft adds the adapter name itself)."""
    out = {}
    for name, tensor in state.items():
        key = name if name.startswith("base_model.model.") else f"base_model.model.{name}"
        out[key.replace(".default.", ".")] = tensor
    return out


def _lora_config(peft_config: Any) -> Any:
    """verl sends the adapter's LoraConfig as a plain dict (asdict): rebuild peft's object from its fields."""
    if not isinstance(peft_config, dict):
        return peft_config
    import dataclasses

    from peft import LoraConfig

    names = {f.name for f in dataclasses.fields(LoraConfig)}
    return LoraConfig(**{k: v for k, v in peft_config.items() if k in names and k not in ("peft_type", "runtime_config")})


class HFServer:
    """One replica's sampler: a transformers causal LM on this node's CPU."""

    def __init__(self, model_path: str, max_model_len: int, response_length: int, trust_remote_code: bool = False):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, torch_dtype=torch.float32, trust_remote_code=trust_remote_code
        ).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self.eos_ids = {i for i in [tokenizer.eos_token_id, self.model.config.eos_token_id] if isinstance(i, int)}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids, default=0)
        self.max_model_len = max_model_len
        self.response_length = response_length
        self.global_steps: int | None = None
        self.adapter_loaded = False
        self._lock = asyncio.Lock()

    # --- generation -------------------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       **_: Any) -> TokenOutput:
        limit = sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens") or self.response_length
        limit = min(int(limit), self.max_model_len - len(prompt_ids))
        if limit < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room within max_model_len {self.max_model_len}")
        async with self._lock:  # one sample at a time: the CPU has no spare cores for parallel batches
            ids, logps = await asyncio.to_thread(self._sample, list(prompt_ids), sampling_params, limit)
        return TokenOutput(token_ids=ids, log_probs=logps, stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps})

    @torch.no_grad()
    def _sample(self, prompt: list[int], params: dict[str, Any], limit: int) -> tuple[list[int], list[float]]:
        temperature = float(params.get("temperature") or 0.0)
        top_k = int(params.get("top_k") or -1)
        top_p = float(params.get("top_p") or 1.0)
        out_ids: list[int] = []
        logps: list[float] = []
        past = None
        inp = torch.tensor([prompt])
        for _ in range(limit):
            res = self.model(input_ids=inp, past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits = res.logits[0, -1].float()
            # log-probs as verl's actor computes them: softmax of logits / temperature (raw logits when greedy)
            logp_all = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
            if temperature > 0:
                probs = self._filtered(logp_all.exp(), top_k, top_p)
                tok = int(torch.multinomial(probs, 1))
            else:
                tok = int(torch.argmax(logits))
            out_ids.append(tok)
            logps.append(float(logp_all[tok]))
            if tok in self.eos_ids:
                break
            inp = torch.tensor([[tok]])
        return out_ids, logps

    @staticmethod
    def _filtered(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
        if 0 < top_k < probs.numel():
            kth = torch.topk(probs, top_k).values[-1]
            probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
        if top_p < 1.0:
            sorted_p, idx = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p * sorted_p.sum()
            mask = torch.zeros_like(probs, dtype=torch.bool).scatter(0, idx, keep)
            probs = torch.where(mask, probs, torch.zeros_like(probs))
        return probs / probs.sum()

    # --- weights ----------------------------------------------------------------------------------------------
    async def update_weights(self, state: dict[str, torch.Tensor], peft_config: Any = None,
                             base_sync_done: bool = True, global_steps: int | None = None) -> dict[str, int]:
        async with self._lock:
            loaded = self._load(state, peft_config, base_sync_done)
        if global_steps is not None:
            self.global_steps = global_steps
        return loaded

    def _load(self, state: dict[str, torch.Tensor], peft_config: Any, base_sync_done: bool) -> dict[str, int]:
        state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
        if peft_config is not None and base_sync_done:
            from peft import get_peft_model, set_peft_model_state_dict

            if not self.adapter_loaded:
                self.model = get_peft_model(self.model, _lora_config(peft_config)).eval()
                self.adapter_loaded = True
            result = set_peft_model_state_dict(self.model, _adapter_keys(state))
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            # every adapter weight of the model must have come: a name mismatch would leave B at zero, and the
            # server would go on sampling from the base model without any error (VERL.md)
            missing = [k for k in getattr(result, "missing_keys", []) or [] if "lora_" in k]
            if unexpected or missing:
                raise RuntimeError(f"LoRA update: {len(unexpected)} tensors match no adapter weight "
                                   f"(e.g. {unexpected[:3]}), {len(missing)} adapter weights got none (e.g. {missing[:3]})")
            return {"adapter_tensors": len(state)}
        target = self.model.get_base_model() if self.adapter_loaded else self.model
        result = target.load_state_dict(state, strict=False)
        if result.unexpected_keys:
            raise RuntimeError(f"weight update: {len(result.unexpected_keys)} tensors match no model weight, "
                               f"e.g. {result.unexpected_keys[:3]}")
        return {"tensors": len(state)}

    def adapter_active(self) -> bool:
        """True once the trainer's LoRA adapter is applied (tests compare logits with it on and off)."""
        return self.adapter_loaded

    def logits(self, prompt: list[int], with_adapter: bool = True) -> list[float]:
        with torch.no_grad():
            if self.adapter_loaded and not with_adapter:
                with self.model.disable_adapter():
                    return self.model(input_ids=torch.tensor([prompt])).logits[0, -1].tolist()
            return self.model(input_ids=torch.tensor([prompt])).logits[0, -1].tolist()

    # --- what verl's replica and checkpoint manager call on every backend: nothing to do on a CPU -------------
    async def wake_up(self) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def abort_all_requests(self, reject_request: bool = False) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...


def _local_model_path(model_config: Any) -> str:
    """The replica gets the model section as Hydra left it (a DictConfig): copy a remote path the way verl does."""
    from verl.utils.fs import copy_to_local

    return copy_to_local(model_config.get("local_path") or model_config.path)


class HFReplica(RolloutReplica):
    """One server per replica, pinned to the node of its first training worker (as verl's vLLM replica is)."""

    async def launch_servers(self) -> None:
        node_id = ray.get_runtime_context().get_node_id()
        if self.workers:
            node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        name = server_name(self.replica_rank, self.name_suffix)
        cfg = self.config
        max_len = cfg.max_model_len or (cfg.prompt_length + cfg.response_length)
        server: Any = ray.remote(HFServer).options(  # an actor handle (Ray's types say class or handle)
            name=name,
            num_cpus=0,  # verl's placement groups already hold the node's CPUs; the server shares them
            max_concurrency=self.max_concurrency,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(_local_model_path(self.model_config), int(max_len), int(cfg.response_length),
                 bool(self.model_config.get("trust_remote_code", False)))
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf://{name}"


class HFServerAdapter(BaseRollout):
    """The training worker's side: weights go to the replica's server; sleep and wake are no-ops on a CPU."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        rollout_world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                         * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // rollout_world if replica_rank == -1 else replica_rank
        self.is_leader = rank % rollout_world == 0
        self.sleep_level = 1
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hpc-grpo's HF rollout takes named tensors, not {wire_format!r}")
        # every rank walks the generator: FSDP gathers each full tensor collectively
        state = {name: t.detach().to("cpu").clone() for name, t in weights}
        if self.is_leader:
            await self._server_handle().update_weights.remote(
                state, peft_config=kwargs.get("peft_config"), base_sync_done=kwargs.get("base_sync_done", True),
                global_steps=kwargs.get("global_steps"))

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None
