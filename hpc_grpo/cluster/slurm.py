"""The one module through which every Slurm command goes.

Why one place: every call gets a timeout (a hung slurmctld must not hang the CLI), every failure becomes one
exception type that names the command and Slurm's own message, and the quirks of each command's output live
next to each other instead of spread over the code base. Stdlib only: `hpc-grpo status` must answer instantly.

Output formats: `sacct` has `--parsable2`; `sinfo` and `squeue` do not (22.05 rejects it), so they get an explicit
`-o`/`-O` format with `|` between fields and `--noheader`. The `parse_*` helpers are pure functions of that text
(unit-tested on sample output without a cluster).

Environment: clients find the cluster through SLURM_CONF when it is not the system one (the slurm-dev cluster:
`source .slurm-dev/env.sh`).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

__all__ = [
    "LIVE_STATES",
    "Attempt",
    "JobInfo",
    "PartitionLimits",
    "SlurmError",
    "available",
    "NodeShape",
    "associations",
    "batch_script",
    "cancel",
    "cluster_name",
    "hostnames",
    "node_addresses",
    "parse_node_addrs",
    "gpu_query",
    "parse_assoc",
    "parse_config_value",
    "parse_node_shapes",
    "partition_nodes",
    "test_only",
    "is_live",
    "job_attempts",
    "job_states",
    "normalize_state",
    "parse_attempts",
    "parse_duration",
    "parse_gres_gpus",
    "parse_sacct",
    "parse_sinfo",
    "parse_squeue",
    "partition_limits",
    "requeue",
    "sacct_states",
    "squeue_states",
    "time_left_s",
]


class SlurmError(RuntimeError):
    """A Slurm command failed, timed out or answered something we cannot use."""

    def __init__(self, cmd: list[str], message: str, returncode: int | None = None) -> None:
        self.cmd = list(cmd)
        self.stderr = message
        self.returncode = returncode
        rc = "" if returncode is None else f" (exit {returncode})"
        super().__init__(f"`{' '.join(cmd)}` failed{rc}: {message.strip() or 'no error message'}")


@dataclass(frozen=True, slots=True)
class PartitionLimits:
    """What one partition offers per node, so a plan can be checked before it reaches the queue."""

    name: str
    nodes: int
    cpus_per_node: int
    gpus_per_node: int
    mem_per_node_mb: int
    max_time_min: int | None  # None: no limit
    gpu_type: str | None = None  # e.g. "a100" when gres names a type, else None


@dataclass(frozen=True, slots=True)
class NodeShape:
    """One node of a partition as sinfo -N reports it: what a single job step can get there."""

    name: str
    cpus: int
    gpus: int
    mem_mb: int
    gpu_type: str | None = None


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One allocation's state as squeue (live or recently finished) or sacct (history) reports it."""

    job_id: str
    state: str  # normalized: "CANCELLED by 0" -> "CANCELLED"
    elapsed: str  # as Slurm prints it ("0:04", "1-02:03:04"); elapsed_s for seconds
    exit_code: str  # "code:signal" as sacct prints it ("0:0", "3:0", "0:9"); "" if unknown
    nodelist: str  # "node[1-2]"; "" while pending
    reason: str  # "None", "Resources", "BeginTime", ...
    source: str = "squeue"  # "squeue" or "sacct"

    @property
    def elapsed_s(self) -> int | None:
        return parse_duration(self.elapsed)

    @property
    def live(self) -> bool:
        return is_live(self.state)


# States in which a job still holds, or will again hold, an allocation: its run must not be started twice.
# PREEMPTED is not here: a job requeued by preemption goes RUNNING -> PENDING in squeue (measured, 22.05), and a
# PREEMPTED row from sacct is either an earlier allocation or a job preempted with PreemptMode=CANCEL (final).
LIVE_STATES: frozenset[str] = frozenset(
    {
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "RESIZING",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
        "RESV_DEL_HOLD",
        "SPECIAL_EXIT",
        "POWER_UP_NODE",
    }
)

