"""One node of a verl job, start to end: `python -m hpc_grpo.job.verl_node --spec RUN/spec.yaml ... -- DRIVER...`.

Run once per node by scripts/launch.sh (one Slurm task per node; cluster=local: one node, no Slurm). Node 0 runs
resume preparation, starts the Ray head, waits (polling, with a deadline) until every node has joined, prunes once,
runs the driver with RAY_ADDRESS and the resume overrides while a prune poller watches the checkpoints (and
hpc_grpo.job.driver_watch reads its output: a dead rollout engine stops it instead of hanging it; and
hpc_grpo.job.health_watch its metric rows: findings logged, a finding in `health.stop_on` stops it;
hpc_grpo.job.verl_early_stop its validations: a plateau stops it, the run trained), prunes once
more, checks the disk when the driver failed, and stops its Ray once the workers have left. The other nodes start a
Ray worker that joins the head and stay until node 0's driver has exited. The decisions (ports, arguments,
environment, files) are hpc_grpo.job.node_plan's pure functions; where the node is comes from hpc_grpo.cluster.job_env.

Teardown never uses `ray stop` (it kills every Ray on the host, other jobs' included): each node stops only the
process tree it started (hpc_grpo.job.proc_tree). Order: workers leave first (they see node 0's done file), then the
head stops; a worker whose head went first loses its GCS and leaves its agents behind.

No torch or transformers here: the driver (its own process) imports them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from hpc_grpo.runstate.layout import SPEC_FILE, StateFiles, state_files, verl_log
from hpc_grpo.job import driver_watch, node_plan, proc_tree
from hpc_grpo.cluster.job_env import JobEnvError, NodeLayout, node_layout
from hpc_grpo.config import ray_ports
from hpc_grpo.config import reward_registry as rewards
from hpc_grpo.config.ray_ports import PortRange

WORKERS_STOPPED_S = 15.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def log(message: str, err: bool = False) -> None:
    """Every hpc-grpo line carries the wall-clock time (epoch seconds): join and teardown times read off the log."""
    print(f"hpc-grpo: [{time.time():.3f}] {message}", file=sys.stderr if err else sys.stdout, flush=True)


@dataclass(frozen=True, slots=True)
class Options:
    spec: Path
    nodes: int
    gpus_per_node: int
    ray_cpus: int
    join_timeout_s: float
    ray_dir: Path
    resume: bool
    local_address: str | None
    driver_env: dict[str, str]
    driver: list[str]
    ray_ports: PortRange

    @property
    def run_dir(self) -> Path:
        return self.spec.parent


def parse_args(argv: Sequence[str]) -> Options:
    """Options before `--`, the driver's argv after it (passed on verbatim, whatever it holds)."""
    argv = list(argv)
    if "--" not in argv:
        raise SystemExit(f"usage: python -m hpc_grpo.job.verl_node --spec RUN/{SPEC_FILE} [options] -- DRIVER ARGS...")
    split = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m hpc_grpo.job.verl_node", description=__doc__.split("\n")[0])
    p.add_argument("--spec", required=True, type=Path, help=f"RUN_DIR/{SPEC_FILE}, the frozen run spec")
    p.add_argument("--nodes", required=True, type=int)
    p.add_argument("--gpus-per-node", required=True, type=int, help="Ray's GPUs per node (CPU mode: stand-ins)")
    p.add_argument("--ray-cpus", required=True, type=int, help="Ray's logical CPUs per node")
    p.add_argument("--join-timeout", required=True, type=float, help="seconds for every node to join")
    p.add_argument("--ray-dir", required=True, type=Path, help="marker files, per job: RAY_DIR/JOB_ID/")
    p.add_argument("--resume", action="store_true", help="append resume preparation's overrides to the driver")
    p.add_argument("--ray-ports", default=ray_ports.DEFAULT, help="FIRST-LAST: the profile's range for Ray's ports")
    p.add_argument("--local-address", default=None,
                   help="cluster=local: no Slurm, one node at this loopback address (not 127.0.0.1)")
    p.add_argument("--driver-env", nargs="*", default=[], metavar="KEY=VALUE", help="the driver's own variables")
    a = p.parse_args(argv[:split])
    driver = argv[split + 1:]
    if not driver:
        p.error("no driver command after --")
    try:
        driver_env = node_plan.parse_assignments(a.driver_env)
        allowed = ray_ports.parse(a.ray_ports)
    except ValueError as exc:
        p.error(str(exc))
    return Options(a.spec.absolute(), a.nodes, a.gpus_per_node, a.ray_cpus, a.join_timeout, a.ray_dir.absolute(),
                   a.resume, a.local_address, driver_env, driver, allowed)


