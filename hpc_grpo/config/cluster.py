"""Typed cluster profiles: scheduler, partition, node shape, restart mode, the job's environment set-up and the
runs root. Unknown keys fail (hpc_grpo.config.keys names the closest valid one)."""

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from hpc_grpo.common.slurm_time import parse_time_minutes
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config import ray_ports
from hpc_grpo.config.fields import Strict, expand_path, expand_vars, slurm_word
from hpc_grpo.config.mounts import normalise
from hpc_grpo.config.secrets import secret_error, secret_in

PATH_RE = re.compile(r"^[A-Za-z0-9_./@%+=:,~-]+\Z")


class Setup(Strict):
    """Environment set-up before the job runs; each value is quoted into the script."""

    modules: list[str] = Field(default=[], description="environment modules the job loads (`module load`), in order")
    venv: str | None = Field(default=None, description="a Python venv the job activates (its bin/activate)")
    conda: str | None = Field(default=None, description="a conda environment the job activates")
    container: str | None = Field(default=None, description="the image every task runs in (pyxis: srun "
                                  "--container-image); the job's python is then the image's python3")
    mounts: list[str] = Field(default=[], description="with a container: what the job sees of the host besides the "
                              "run directory and shared_paths, each PATH, SRC:DST or SRC:DST:ro; plan checks that the "
                              "model, the data and the job's python are in one")
    container_launcher: str | None = Field(
        default=None, description="a command srun runs instead of handing pyxis its options: it takes the same "
        "--container-* options, then `--` and the task's command (for runtimes pyxis does not drive)")
    python: str | None = Field(default=None, description="the interpreter every in-job step runs (submitit's task, "
                               "Ray's CLI, the drivers); unset: <venv>/bin/python, else python3 of the conda env or "
                               "container, else the interpreter that submitted")

    _expand = field_validator("venv", "conda", "python", "container_launcher")(
        classmethod(lambda cls, v: None if v is None else expand_path(v))
    )

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        return [normalise(m) for m in v]


