"""Run in `.venv-verl` by test_verl_values_parity: verl's and vLLM's own code judge each value.

Reads a JSON list of [key, value] on stdin, prints {key=value: "ok" | "refused: <the runtime's message>"} as JSON.
verl: agg_loss (the loss aggregation), get_adv_estimator_fn, get_policy_loss_fn, kl_penalty, and the dual-clip
assert of compute_policy_loss_vanilla; vLLM: SamplingParams' own checks. Clip ratios are fed to verl's vanilla
loss to show what it does with them (it runs)."""

from __future__ import annotations

import json
import sys


def judge(key: str, value: object) -> str:
    import torch

    from verl.trainer.ppo import core_algos

    leaf = key.rsplit(".", 1)[-1]
    try:
        if leaf == "loss_agg_mode":
            core_algos.agg_loss(torch.ones(2, 3), torch.ones(2, 3), value, global_batch_size=2, batch_num_tokens=6)
        elif leaf == "adv_estimator":
            core_algos.get_adv_estimator_fn(value)
        elif leaf == "loss_mode":
            core_algos.get_policy_loss_fn(value)
        elif leaf in ("kl_loss_type", "kl_penalty"):
            core_algos.kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), value)
        elif leaf in ("top_p", "top_k", "temperature", "min_p"):
            from vllm import SamplingParams

            SamplingParams(**{leaf: value})
        elif leaf == "max_response_length":
            from vllm import SamplingParams

            SamplingParams(max_tokens=value)
        else:
            return f"unknown key {key}"
    except Exception as exc:  # noqa: BLE001 - the runtime's refusal, whatever its class
        return f"refused: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return "ok"


def main() -> None:
    cases = json.load(sys.stdin)
    print(json.dumps({f"{k}={v}": judge(k, v) for k, v in cases}))


if __name__ == "__main__":
    main()