_JOB_ID = re.compile(r"^\d+(?:[_+]\d+)?$")
_SQUEUE_FORMAT = "JobID:|,State:|,TimeUsed:|,exit_code:|,NodeList:|,Reason:|"
_SACCT_FIELDS = "JobID,State,Elapsed,ExitCode,NodeList,Reason"
_SINFO_FORMAT = "%P|%D|%c|%G|%m|%l"


# ------------------------------------------------------------------------------------------------------ running


def _run(args: list[str], timeout: float = 20) -> str:
    """Run one Slurm command and return its stdout; raise SlurmError on a non-zero exit, a timeout or no binary.

    Every Slurm call goes through here so that none can hang (sinfo blocks for seconds while slurmctld is down)
    and every error message carries the command and Slurm's stderr.
    """
    return _run_full(args, timeout)[0]


def _run_full(args: list[str], timeout: float = 20, stdin_text: str | None = None) -> tuple[str, str]:
    """_run that also returns stderr, for commands that report errors with exit status 0 (scontrol write)."""
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, check=False,
            **({"input": stdin_text} if stdin_text is not None else {"stdin": subprocess.DEVNULL}),
        )
    except FileNotFoundError as e:
        raise SlurmError(args, f"{args[0]} not found on PATH (is Slurm installed here?)") from e
    except subprocess.TimeoutExpired as e:
        raise SlurmError(args, f"timed out after {timeout:g}s (slurmctld down or overloaded?)") from e
    if proc.returncode != 0:
        raise SlurmError(args, proc.stderr or proc.stdout, proc.returncode)
    return proc.stdout, proc.stderr


def _run_or_none(args: list[str], none_when: str, timeout: float = 20) -> str | None:
    """_run, but None when Slurm's error says there is nothing to report (`none_when`, case-insensitive)."""
    try:
        return _run(args, timeout=timeout)
    except SlurmError as e:
        if none_when in e.stderr.lower():
            return None
        raise


def _check_ids(job_ids: list[str]) -> list[str]:
    out: list[str] = []
    for j in job_ids:
        j = str(j).strip()
        if not _JOB_ID.match(j):
            raise ValueError(f"not a Slurm job id: {j!r} (expected digits, optionally _N or +N)")
        if j not in out:
            out.append(j)
    return out


# ------------------------------------------------------------------------------------------------------ parsing


def parse_duration(text: str) -> int | None:
    """Seconds in a Slurm time string; None for no limit or unknown.

    Slurm prints "M:SS", "H:MM:SS", "D-HH:MM:SS" and accepts "M" (minutes), "D-H", "D-H:M" on input.
    """
    t = text.strip()
    if not t or t.upper() in {"INFINITE", "UNLIMITED", "NONE", "N/A", "(NULL)", "INVALID", "UNKNOWN"}:
        return None
    days = 0
    if "-" in t:
        d, _, t = t.partition("-")
        if not d.isdigit():
            raise ValueError(f"not a Slurm time: {text!r}")
        days = int(d)
        parts = t.split(":")
        if len(parts) == 1:  # D-H
            parts = [parts[0], "0", "0"]
        elif len(parts) == 2:  # D-H:M
            parts = [*parts, "0"]
    else:
        parts = t.split(":")
        if len(parts) == 1:  # M
            parts = ["0", parts[0], "0"]
        elif len(parts) == 2:  # M:S
            parts = ["0", *parts]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a Slurm time: {text!r}")
    h, m, s = (int(p) for p in parts)
    return ((days * 24 + h) * 60 + m) * 60 + s


def parse_gres_gpus(gres: str) -> tuple[int, str | None]:
    """(GPUs per node, GPU type or None) from a gres string such as "gpu:4", "gpu:a100:8(S:0-1),shard:8"."""
    total = 0
    gtype: str | None = None
    # split on commas that are not inside parentheses ("gpu:a100:4(S:0-1)")
    for item in re.split(r",(?![^()]*\))", gres.strip()):
        item = re.sub(r"\(.*?\)", "", item).strip()
        fields = item.split(":")
        if fields[0] != "gpu" or len(fields) < 2:
            continue
        count = re.match(r"\d+", fields[-1])
        if not count:
            continue
        total += int(count.group())
        if len(fields) >= 3 and gtype is None:
            gtype = fields[1]
    return total, gtype


def _leading_int(text: str) -> int:
    m = re.match(r"\d+", text.strip())
    return int(m.group()) if m else 0


def normalize_state(state: str) -> str:
    """The bare state word: "CANCELLED by 0" -> "CANCELLED", "cancelled+" -> "CANCELLED"."""
    words = state.strip().split()
    return words[0].rstrip("+").upper() if words else "UNKNOWN"


def _exit_from_wait_status(text: str) -> str:
    """squeue's exit_code is the raw wait status (768 = exit 3, 9 = signal 9); print it the way sacct does."""
    t = text.strip()
    if not t.isdigit():
        return t if ":" in t else ""
    st = int(t)
    return f"{(st >> 8) & 0xFF}:{st & 0x7F}"


def parse_sinfo(text: str, partition: str | None) -> PartitionLimits:
    """PartitionLimits from `sinfo -h -o '%P|%D|%c|%G|%m|%l'` output.

    A partition with different kinds of nodes prints several lines: nodes are added up and the per-node
    numbers are the smallest ones, so a plan that fits them fits every node. `partition=None` picks the default
    partition (the one sinfo marks with "*").
    """
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) < 6:
            raise ValueError(f"unexpected sinfo line: {line!r}")
        name = f[0].strip()
        default = name.endswith("*")
        name = name.rstrip("*")
        if (partition is None and default) or name == partition:
            rows.append((name, f))
    if not rows:
        what = f"partition {partition!r}" if partition else "default partition"
        raise LookupError(f"sinfo reports no {what}")
    name = rows[0][0]
    nodes = sum(_leading_int(f[1]) for _, f in rows)
    cpus = min(_leading_int(f[2]) for _, f in rows)
    gpus_types = [parse_gres_gpus(f[3]) for _, f in rows]
    gpus = min(g for g, _ in gpus_types)
    gtype = next((t for _, t in gpus_types if t), None)
    mem = min(_leading_int(f[4]) for _, f in rows)
    limits = [parse_duration(f[5]) for _, f in rows]
    max_s = None if any(v is None for v in limits) else max(v for v in limits if v is not None)
    return PartitionLimits(
        name=name,
        nodes=nodes,
        cpus_per_node=cpus,
        gpus_per_node=gpus,
        mem_per_node_mb=mem,
        max_time_min=None if max_s is None else max_s // 60,
        gpu_type=gtype,
    )


def parse_squeue(text: str) -> dict[str, JobInfo]:
    """JobInfo per job from `squeue -h -O 'JobID:|,State:|,TimeUsed:|,exit_code:|,NodeList:|,Reason:|'`."""
    out: dict[str, JobInfo] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        f = [x.strip() for x in line.split("|")]
        if len(f) < 6:
            raise ValueError(f"unexpected squeue line: {line!r}")
        jid, state, elapsed, code, nodes, reason = f[:6]
        out[jid] = JobInfo(
            job_id=jid,
            state=normalize_state(state),
            elapsed=elapsed,
            exit_code=_exit_from_wait_status(code),
            nodelist="" if nodes in {"", "(null)"} else nodes,
            reason=reason,
            source="squeue",
        )
    return out


def parse_sacct(text: str) -> dict[str, JobInfo]:
    """JobInfo per allocation from `sacct --parsable2 --noheader -X -o JobID,State,Elapsed,ExitCode,NodeList,Reason`.

    Step rows ("123.batch", "123.0") are skipped should -X be missing; with duplicate ids the last row wins.
    """
    out: dict[str, JobInfo] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) < 6:
            raise ValueError(f"unexpected sacct line: {line!r}")
        jid, state, elapsed, code, nodes, reason = (x.strip() for x in f[:6])
        if "." in jid:
            continue
        out[jid] = JobInfo(
            job_id=jid,
            state=normalize_state(state),
            elapsed=elapsed,
            exit_code=code,
            nodelist="" if nodes in {"", "None assigned", "(null)"} else nodes,
            reason=reason,
            source="sacct",
        )
    return out


# ------------------------------------------------------------------------------------------------------ queries


def available() -> bool:
    """True when Slurm clients are installed and a controller answers (decides local vs Slurm, skips tests)."""
    if shutil.which("sinfo") is None:
        return False
    try:
        _run(["sinfo", "--noheader", "-o", "%P"], timeout=10)
    except SlurmError:
        return False
    return True


def partition_limits(partition: str | None) -> PartitionLimits:
    """Nodes, CPUs, GPUs, memory and time limit of a partition (None: the default one), to check a plan against."""
    args = ["sinfo", "--noheader", "-o", _SINFO_FORMAT]
    if partition:
        args += ["-p", partition]
    text = _run(args)
    try:
        return parse_sinfo(text, partition)
    except LookupError as e:
        raise SlurmError(args, f"{e}; `sinfo -s` lists the partitions") from e


def squeue_states(job_ids: list[str]) -> dict[str, JobInfo]:
    """States of the jobs slurmctld still remembers (live ones, and finished ones for MinJobAge seconds).

    squeue exits non-zero with "Invalid job id specified" when it knows none of the ids: that is an empty answer.
    """
    ids = _check_ids(job_ids)
    if not ids:
        return {}
    text = _run_or_none(["squeue", "--noheader", "--states=all", "-j", ",".join(ids), "-O", _SQUEUE_FORMAT],
                        none_when="invalid job id")
    return parse_squeue(text) if text is not None else {}


def sacct_states(job_ids: list[str]) -> dict[str, JobInfo]:
    """States from accounting (-X: allocations, not steps), for jobs squeue has already forgotten.

    Returns {} when accounting is disabled on the cluster (then an old job's state is unknowable).
    """
    ids = _check_ids(job_ids)
    if not ids:
        return {}
    text = _run_or_none(["sacct", "--parsable2", "--noheader", "-X", "-j", ",".join(ids), "-o", _SACCT_FIELDS],
                        none_when="accounting storage is disabled", timeout=30)
    return parse_sacct(text) if text is not None else {}


def job_states(job_ids: list[str]) -> dict[str, JobInfo]:
    """State of each job: squeue first (current truth), then sacct for the ids squeue no longer knows.

    Keys are job ids as Slurm prints them; an id that neither knows is absent from the result.
    """
    ids = _check_ids(job_ids)
    found = squeue_states(ids)
    missing = [j for j in ids if j not in found]
    if missing:
        for jid, info in sacct_states(missing).items():
            found.setdefault(jid, info)
    return found