class Cluster(Strict):
    """One cluster profile: scheduler, partition, node shape, NCCL/network env, scratch root."""

    name: str = Field(description="the profile's name (its file name without .yaml)")
    description: str = Field(default="", description="one line, shown by `hpc-grpo clusters`")
    scheduler: Literal["slurm", "local"] = Field(default="slurm", description="slurm, or local: this machine, no "
                                                 "scheduler (submitit's LocalExecutor, one node)")
    partition: str | None = Field(default=None, description="the default Slurm partition (sbatch --partition)")
    account: str | None = Field(default=None, description="the default Slurm account (sbatch --account)")
    qos: str | None = Field(default=None, description="the default Slurm quality of service (sbatch --qos)")
    nodes_max: int = Field(default=1, gt=0, description="most nodes a job may ask for; plan refuses more")
    gpus_per_node: int = Field(default=0, ge=0, description="GPUs of one node; a recipe's default")
    gpu_type: str | None = Field(default=None, description="the GPU type in the GPU request (gpu:TYPE:N); None: "
                                 "no type")
    gpu_memory_gb: float = Field(default=80, gt=0, description="memory of one GPU in GiB, for plan's memory "
                                 "estimate")
    cpus_per_node: int = Field(default=8, gt=0, description="CPUs of one node; a job's default cpus_per_task")
    mem_per_node_gb: float = Field(default=64, gt=0, description="memory of one node in GB; the most a recipe's "
                                   "resources.mem_gb may ask")
    gpu_request: Literal["gpus-per-node", "gres"] = Field(
        default="gpus-per-node", description="how GPUs are asked for: sbatch --gpus-per-node, or --gres=gpu:N for "
        "sites that take only that")
    time_max: str = Field(default="2-00:00:00", description="the partition's time limit, in Slurm's format; plan "
                          "refuses a longer resources.time")
    signal_delay_s: int = Field(default=120, ge=0, description="seconds before the time limit Slurm sends USR2 "
                                "(sbatch --signal=USR2@N): the job saves a checkpoint then")
    requeue: bool = Field(default=True, description="the job may be requeued (sbatch --requeue) after a time limit, "
                          "preemption or node failure")
    restart: Literal["requeue", "chain"] = Field(
        default="requeue", description="how a run carries on after a time limit or preemption: requeue (the job "
        "requeues itself) or chain (for sites where users may not requeue: each job queues its follow-on with "
        "--dependency=afternotok, which resumes only after TIMEOUT, PREEMPTED or NODE_FAIL)")
    runs_root: str = Field(default="~/hpc-grpo-runs", description="where run directories go, on a filesystem every "
                           "node sees; `~` and $VARS expand at submit")
    shared_paths: list[str] = Field(default_factory=list, description="folders every node sees (checked for nodes > 1)")
    offline: bool = Field(default=False, description="compute nodes cannot reach the Hugging Face Hub")
    slurm_cluster_name: str | None = Field(default=None, description="Slurm's ClusterName: picks this profile")
    # scheduler=local: the address a Ray job binds to. Loopback, so nothing leaves the machine, but not 127.0.0.1:
    # Ray silently rewrites 127.0.0.1 and localhost to the machine's external address.
    local_address: str = Field(default="127.0.0.2", description="scheduler=local: the job's Ray address (127.0.0.0/8, "
                                                                 "not 127.0.0.1)")
    ray_ports: str = Field(default=ray_ports.DEFAULT, description="FIRST-LAST: the ports a verl job's Ray may use on "
                           f"the nodes, {ray_ports.JOB_BLOCK} per job, chosen by job id (give the range your site's "
                           "firewall opens between nodes; keep it below the ephemeral ports, Linux: 32768-60999)")
    setup: Setup = Field(default_factory=Setup, description="the job's environment set-up")
    env: dict[str, str] = Field(default={}, description="variables the job exports (NCCL and network settings); "
                                "no secrets")

    @field_validator("local_address")
    @classmethod
    def _local_address(cls, v: str) -> str:
        import ipaddress

        try:
            addr = ipaddress.IPv4Address(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an IPv4 address") from None
        if not addr.is_loopback or addr == ipaddress.IPv4Address("127.0.0.1"):
            raise ValueError(f"{v}: use a loopback address other than 127.0.0.1 (Ray rewrites that one to the "
                             "machine's external address), e.g. 127.0.0.2")
        return str(addr)

    @field_validator("ray_ports")
    @classmethod
    def _ray_ports(cls, v: str) -> str:
        ray_ports.parse(v)
        return v

    @field_validator("time_max", mode="before")
    @classmethod
    def _time(cls, v: Any) -> str:
        parse_time_minutes(v)
        return str(v)

    _words = field_validator("partition", "account", "qos", "gpu_type")(classmethod(lambda cls, v: slurm_word(v)))

    @field_validator("runs_root")
    @classmethod
    def _runs_root(cls, v: str) -> str:
        if not PATH_RE.match(v.replace("$", "")):
            raise ValueError(f"{v!r}: the runs root goes on #SBATCH lines; use no spaces or shell characters")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if secret_in(key):
                raise ValueError(str(secret_error(key)))
        return v

    @property
    def time_max_min(self) -> int:
        return parse_time_minutes(self.time_max)

    def shared_path_list(self) -> list[Path]:
        """shared_paths with ~ and $VARS expanded (an unset variable leaves the entry out: it cannot match)."""
        out = []
        for item in self.shared_paths:
            expanded = expand_vars(item)
            if "$" not in expanded:
                out.append(Path(expanded).absolute())
        return out

    def runs_root_path(self) -> Path:
        """runs_root with ~ and $VARS expanded; an unset variable is an error, not a literal '$'."""
        expanded = expand_vars(self.runs_root)
        if "$" in expanded:
            raise SpecError(
                f"{self.runs_root!r} names an environment variable that is not set; "
                "set it or write an absolute path",
                key="cluster.runs_root",
            )
        return Path(expanded).absolute()
