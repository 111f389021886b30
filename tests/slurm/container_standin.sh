#!/bin/bash
# A test double for pyxis (srun --container-image), for tests on the slurm-dev cluster only: it is no container
# runtime and isolates nothing but the file system view. Set as a profile's setup.container_launcher, srun runs
#   container_standin.sh --container-image=IMAGE --container-mounts=SRC:DST[:ro],... --no-container-mount-home -- CMD...
# and CMD runs, in a fresh mount namespace (root only: unshare -m), under a new root that holds what a stock image
# holds here (the host's /usr, /etc, /var, /opt and the /bin, /lib links; /dev, /proc, /sys) and, of everything
# else (/home, /root, /work, /tmp, /run ...), only the listed mounts, at their DST. As in an image without Slurm's
# client, sbatch, srun, scontrol, squeue, sacct and the rest fail there with "command not found". The IMAGE is
# not read: the host's system folders stand in for it.
set -euo pipefail

if [ "${1:-}" != --inside ]; then
  mounts=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --container-image=*|--no-container-mount-home) ;;
      --container-mounts=*) mounts=${1#*=} ;;
      --) shift; break ;;
      *) echo "container stand-in: unknown option $1" >&2; exit 2 ;;
    esac
    shift
  done
  [ $# -gt 0 ] || { echo "container stand-in: no command after --" >&2; exit 2; }
  exec unshare --mount --propagation private -- "$0" --inside "$mounts" "$@"
fi
shift
mounts=$1
shift

root=/run/hpc-grpo-container-standin  # one mount point; every namespace puts its own tmpfs over it
mkdir -p "$root"
mount -t tmpfs -o mode=755 standin "$root"
for d in usr etc var opt dev proc sys; do
  if [ -d "/$d" ]; then
    mkdir "$root/$d"
    mount --rbind "/$d" "$root/$d"
  fi
done
for l in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$l" ]; then
    ln -s "$(readlink "/$l")" "$root/$l"
  elif [ -d "/$l" ]; then
    mkdir "$root/$l"
    mount --rbind "/$l" "$root/$l"
  fi
done
mkdir -m 1777 "$root/tmp"
mkdir "$root/run"

IFS=, read -ra entries <<< "$mounts"
for entry in "${entries[@]}"; do
  IFS=: read -r src dst flag <<< "$entry"
  dst=${dst:-$src}
  if [ -d "$src" ]; then
    mkdir -p "$root$dst"
  else
    mkdir -p "$(dirname "$root$dst")"
    touch "$root$dst"
  fi
  mount --rbind "$src" "$root$dst"
  if [ "${flag:-rw}" = ro ]; then
    mount -o remount,bind,ro "$root$dst"
  fi
done

# No Slurm client in the image.
absent="$root/.slurm-client-absent"
# shellcheck disable=SC2016  # $0 is expanded by the stub when it runs, not here
printf '#!/bin/sh\necho "${0##*/}: command not found (no Slurm client in this container image)" >&2\nexit 127\n' > "$absent"
chmod 755 "$absent"
for cmd in sbatch srun salloc scontrol squeue sacct scancel sinfo sacctmgr sstat sattach; do
  for dir in /usr/bin /usr/sbin /usr/local/bin; do
    if [ -e "$root$dir/$cmd" ]; then
      mount --bind "$absent" "$root$dir/$cmd"
    fi
  done
done

exec chroot "$root" /bin/sh -c 'cd / && exec "$@"' container-standin "$@"