class _Stop(Exception):
    """SIGTERM/SIGINT/SIGHUP (scancel, a time limit, submitit's local cancel): unwind so teardown runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signum)


def _late_stop(signum: int, frame: FrameType | None) -> None:
    log(f"{signal.Signals(signum).name} during teardown: finishing the teardown first", err=True)


def _teardown_started() -> None:
    """From here on a second SIGTERM must not cut the teardown short (Slurm's SIGKILL still ends everything)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _late_stop)


def _on_usr2(signum: int, frame: FrameType | None) -> None:
    # A Python handler, not SIG_IGN: an ignored signal would stay ignored in the driver and Ray, which exec.
    log("USR2 (time-limit warning or preemption): verl has no save hook; its last periodic save is what survives")


class RayNode:
    """This node's `ray start --block` (through hpc_grpo.job.ray_start, on this interpreter) and its teardown."""

    def __init__(self, temp_dir: str) -> None:
        self.temp_dir = temp_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wrapper_args: list[str], ray_args: list[str]) -> subprocess.Popen[bytes]:
        self.proc = subprocess.Popen([sys.executable, "-m", "hpc_grpo.job.ray_start", *wrapper_args, "--", *ray_args])
        return self.proc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            proc_tree.stop_tree(self.proc, log=lambda m: log(f"Ray teardown: {m}", err=True))
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _touch(path: Path) -> None:
    """A marker file; a failure (shared filesystem trouble) must not skip the teardown after it."""
    try:
        path.touch()
    except OSError as exc:
        log(f"could not write {path}: {exc}", err=True)


def _wait_workers_stopped(files: StateFiles, nodes: int) -> None:
    """Node 0, at its end: wait (with a deadline) until every worker node has stopped its Ray."""
    deadline = time.monotonic() + WORKERS_STOPPED_S
    while missing := [p for p in files.workers(nodes) if not p.exists()]:
        if time.monotonic() >= deadline:
            log(f"{len(missing)} worker node(s) did not report stopping in {WORKERS_STOPPED_S:.0f}s; "
                "stopping the head anyway", err=True)
            return
        time.sleep(0.1)


def run_head(o: Options, layout: NodeLayout, env: dict[str, str]) -> int:
    p = node_plan.ports(layout.job_id, layout.index, o.ray_ports)
    gcs = f"{layout.head_address}:{p.gcs}"
    files = state_files(o.ray_dir, layout.job_id, layout.attempt)
    temp = node_plan.ray_temp_dir(layout.job_id, layout.index)
    ray = RayNode(temp)
    for stale in (files.done, files.joined):
        stale.unlink(missing_ok=True)
    try:
        from hpc_grpo.job import prepare_resume

        # The newest complete checkpoint, newer broken ones quarantined, the decision in history.jsonl.
        resume = prepare_resume.prepare_for_job(o.spec, files.resume_args)
        if resume is None:
            return 2
        log(f"starting the Ray head on {layout.name} ({gcs}) for {o.nodes} node(s)")
        node = node_plan.node_args(layout.address, p, o.gpus_per_node, o.ray_cpus, temp)
        client = importlib.util.find_spec("grpc") is not None
        ray.start([], node_plan.head_args(p, node, client_server=client))
        from hpc_grpo.job.ray_wait import wait_for_nodes

        status = wait_for_nodes(gcs, o.nodes, o.nodes * o.gpus_per_node, o.join_timeout_s,
                                node_plan.expected_nodes(layout.names, layout.addresses),
                                ray.proc.pid if ray.proc else None, str(files.joined), gpu_unit(o.spec))
        if status != 0:
            return status
        log(f"all {o.nodes} node(s) joined; starting the driver")
        return _drive(o, node_plan.driver_argv(o.driver, resume, o.resume),
                      node_plan.driver_environ(env, o.driver_env, gcs))
    finally:
        _teardown_started()
        _touch(files.done)
        _wait_workers_stopped(files, o.nodes)
        ray.stop()
        log("Ray head stopped")


def _drive(o: Options, argv: list[str], env: dict[str, str]) -> int:
    """Retention is hpc-grpo's (verl's max_actor_ckpt_to_keep is off): once now, after resume preparation; after
    each save by a poller beside the driver (verl has no save hook); once more at the end. A prune never fails the
    job. A failed driver gets the disk check: verl does not say when a save failed for want of space."""
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.engines import sync_break
    from hpc_grpo.job import disk, health_watch, prune_poller, verl_early_stop

    verl_file = verl_log(o.run_dir)
    prune_poller.prune_once(o.run_dir, "job start")
    if sync_break.enabled(env):
        log(sync_break.warning(), err=True)
    thread, stop = prune_poller.start_thread(o.run_dir, verl_log=verl_file)
    spec = load_frozen(o.spec)
    health = health_watch.VerlHealth(spec, log).start()
    early = verl_early_stop.VerlEarlyStop(spec, log).start() if spec.recipe.train.early_stop else None
    try:
        status = node_plan.exit_status(driver_watch.run_watched(
            argv, env, log, stop_when=lambda: health.stop_reason or (early.stop_reason if early else None)))
        log(f"driver exited with status {status}")
    finally:
        health.close()
        if early is not None:
            early.close()
        stop.set()
        thread.join(timeout=30)
    if early is not None and early.stop_reason and not health.stop_reason and status == health_watch.HEALTH_STOPPED:
        early.mark_trained()  # a plateau: trained, the job succeeds and its eval runs
        status = 0
    prune_poller.prune_once(o.run_dir, "run end", verl_file)
    if status not in (0, health_watch.HEALTH_STOPPED):
        disk.check_after_failure(o.spec)
    return status


