"""What one node of a verl job does, decided from plain values: ports, Ray's arguments, environment, files, argv.

Pure functions (no I/O), so each decision is unit-tested without Ray or Slurm; hpc_grpo.job.verl_node carries
them out. Why each value is what it is:

- Ports: a block of 400 per job (from the job id) in the profile's range (cluster.ray_ports, config/ray_ports), GCS
  on the head at the block's base, every other Ray port of a node inside its own 100-port slot. 4 slots: slurm-dev runs its 4 nodes on one machine; nodes further on are
  other hosts and reuse the slots, so no job's ports reach into the next job's block.
- The Ray temp dir is per job and node (/tmp/hpc-grpo-ray-JOB-NODE): two jobs sharing a host do not collide.
- Files under RUN_DIR/ray/JOB/ mark one allocation's progress; a requeued job keeps its id, so they carry the
  restart count (the attempt) too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpc_grpo.config import ray_ports
from hpc_grpo.config.ray_ports import JOB_BLOCK, NODE_SLOT, SLOTS, PortRange
from hpc_grpo.runstate import runs

DEFAULT_AUTH_MODE = "disabled"


@dataclass(frozen=True, slots=True)
class Ports:
    """One node's ports: `gcs` is the job's (the head's GCS), `base` starts this node's slot."""

    gcs: int
    base: int

    @property
    def client_server(self) -> int:
        return self.base + 7

    @property
    def dashboard(self) -> int:
        return self.base + 8


def ports(job_id: str | int, node_index: int, allowed: PortRange | None = None) -> Ports:
    """The job's block in the profile's range (cluster.ray_ports), by job id; the node's slot in it."""
    allowed = allowed or ray_ports.parse(ray_ports.DEFAULT)
    gcs = allowed.first + (int(job_id) % allowed.blocks) * JOB_BLOCK
    return Ports(gcs, gcs + (node_index % SLOTS) * NODE_SLOT)


def ray_temp_dir(job_id: str, node_index: int) -> str:
    return f"/tmp/hpc-grpo-ray-{job_id}-{node_index}"


def node_args(address: str, p: Ports, gpus: int, cpus: int, temp_dir: str) -> list[str]:
    """`ray start` arguments every node gets: its own address (never 127.0.0.1: Ray rewrites that to the host's
    external address), its resources, its temp dir, its ports; --block keeps `ray start` as the node's parent."""
    b = p.base
    return [
        f"--node-ip-address={address}",
        f"--num-gpus={gpus}",
        f"--num-cpus={cpus}",
        f"--temp-dir={temp_dir}",
        f"--node-manager-port={b + 1}",
        f"--object-manager-port={b + 2}",
        f"--dashboard-agent-listen-port={b + 3}",
        f"--dashboard-agent-grpc-port={b + 4}",
        f"--metrics-export-port={b + 5}",
        f"--runtime-env-agent-port={b + 6}",
        f"--min-worker-port={b + 50}",
        f"--max-worker-port={b + 99}",
        "--disable-usage-stats",
        "--block",
    ]


def head_args(p: Ports, node: Sequence[str], client_server: bool) -> list[str]:
    """The head's `ray start`. With ray[client] (grpc importable) Ray starts a client server on the fixed port 10001,
    which a second job's head on the host needs too: it goes into the node's slot; minimal Ray has no client server
    and aborts when given the flag at all. The API server runs even without the dashboard: its port goes into the
    slot too (8265 is fixed). No autoscaler monitor: Slurm fixes the node set."""
    client = [f"--ray-client-server-port={p.client_server}"] if client_server else []
    return ["--head", f"--port={p.gcs}", *client, "--include-dashboard=false", f"--dashboard-port={p.dashboard}",
            "--no-monitor", *node]


def worker_args(gcs_address: str, node: Sequence[str]) -> list[str]:
    return [f"--address={gcs_address}", *node]


def expected_nodes(names: Sequence[str], addresses: Sequence[str]) -> list[str]:
    """`name=address` per node, for ray_wait's message naming the nodes that did not join."""
    return [f"{n}={a}" for n, a in zip(names, addresses, strict=True)]


def driver_argv(driver: Sequence[str], resume: Sequence[str], with_resume: bool) -> list[str]:
    """verl's own driver gets resume preparation's overrides appended (last, so they win); a custom driver
    (launch.driver) gets none: they are in the resume-args file for it to read."""
    return [*driver, *(resume if with_resume else [])]


def auth_mode(environ: Mapping[str, str]) -> str:
    """Ray's authentication mode for every Ray the job starts: the user's explicit RAY_AUTH_MODE, else disabled.

    Explicit, because Ray 2.60 decides by itself when it is unset: a `ray start` (and a driver) turns token
    authentication on when ~/.ray/auth_token exists, and a driver that starts its own Ray writes that file. Home
    folders are shared across nodes, so one stray token would otherwise split the job's processes into two modes."""
    return environ.get("RAY_AUTH_MODE") or DEFAULT_AUTH_MODE


def node_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment every process of this node starts with (Ray's head or worker, the join wait, the driver).

    - RAY_AUTH_MODE: one explicit mode (auth_mode).
    - RAY_ADDRESS unset: `ray start` and the join wait must not follow an address left over from elsewhere; only
      the driver gets the job's (driver_environ).
    - ROCR_VISIBLE_DEVICES dropped when it equals CUDA_VISIBLE_DEVICES: Slurm sets both where gres.conf names no GPU
      vendor, and verl's workers refuse to run with both set; equal lists say nothing more. A real AMD setting
      (different) is kept.
    - RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0: a stopping node does not wait for drained tasks (the job is over).
    - no inherited W&B service token (runstate.runs.drop_inherited_wandb_service).
    """
    env = dict(environ)
    env.pop("RAY_ADDRESS", None)
    runs.drop_inherited_wandb_service(env)
    if env.get("ROCR_VISIBLE_DEVICES") and env["ROCR_VISIBLE_DEVICES"] == env.get("CUDA_VISIBLE_DEVICES", ""):
        del env["ROCR_VISIBLE_DEVICES"]
    env["RAY_AUTH_MODE"] = auth_mode(environ)
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    return env


def driver_environ(environ: Mapping[str, str], driver_env: Mapping[str, str], gcs_address: str) -> dict[str, str]:
    """The driver's environment: the node's, the engine's driver variables, and the job's Ray (RAY_ADDRESS)."""
    return {**environ, **driver_env, "RAY_ADDRESS": gcs_address}


def parse_assignments(items: Sequence[str]) -> dict[str, str]:
    """KEY=VALUE words (the launch script's driver_env array) as a dict; the value may hold '='."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"not KEY=VALUE: {item!r}")
        out[key] = value
    return out


def exit_status(returncode: int) -> int:
    """A child's status as bash reports it: 128+N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode
