#!/usr/bin/env bash
# The README's main job: from a fresh clone, train the tiny-gsm8k recipe end to end on this machine (cluster=local,
# CPU is enough), evaluate it on GSM8K with lm-eval, and draw its report (runs/NAME/report.png). Idempotent: run it again and it makes a new run.
#   bash tools/quickstart.sh [key=value ...]        # extra recipe overrides, e.g. train.total_training_steps=8
# GSM8K comes from ../shared/data/gsm8k when that folder exists (offline machines), else from the Hugging Face Hub
# (GSM8K_SOURCE=hf|FOLDER overrides the choice).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/tools/setup-env.sh"
# shellcheck disable=SC1091  # created by setup-env.sh
source "$root/.venv/bin/activate"

data_dir="${HPC_GRPO_DATA:-$HOME/hpc-grpo-data}/gsm8k"
source_dir="${GSM8K_SOURCE:-}"
if [ -z "$source_dir" ]; then
  if [ -f "$root/../shared/data/gsm8k/train.jsonl" ]; then source_dir="$root/../shared/data/gsm8k"; else source_dir=hf; fi
fi
if [ ! -f "$data_dir/trl/train.jsonl" ] || [ ! -f "$data_dir/source.json" ]; then
  hpc-grpo data gsm8k --source "$source_dir" --out "$data_dir"
fi
export WANDB_MODE="${WANDB_MODE:-offline}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
cd "$root"
name="tiny-gsm8k-$(date +%Y%m%d-%H%M%S)"
# On cluster=local the job trains, then evaluates the newest checkpoint with lm-eval's gsm8k (recipe eval section:
# 10 test problems, 0-shot), beside the base model.
hpc-grpo submit recipe=tiny-gsm8k cluster=local --name "$name" \
  "data.train_files=$data_dir/trl/train.jsonl" "data.val_files=$data_dir/trl/test.jsonl" "$@"
hpc-grpo report "runs/$name"
echo
echo "hpc-grpo: the run, its logs and report: runs/$name (data: $data_dir, the tiny model: ~/.cache/hpc-grpo)"
echo "hpc-grpo: to have the hpc-grpo command in your shell, run:  source $root/.venv/bin/activate"
