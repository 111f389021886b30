#!/usr/bin/env bash
# Stop the slurm-dev cluster started by tools/slurm-dev/start.sh. Idempotent.
#
#   bash tools/slurm-dev/stop.sh            # cancel jobs, stop every daemon, keep the state folder
#   bash tools/slurm-dev/stop.sh --purge    # ... and delete the state folder (configs, database, logs)
#
# Each daemon is stopped by the PID in its own pid file (never by name): TERM, wait with a deadline, then KILL
# for that PID only. Order: jobs, slurmd (before slurmctld: a slurmd whose controller is gone ignores TERM),
# slurmctld, slurmdbd, mariadbd, munged.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DIR="${SLURM_DEV_DIR:-$REPO_ROOT/.slurm-dev}"
NODES=(node1 node2 node3 node4)
PURGE=0

for arg in "$@"; do
    case $arg in
        --purge) PURGE=1 ;;
        -h | --help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
    esac
done

T0=${EPOCHREALTIME/./}
log() { local us=$((${EPOCHREALTIME/./} - T0)); printf '[slurm-dev %3d.%01ds] %s\n' $((us / 1000000)) $((us / 100000 % 10)) "$*"; }

read_pid() { # read_pid PIDFILE -> prints the PID if the file names a live process of the daemon it is named after
    # (slurmd-node1.pid -> slurmd): a stale file whose PID now belongs to another process does not count.
    local pid name
    [[ -s $1 ]] || return 1
    pid=$(tr -dc '0-9' <"$1")
    name=$(basename "$1" .pid)
    name=${name%%-*}
    [[ -n $pid && -r /proc/$pid/comm && $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]] || return 1
    ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null || return 1
    echo "$pid"
}

running() { # running PID: alive and not a zombie (an orphan's zombie lingers until PID 1 reaps it)
    kill -0 "$1" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

stop_pid() { # stop_pid NAME PIDFILE [SECONDS]: TERM, wait, KILL
    local name=$1 file=$2 secs=${3:-15} pid end
    pid=$(read_pid "$file") || { rm -f "$file"; return 0; }
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    end=$(($(date +%s) + secs))
    while running "$pid"; do
        if [[ $(date +%s) -ge $end ]]; then
            log "$name (pid $pid) still running after ${secs}s: KILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.2
            break
        fi
        sleep 0.1
    done
    rm -f "$file"
}

if [[ ! -d $DIR ]]; then
    log "nothing to stop: no $DIR"
    exit 0
fi
export SLURM_CONF="$DIR/etc/slurm.conf"

# Jobs first, while slurmctld and slurmd can still kill them cleanly.
if read_pid "$DIR/run/slurmctld.pid" >/dev/null && [[ -f $SLURM_CONF ]]; then
    mapfile -t jobs < <(timeout 10 squeue -h -o %A 2>/dev/null | sort -u || true)
    if [[ ${#jobs[@]} -gt 0 ]]; then
        log "cancelling ${#jobs[@]} job(s) of any user"
        timeout 10 scancel --quiet "${jobs[@]}" 2>/dev/null || true
        end=$(($(date +%s) + 20))
        while [[ -n $(timeout 5 squeue -h -o %i 2>/dev/null || true) && $(date +%s) -lt $end ]]; do sleep 0.3; done
    fi
fi

for n in "${NODES[@]}"; do stop_pid "slurmd $n" "$DIR/run/slurmd-$n.pid" 10 & done
wait
stop_pid slurmctld "$DIR/run/slurmctld.pid" 15
stop_pid slurmdbd "$DIR/run/slurmdbd.pid" 15
stop_pid mariadbd "$DIR/run/mariadbd.pid" 30 &
stop_pid munged "$DIR/run/munged.pid" 10 &
wait

if [[ $PURGE -eq 1 ]]; then
    # Only ever delete a folder that start.sh made.
    [[ -e $DIR/.start.lock ]] || { echo "slurm-dev: refusing to purge $DIR: no .start.lock, not a slurm-dev folder" >&2; exit 1; }
    log "removing $DIR"
    rm -rf -- "$DIR"
fi
log "stopped"
