"""Run by tests/unit/test_verl_runtime_parity.py in `.venv-verl` (the full pinned verl with torch): verl's own runtime
verdict on a rendered override list, without GPUs or Ray. Reads {"config_name", "cases": {name: overrides}} as
JSON from stdin and prints {name: verdict} as one JSON line.

For each case, the stages a job meets, in order, each with verl's or peft's own code:
  hydra       compose the overrides against verl's config (as main_ppo's @hydra.main does)
  dataclass   omega_conf_to_dataclass on the nodes verl's workers convert (engine_workers.init_model: model,
              actor, ref when a reference policy is used, with its log_prob_* keys renamed as verl does; rollout)
  model load  with LoRA on, peft's get_peft_model on the model folder with the converted model config's targets
              (what verl's FSDP worker calls)
  first update  verl's policy loss (the actor config's loss mode) on small tensors, and the number of
              mini-batch updates verl's make_iterator yields for one batch with the config's ppo_epochs
A verdict is {"ok": bool, "stage": the failing stage or "", "message": the exception, "updates": n}.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings

warnings.simplefilter("ignore")

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from omegaconf import open_dict  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402
from verl.trainer.ppo.utils import need_reference_policy  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.utils.tensordict_utils import make_iterator  # noqa: E402

from hpc_grpo.engines.verl_dataclasses import REF_RENAMES  # noqa: E402

FOLDER = list(importlib.util.find_spec("verl").submodule_search_locations)[0] + "/trainer/config"


def fail(stage: str, exc: BaseException) -> dict:
    return {"ok": False, "stage": stage, "message": f"{type(exc).__name__}: {exc}"[:2000], "updates": None}


def verdict(config_name: str, overrides: list[str]) -> dict:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=FOLDER, version_base=None):
            cfg = compose(config_name=config_name, overrides=overrides)
    except Exception as exc:  # noqa: BLE001 - any refusal is the verdict
        return fail("hydra", exc)
    finally:
        GlobalHydra.instance().clear()
    arr = cfg.actor_rollout_ref
    try:
        model = omega_conf_to_dataclass(arr.model)
        if need_reference_policy(cfg):
            with open_dict(arr.ref):
                arr.ref.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
                for old, new in REF_RENAMES.items():
                    arr.ref[new] = arr.ref.pop(old, None)
            omega_conf_to_dataclass(arr.ref)
        actor = omega_conf_to_dataclass(arr.actor)
        omega_conf_to_dataclass(arr.rollout)
    except Exception as exc:  # noqa: BLE001
        return fail("dataclass", exc)
    if model.lora_rank:
        try:
            from peft import LoraConfig, get_peft_model
            from transformers import AutoModelForCausalLM

            targets = model.target_modules
            targets = targets if isinstance(targets, str) else list(targets)
            get_peft_model(AutoModelForCausalLM.from_pretrained(model.path),
                           LoraConfig(r=model.lora_rank, lora_alpha=model.lora_alpha, target_modules=targets))
        except Exception as exc:  # noqa: BLE001
            return fail("model load", exc)
    try:
        torch.manual_seed(0)
        old = torch.randn(4, 6)
        loss_fn = get_policy_loss_fn(actor.policy_loss.loss_mode)
        loss_fn(old, old + 0.1 * torch.randn(4, 6), torch.randn(4, 6), torch.ones(4, 6), actor.loss_agg_mode, actor)
        batch = TensorDict({"x": torch.zeros(4, 1)}, batch_size=[4])
        updates = sum(1 for _ in make_iterator(batch, mini_batch_size=2, epochs=actor.ppo_epochs, seed=0))
    except Exception as exc:  # noqa: BLE001
        return fail("first update", exc)
    return {"ok": True, "stage": "", "message": "", "updates": updates}


def main() -> None:
    request = json.load(sys.stdin)
    out = {name: verdict(request["config_name"], ov) for name, ov in request["cases"].items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
