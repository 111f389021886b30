"""Which cluster profile a command means when the user typed none.

Order: `cluster=` on the command line, then $HPC_GRPO_CLUSTER, then `cluster:` in the user's config file
($XDG_CONFIG_HOME/hpc-grpo/config.yaml, default ~/.config/hpc-grpo/config.yaml), then the profile whose
`slurm_cluster_name` is the ClusterName of the Slurm this machine talks to (asked through hpc_grpo.cluster.slurm), else
`local`. The answer carries why, so the CLI can say it: a job on the wrong cluster is an expensive surprise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hpc_grpo.config import registry
from hpc_grpo.common.yamlio import SpecError, load_yaml_file

ENV_VAR = "HPC_GRPO_CLUSTER"
FALLBACK = "local"
CONFIG_KEYS = ("cluster",)


@dataclass(frozen=True, slots=True)
class ClusterChoice:
    name: str
    why: str


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "hpc-grpo" / "config.yaml"


def config_default(path: Path | None = None) -> str | None:
    """`cluster:` from the user's config file; None when the file or the key is absent."""
    path = path or config_path()
    if not path.is_file():
        return None
    data, _ = load_yaml_file(path)
    if not isinstance(data, dict):
        raise SpecError("the config file must be a mapping such as `cluster: NAME`", key="config", where=str(path))
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise SpecError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(CONFIG_KEYS)}", key=unknown[0],
                        where=str(path))
    value = data.get("cluster")
    return str(value) if value else None


def profile_for_slurm(cluster_name: str) -> str | None:
    """The profile whose slurm_cluster_name is this ClusterName (first by name if several claim it)."""
    from hpc_grpo.config.resolve import load_raw

    for name in registry.list_names("clusters"):
        try:
            data, _ = load_raw("clusters", name)
        except SpecError:
            continue
        if data.get("slurm_cluster_name") == cluster_name:
            return name
    return None


def choose_cluster(given: str | None) -> ClusterChoice:
    if given:
        return ClusterChoice(given, "cluster= on the command line")
    if os.environ.get(ENV_VAR):
        return ClusterChoice(os.environ[ENV_VAR], f"${ENV_VAR}")
    path = config_path()
    default = config_default(path)
    if default:
        return ClusterChoice(default, f"the default in {path}")
    from hpc_grpo.cluster import slurm

    slurm_name = slurm.cluster_name()
    if slurm_name is None:
        return ClusterChoice(FALLBACK, "no cluster= given and no Slurm answers on this machine")
    profile = profile_for_slurm(slurm_name)
    if profile:
        return ClusterChoice(profile, f"this machine's Slurm is ClusterName={slurm_name}, the slurm_cluster_name of "
                             f"profile {profile}")
    return ClusterChoice(FALLBACK, f"this machine's Slurm (ClusterName={slurm_name}) matches no profile's "
                         f"slurm_cluster_name; set it in one, or pass cluster= / ${ENV_VAR}")