_ATTEMPT_FIELDS = "JobID,State,Elapsed,ExitCode,NodeList,Reason,Start,End"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One allocation of a job: a requeued job keeps its id and gets one row per start (sacct --duplicates)."""

    info: JobInfo
    start: str  # "2026-12-03T07:42:36", "Unknown" while pending
    end: str


def parse_attempts(text: str) -> dict[str, list[Attempt]]:
    """Attempts per job, oldest first, from `sacct --parsable2 --noheader -X -D -o JobID,...,Start,End`."""
    out: dict[str, list[Attempt]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) < 8:
            raise ValueError(f"unexpected sacct line: {line!r}")
        (info,) = parse_sacct("|".join(f[:6])).values() or (None,)
        if info is None:
            continue
        out.setdefault(info.job_id, []).append(Attempt(info, f[6].strip(), f[7].strip()))
    return out


def job_attempts(job_ids: list[str]) -> dict[str, list[Attempt]]:
    """Every allocation of each job (requeues, preemptions, time limits), oldest first; {} without accounting."""
    ids = _check_ids(job_ids)
    if not ids:
        return {}
    text = _run_or_none(["sacct", "--parsable2", "--noheader", "-X", "-D", "-j", ",".join(ids), "-o", _ATTEMPT_FIELDS],
                        none_when="accounting storage is disabled", timeout=30)
    return parse_attempts(text) if text is not None else {}


def is_live(state: str) -> bool:
    """True while the job holds or will hold an allocation again (pending, running, requeued, suspended...)."""
    return normalize_state(state) in LIVE_STATES


def batch_script(job_id: str) -> str:
    """The batch script slurmctld holds for a job (what really ran, for `status` and debugging).

    scontrol exits 0 even for an unknown job, printing only to stderr: an empty script is an error.
    """
    (jid,) = _check_ids([job_id])
    args = ["scontrol", "write", "batch_script", jid, "-"]
    out, err = _run_full(args)
    if not out:
        raise SlurmError(args, err or f"no batch script for job {jid} (finished more than MinJobAge ago?)")
    return out


def requeue(job_id: str) -> None:
    """`scontrol requeue`: Slurm sends SIGTERM (no save hook runs) and queues the job again under its id."""
    (jid,) = _check_ids([job_id])
    _run(["scontrol", "requeue", jid])


def cancel(job_id: str, signal: str | None = None) -> None:
    """Cancel a job, or with `signal` (e.g. "USR2": submitit's checkpoint-and-requeue) only signal its steps.

    Cancelling a job that already ended is not an error (scancel exits 0).
    """
    (jid,) = _check_ids([job_id])
    args = ["scancel"]
    if signal:
        if not re.fullmatch(r"(SIG)?[A-Z0-9]+", signal):
            raise ValueError(f"not a signal name: {signal!r}")
        args.append(f"--signal={signal}")
    args.append(jid)
    _run(args)


# ------------------------------------------------------------------------------------------------------ preflight
_NODES_FORMAT = "%N|%c|%G|%m"


def parse_node_shapes(text: str) -> list[NodeShape]:
    """NodeShape per node from `sinfo -N -h -o '%N|%c|%G|%m'` (a node listed twice, in two partitions, once)."""
    out: dict[str, NodeShape] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        f = [x.strip() for x in line.split("|")]
        if len(f) < 4:
            raise ValueError(f"unexpected sinfo -N line: {line!r}")
        gpus, gtype = parse_gres_gpus(f[2])
        out.setdefault(f[0], NodeShape(f[0], _leading_int(f[1]), gpus, _leading_int(f[3]), gtype))
    return list(out.values())


def partition_nodes(partition: str | None) -> list[NodeShape]:
    """Every node of a partition (None: the default one) with its CPUs, GPUs (GRES) and memory."""
    name = partition or partition_limits(None).name
    args = ["sinfo", "-N", "--noheader", "-p", name, "-o", _NODES_FORMAT]
    return parse_node_shapes(_run(args))


def parse_config_value(text: str, key: str) -> str | None:
    """One value from `scontrol show config` output ("ClusterName             = hpcgrpo-dev")."""
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip().lower() == key.lower():
            return value.strip() or None
    return None


def cluster_name() -> str | None:
    """The ClusterName of the Slurm this machine's clients talk to (SLURM_CONF or the system one); None if none.

    Asked once per process and SLURM_CONF value: cluster choice and plan's preflight both want it.
    """
    return _cluster_name(os.environ.get("SLURM_CONF", ""))


@functools.lru_cache(maxsize=4)
def _cluster_name(_conf: str) -> str | None:
    if shutil.which("scontrol") is None:
        return None
    try:
        return parse_config_value(_run(["scontrol", "show", "config"], timeout=10), "ClusterName")
    except SlurmError:
        return None


def parse_assoc(text: str) -> list[tuple[str, list[str]]]:
    """(account, [qos, ...]) per association from `sacctmgr -nP show assoc ... format=Account,QOS`."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        account, _, qos = line.partition("|")
        out.append((account.strip(), [q.strip() for q in qos.split(",") if q.strip()]))
    return out


def associations(user: str, cluster: str | None = None) -> list[tuple[str, list[str]]] | None:
    """The accounts and QOS the user may submit with; None when accounting cannot be asked (no slurmdbd)."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", user):
        raise ValueError(f"not a user name: {user!r}")
    args = ["sacctmgr", "--noheader", "--parsable2", "show", "assoc", "where", f"user={user}"]
    if cluster:
        args.append(f"cluster={cluster}")
    args.append("format=Account,QOS")
    try:
        return parse_assoc(_run(args, timeout=20))
    except SlurmError:
        return None


def test_only(script: str) -> str:
    """`sbatch --test-only` on a batch script: Slurm's own answer whether and where it could start. Queues nothing.

    Returns sbatch's message ("Job 12 to start at ... on nodes node1"); raises SlurmError with Slurm's reason
    ("Requested node configuration is not available") for a request no node can ever satisfy.
    """
    out, err = _run_full(["sbatch", "--test-only"], timeout=30, stdin_text=script)
    return (err or out).strip()


def gpu_query(job_id: str, fields: str, nodes: int, timeout: float = 60) -> str:
    """`nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` on every node of a running job.

    One task per node through `srun --overlap --jobid`: it shares the job's allocation (no new resources, no
    queueing) and sees the job's GPUs. Each output line is prefixed with the Slurm node name.
    """
    (jid,) = _check_ids([job_id])
    if not re.fullmatch(r"[a-z_.,]+", fields):
        raise ValueError(f"not nvidia-smi query fields: {fields!r}")
    cmd = f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits | sed \"s/^/$SLURMD_NODENAME, /\""
    args = ["srun", "--overlap", f"--jobid={jid}", f"--nodes={int(nodes)}", f"--ntasks={int(nodes)}",
            "--ntasks-per-node=1", "bash", "-c", cmd]
    return _run(args, timeout=timeout)


def time_left_s(job_id: str) -> int | None:
    """Seconds left in a running job's allocation (squeue's TimeLeft); None when unknown or unlimited.

    Tells a time-limit warning (little time left) from a preemption or a user's signal (much time left).
    """
    (jid,) = _check_ids([job_id])
    text = _run_or_none(["squeue", "--noheader", "-j", jid, "-O", "TimeLeft:|"], none_when="invalid job id", timeout=10)
    if text is None:
        return None
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    try:
        return parse_duration(first.split("|")[0])
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------------ in the job
def hostnames(nodelist: str) -> list[str]:
    """The node names of a hostlist expression (a job's SLURM_JOB_NODELIST, "node[1-4]"), in Slurm's order."""
    return _run(["scontrol", "show", "hostnames", nodelist], timeout=30).split()


def parse_node_addrs(text: str) -> dict[str, str]:
    """NodeName -> NodeAddr from `scontrol -o show node` (one node per line); a node without NodeAddr is left out."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        name, addr = fields.get("NodeName"), fields.get("NodeAddr")
        if name and addr:
            out[name] = addr
    return out


def node_addresses(names: list[str]) -> dict[str, str]:
    """Each node's NodeAddr (what the node's daemons, and so the job's Ray, are reached at), in one scontrol call.

    Not the host name's DNS answer: slurm-dev's nodes are all `localhost` with addresses 127.0.0.11-14, and a real
    cluster may route Ray over an address the name does not resolve to.
    """
    if not names:
        return {}
    return parse_node_addrs(_run(["scontrol", "-o", "show", "node", ",".join(names)], timeout=30))