def run_worker(o: Options, layout: NodeLayout) -> int:
    p = node_plan.ports(layout.job_id, layout.index, o.ray_ports)
    gcs = f"{layout.head_address}:{p.gcs}"
    files = state_files(o.ray_dir, layout.job_id, layout.attempt)
    ray = RayNode(node_plan.ray_temp_dir(layout.job_id, layout.index))
    label = f"node {layout.name}"
    try:
        log(f"{label}: Ray worker ({layout.address}) will join {gcs}")
        # ray_start imports Ray's CLI while the head starts, runs `ray start` once the head's GCS port answers (exit
        # 3: not within the join timeout, 4: node 0 already finished).
        proc = ray.start(["--wait", gcs, "--timeout", str(o.join_timeout_s), "--done-file", str(files.done),
                          "--label", label],
                         node_plan.worker_args(gcs, node_plan.node_args(layout.address, p, o.gpus_per_node,
                                                                        o.ray_cpus, ray.temp_dir)))
        # Stay until the driver on node 0 has exited (or this node's Ray died).
        while ray.alive() and not files.done.exists():
            time.sleep(0.2)
        if files.done.exists():
            return 0
        status = node_plan.exit_status(proc.wait())
        log(f"{label}: Ray on this node ended (status {status}) before the driver finished", err=True)
        return status or 1
    finally:
        _teardown_started()
        ray.stop()
        _touch(files.stopped(layout.index))
        log(f"{label}: Ray worker stopped")


def gpu_unit(spec_path: Path) -> str:
    """What Ray's GPU resource is on this run, for the joined line: real GPUs, or verl's CPU mode's stand-ins (one
    per CPU worker: no GPU is there)."""
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.common.yamlio import SpecError

    try:
        cpu = load_frozen(spec_path).verl_cpu
    except (OSError, SpecError):
        return "GPU(s)"
    return "CPU worker(s), no GPU (verl's CPU mode)" if cpu else "GPU(s)"


def code_sandbox_line(spec_path: Path) -> str | None:
    """This node's code sandbox, for the job log (a reward that runs code only; the reward runs on any node).
    Raises IsolationRefused where grpo.code.isolation=auto finds no namespaces here."""
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.common.yamlio import SpecError

    try:
        spec = load_frozen(spec_path)
    except (OSError, SpecError) as exc:  # the reward itself still probes and refuses, on every call
        log(f"code sandbox: not checked at start ({spec_path}: {exc})", err=True)
        return None
    if not rewards.get(spec.recipe.grpo.reward).runs_code:
        return None
    from hpc_grpo.cluster import isolation

    return isolation.job_line(spec.recipe.grpo.code.isolation)


def main(argv: Sequence[str] | None = None) -> int:
    o = parse_args(sys.argv[1:] if argv is None else argv)
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_stop)
    signal.signal(signal.SIGUSR2, _on_usr2)
    # One environment for every process of this node (Ray, the join wait in this process, the driver).
    env = node_plan.node_environ(os.environ)
    os.environ.clear()
    os.environ.update(env)
    # Relative paths (Hydra's outputs/ folder among them) land in the run directory, on every node.
    os.chdir(o.run_dir)
    try:
        layout = node_layout(o.nodes, o.local_address)
        from hpc_grpo.cluster.isolation import IsolationRefused

        try:
            line = code_sandbox_line(o.spec)
        except IsolationRefused as exc:
            log(f"{layout.name}: {exc}", err=True)
            return 2
        if line:
            log(f"{layout.name}: {line}")
        files = state_files(o.ray_dir, layout.job_id, layout.attempt)
        files.folder.mkdir(parents=True, exist_ok=True)
        if layout.index == 0:
            return run_head(o, layout, env)
        return run_worker(o, layout)
    except JobEnvError as exc:
        log(str(exc), err=True)
        return 1
    except _Stop as exc:
        log(f"stopped by {exc}", err=True)
        return 128 + exc.signum


if __name__ == "__main__":
    sys.exit(main())
