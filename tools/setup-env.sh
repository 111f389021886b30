#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv. Idempotent.
#   bash tools/setup-env.sh          # the local engine: torch, transformers, peft, trl (CPU or one GPU node),
#                                    # lm-eval for the GSM8K evaluation, matplotlib for `hpc-grpo report`
#   bash tools/setup-env.sh dev      # + test tools, ray, and verl's config files for schema checks
# On a machine without an NVIDIA GPU, torch 2.13.0's CPU build is installed first: anything that asks for plain
# `torch` otherwise downloads a CUDA build of several GB.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${HPC_GRPO_VENV:-$root/.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "hpc-grpo: creating $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar on)

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "hpc-grpo: no NVIDIA GPU here: installing torch 2.13.0 (CPU build) first"
  "${pip[@]}" "torch==2.13.0"
fi

extras="local,eval,report"
if [ "${1:-}" = "dev" ]; then
  extras="local,eval,report,dev,verl-schema"
fi
echo "hpc-grpo: installing hpc-grpo[$extras]"
"${pip[@]}" -e "${root}[${extras}]"
if [ "${1:-}" = "dev" ]; then
  # verl's Hydra YAMLs for the schema check; --no-deps: the full verl pulls ray/vllm/CUDA and needs transformers < 5.11
  "${pip[@]}" --no-deps "verl==0.9.1"
fi
echo "hpc-grpo: environment ready: source $venv/bin/activate"
