"""Plan and verl's runtime side by side: for each case typed as a user types it (CLI overrides on the tiny-verl recipe),
plan's verdict next to verl's runtime verdict, the latter from verl's and peft's own code in `.venv-verl`
(tests/unit/verl_runtime_probe.py: Hydra, omega_conf_to_dataclass on the nodes verl's workers convert, peft at
model load, verl's policy loss and update iterator). The verdicts must agree; a valid recipe passes both.

One case is stricter in plan on purpose, and the test says so: `actor.clip_ratio=abc`. verl's vanilla loss reads
clip_ratio but uses clip_ratio_low/high (both set in verl's YAML), so the string never reaches arithmetic there;
it does in the loss modes that use clip_ratio itself, and `clip_ratio_low=abc` fails verl's first update.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ONE_THREAD

from hpc_grpo.cli import app as cli
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.engines.verl import VerlEngine
from hpc_grpo.engines.verl_schema import verl_config_dir
from hpc_grpo.evaluation import export

PROBE = Path(__file__).with_name("verl_runtime_probe.py")
REPO = Path(__file__).resolve().parents[2]
RECIPE = "tiny-verl"

# name: (the user's overrides, plan's expected verdict, the key plan names, verl's failing stage or "" for none)
# plan verdicts: "refused" (an error finding), "never updates" (a warning, no error), "ok"
CASES: dict[str, tuple[list[str], str, str, str]] = {
    "valid recipe": ([], "ok", "", ""),
    "megatron key on FSDP (the '+' plan's Hydra fix advised)":
        (["+actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"], "refused",
         "engine.actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "dataclass"),
    "misspelt field with '+'": (["+actor_rollout_ref.actor.clip_ratio_hgh=0.28"], "refused",
                                "engine.actor_rollout_ref.actor.clip_ratio_hgh", "dataclass"),
    "string for a float verl computes with": (["actor_rollout_ref.actor.clip_ratio_low=abc"], "refused",
                                              "engine.actor_rollout_ref.actor.clip_ratio_low", "first update"),
    "ppo_epochs 0": (["actor_rollout_ref.actor.ppo_epochs=0"], "never updates",
                     "engine.actor_rollout_ref.actor.ppo_epochs", ""),
    "LoRA target the model lacks": (["lora.target_modules=[nonexistent_proj]"], "refused", "lora.target_modules",
                                    "model load"),
    "LoRA target that is a norm layer": (["lora.target_modules=[q_proj,input_layernorm]"], "refused",
                                         "lora.target_modules", "model load"),
    "LoRA targets, one missing (peft ignores it)": (["lora.target_modules=[q_proj,nonexistent_proj]"], "ok",
                                                    "lora.target_modules", ""),
    # refused by plan before, though verl runs them: each typed in verl's own words
    "verl's own data key": (["data.return_raw_chat=True"], "ok", "", ""),
    "a list of data files": (["data.train_files=[/nonexistent/gsm8k.parquet,/nonexistent/math.parquet]"], "ok", "", ""),
    "KL in the reward, by verl's name": (["algorithm.use_kl_in_reward=True"], "ok", "", ""),
    "a modelled key, by verl's name": (["actor_rollout_ref.rollout.n=4"], "ok", "", ""),
    "a key hpc-grpo sets, equal to its value": (["trainer.nnodes=1"], "ok", "", ""),
}
STRICTER = (["actor_rollout_ref.actor.clip_ratio=abc"], "engine.actor_rollout_ref.actor.clip_ratio")


def verl_python() -> str:
    """.venv-verl's interpreter; skip (printing why) without it, fail in CI, where it must exist."""
    python = export.verl_python()
    if python == sys.executable or not Path(python).exists():
        reason = ("no .venv-verl with full verl (bash tools/setup-env.sh verl builds it; HPC_GRPO_VERL_PYTHON "
                  "names another): verl's runtime verdict cannot be had")
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        print(f"SKIP: {reason}", file=sys.stderr)
        pytest.skip(reason)
    return python


def plan_verdict(monkeypatch, capsys, model: Path, overrides: list[str]) -> tuple[str, list[dict]]:
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "plan", f"recipe={RECIPE}", "cluster=local", f"model.path={model}",
                                      "cluster.runs_root=/nonexistent/runs", *overrides, "--json"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    out = capsys.readouterr().out
    findings = json.loads(out)["findings"]
    assert exc.value.code in (0, 1), out
    if any(f["severity"] == "error" for f in findings):
        return "refused", findings
    if any(f["severity"] == "warning" and f["key"].endswith(".ppo_epochs") for f in findings):
        return "never updates", findings
    return "ok", findings


def runtime_verdicts(model: Path, cases: dict[str, list[str]]) -> dict[str, dict]:
    python = verl_python()
    request: dict = {"cases": {}}
    for name, overrides in cases.items():
        spec = resolve_spec(RECIPE, "local", [f"model.path={model}", "cluster.runs_root=/nonexistent/runs", *overrides],
                            run_name="t")
        cmd = VerlEngine().command(spec)
        request["config_name"], request["cases"][name] = cmd.config_name, cmd.overrides
    env = {**os.environ, "PYTHONPATH": str(REPO), **ONE_THREAD, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([python, str(PROBE)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    return ensure_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen2")


@pytest.mark.skipif(verl_config_dir() is None, reason="verl's config files are not installed: plan checks no schema")
def test_plan_and_verl_runtime_agree(isolated, monkeypatch, capsys, tiny_model: Path) -> None:
    runtime = runtime_verdicts(tiny_model, {name: case[0] for name, case in CASES.items()}
                               | {"stricter": STRICTER[0], "no plus": [STRICTER[0][0].replace("clip_ratio=abc", "clip_ratio_hgh=1")]})
    # the probe's Hydra stage is real: the same typo without '+' is refused there, before any dataclass
    assert runtime["no plus"]["stage"] == "hydra" and "clip_ratio_hgh" in runtime["no plus"]["message"], runtime["no plus"]
    rows = []
    for name, (overrides, expected, key, stage) in CASES.items():
        verdict, findings = plan_verdict(monkeypatch, capsys, tiny_model, overrides)
        got = runtime[name]
        rows.append(f"{name:48} plan={verdict:13} verl={'ok' if got['ok'] else 'fails at ' + got['stage']}")
        assert verdict == expected, (name, [f for f in findings if f["severity"] != "info"])
        assert got["stage"] == stage, (name, got)
        if key:
            named = [f for f in findings if f["key"] == key and f["severity"] in ("error", "warning")]
            assert named and named[0]["fix"], (name, findings)
        if stage == "dataclass":  # plan quotes the very TypeError verl's instantiate raises
            bad = key.rsplit(".", 2)[-2] if "megatron" in key else key.rsplit(".", 1)[-1]
            assert f"unexpected keyword argument '{bad}'" in got["message"], got
            assert f"unexpected keyword argument '{bad}'" in named[0]["message"], named
        if expected == "never updates":
            assert got["ok"] and got["updates"] == 0, got  # verl runs, and its iterator yields no update
        elif expected == "ok":
            assert got["ok"] and got["updates"] > 0, got
    verdict, findings = plan_verdict(monkeypatch, capsys, tiny_model, STRICTER[0])
    assert verdict == "refused" and any(f["key"] == STRICTER[1] for f in findings), findings
    assert runtime["stricter"]["ok"], runtime["stricter"]  # the documented difference (see the module doc)
    with capsys.disabled():
        print("\n" + "\n".join(rows))

