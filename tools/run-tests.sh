#!/usr/bin/env bash
# The README's test command (and CI's): set up the environment, start the local Slurm cluster, run every test.
#   bash tools/run-tests.sh [pytest args ...]
# Needs root and apt for the Slurm cluster (Debian packages) and shellcheck; elsewhere the Slurm tests skip with
# the reason printed (never in CI, where they fail instead).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
started=$(date +%s)
# The two venvs install side by side: pip works on one core, and one after the other they left the second idle
# (CI run 5: ~4 minutes at 50% idle). .venv-verl is the full verl stack for the verl tests (verl's own main_ppo
# in real jobs); skipped when complete.
verl_setup_log="$(mktemp)"
bash tools/setup-env.sh verl > "$verl_setup_log" 2>&1 &
verl_setup=$!
bash tools/setup-env.sh dev
verl_status=0
wait "$verl_setup" || verl_status=$?
cat "$verl_setup_log"
rm -f "$verl_setup_log"
if [ "$verl_status" != 0 ]; then
  echo "hpc-grpo: setting up .venv-verl failed (exit $verl_status)" >&2
  exit "$verl_status"
fi

if ! command -v shellcheck >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "hpc-grpo: installing shellcheck"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null
fi

# tests/slurm/test_unprivileged.py runs the CLI as an ordinary user (hpcgrpo-user): it must reach this checkout
# (the editable install points at it) and the interpreter behind .venv, which is often pyenv's under /root
# (drwx------). Give others traverse (x, not listing) on the folders above both, and read on the code and the venv.
# tests/unit/test_code_reward_attacks.py runs pytest itself as that user: it reads tests/ and pyproject.toml too.
if [ "$(id -u)" = 0 ]; then
  for d in "$root" "$(dirname "$(readlink -f .venv/bin/python)")"; do
    while [ "$d" != / ]; do
      [ -n "$(find "$d" -maxdepth 0 ! -perm -o=x)" ] && chmod o+x "$d"
      d="$(dirname "$d")"
    done
  done
  find hpc_grpo recipes clusters templates tests pyproject.toml .venv \( -type d ! -perm -o=rx -o ! -type d ! -perm -o=r \) \
    -exec chmod o+rX {} +
fi

started_slurm=0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  bash tools/slurm-dev/start.sh
  started_slurm=1
fi
cleanup() {
  if [ "$started_slurm" = 1 ]; then bash tools/slurm-dev/stop.sh || true; fi
}
trap cleanup EXIT
if [ -f .slurm-dev/env.sh ]; then
  # shellcheck disable=SC1091  # written by tools/slurm-dev/start.sh
  source .slurm-dev/env.sh
fi

export WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# Ray starts its workers, where verl's runs do their work, at niceness 15 (its raylet's RAY_worker_niceness):
# beside the other stream's processes at 0 they got a small share of the 2 cores (CI run 5: the Slurm stream's verl
# runs behind the unit tests, the local verl run behind the Slurm stream's trl jobs). The tests' jobs inherit this.
export RAY_worker_niceness=0
# -rs: every skip prints its reason in the summary
pytest=(.venv/bin/python -m pytest -q -rs -p no:cacheprovider)
lint=(bash -c '.venv/bin/ruff check hpc_grpo && .venv/bin/mypy')  # pyproject's [tool.ruff] and [tool.mypy]
if [ "$#" -gt 0 ]; then  # a developer's own selection: lint, then one pytest run, as asked
  "${lint[@]}"
  "${pytest[@]}" --durations=15 "$@"
  exit
fi

# The whole suite in phases, each timed. Two streams run side by side: the Slurm tests, which wait on the
# scheduler (ticks, grace times, time limits) much of their time, and lint, the unit tests (in parallel, pytest-xdist)
# and the local ones, which fill those waits. They share no port: the local profile's Ray ports are not
# slurm-dev's (cluster.ray_ports). A phase's failure does not stop the others: one run shows every failure. Each
# stream's output is printed when it ends; the table and the total come last.
report="$(mktemp -d)"
echo "setup $(($(date +%s) - started)) 0" > "$report/phases"
run_phase() {
  local name="$1" start status=0
  shift
  start=$(date +%s)
  echo "hpc-grpo: phase $name"
  "$@" || status=$?
  echo "$name $(($(date +%s) - start)) $status" >> "$report/phases"
}
tests_started=$(date +%s)
slurm_stream() {
  run_phase slurm "${pytest[@]}" --durations=15 --junitxml="$report/slurm.xml" tests/slurm
}
unit_local_stream() {
  run_phase lint "${lint[@]}"  # in this stream, not before both: it then overlaps the Slurm tests
  run_phase unit "${pytest[@]}" -n 2 --dist loadgroup --durations=15 --junitxml="$report/unit.xml" tests/unit tests/setup
  run_phase local "${pytest[@]}" --durations=15 --junitxml="$report/local.xml" tests/local
}
slurm_stream > "$report/slurm.log" 2>&1 &
slurm_pid=$!
unit_local_stream > "$report/unit-local.log" 2>&1 &
unit_local_pid=$!
wait "$unit_local_pid" || true
echo "hpc-grpo: unit and local tests"
cat "$report/unit-local.log"
wait "$slurm_pid" || true
echo "hpc-grpo: Slurm tests"
cat "$report/slurm.log"

.venv/bin/python tools/ci_summary.py "$report/phases" "$report" "$(($(date +%s) - started))" \
  "slurm | unit, local: side by side for $(($(date +%s) - tests_started)) s"
! grep -qv ' 0$' "$report/phases"
