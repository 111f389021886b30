"""Slurm's answers as data: pure parsers of sinfo, squeue, sacct, scontrol and sacctmgr output, and the
records they return. Unit-tested on sample output without a cluster; hpc_grpo.cluster.slurm runs the commands.

Formats: `sacct` has `--parsable2`; `sinfo` and `squeue` do not (22.05 rejects it), so they are asked for an
explicit `-o`/`-O` format with `|` between fields and `--noheader` (the formats are beside the commands).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from hpc_grpo.cluster.states import is_live, normalize_state
from hpc_grpo.common.slurm_time import parse_duration


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


@dataclass(frozen=True, slots=True)
class Attempt:
    """One allocation of a job: a requeued job keeps its id and gets one row per start (sacct --duplicates)."""

    info: JobInfo
    start: str  # "2026-12-03T07:42:36", "Unknown" while pending
    end: str



def _rows(text: str, fields: int, command: str) -> Iterator[list[str]]:
    """The '|'-separated fields of each non-empty line of a Slurm command's output, stripped; a line with fewer
    than `fields` is an output format this code does not know: ValueError naming the command and the line."""
    for line in text.splitlines():
        if not line.strip():
            continue
        f = [x.strip() for x in line.split("|")]
        if len(f) < fields:
            raise ValueError(f"unexpected {command} line: {line!r}")
        yield f

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
    for f in _rows(text, 6, "sinfo"):
        name = f[0]
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
    for f in _rows(text, 6, "squeue"):
        jid, state, elapsed, code, nodes, reason = f[:6]
        for key in _array_ids(jid, *f[6:8]):
            out[key] = JobInfo(
                job_id=key,
                state=normalize_state(state),
                elapsed=elapsed,
                exit_code=_exit_from_wait_status(code),
                nodelist="" if nodes in {"", "(null)"} else nodes,
                reason=reason,
                source="squeue",
            )
    return out


def _array_ids(jid: str, array_job: str = "", tasks: str = "") -> list[str]:
    """The ids one squeue row stands for. An array task is ARRAY_TASK (as sacct, scontrol and the job's own
    SLURM_ARRAY_* name it); the row of the array's pending tasks lists them ("2-3%1", "1,3,5%2"): one id each.
    A plain job (ArrayTaskID N/A, or the fields absent) is its JobID."""
    if not array_job or not tasks or tasks in ("N/A", "(null)") or not array_job.isdigit():
        return [jid]
    ids: list[str] = []
    for part in tasks.split("%", 1)[0].strip("[]").split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return [jid]
        ids += [f"{array_job}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return ids


def parse_sacct(text: str) -> dict[str, JobInfo]:
    """JobInfo per allocation from `sacct --parsable2 --noheader -X -o JobID,State,Elapsed,ExitCode,NodeList,Reason`.

    Step rows ("123.batch", "123.0") are skipped should -X be missing; with duplicate ids the last row wins.
    """
    out: dict[str, JobInfo] = {}
    for f in _rows(text, 6, "sacct"):
        jid, state, elapsed, code, nodes, reason = f[:6]
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


def parse_attempts(text: str) -> dict[str, list[Attempt]]:
    """Attempts per job, oldest first, from `sacct --parsable2 --noheader -X -D -o JobID,...,Start,End`."""
    out: dict[str, list[Attempt]] = {}
    for f in _rows(text, 8, "sacct"):
        (info,) = parse_sacct("|".join(f[:6])).values() or (None,)
        if info is None:
            continue
        out.setdefault(info.job_id, []).append(Attempt(info, f[6], f[7]))
    return out


def parse_node_shapes(text: str) -> list[NodeShape]:
    """NodeShape per node from `sinfo -N -h -o '%N|%c|%G|%m'` (a node listed twice, in two partitions, once)."""
    out: dict[str, NodeShape] = {}
    for f in _rows(text, 4, "sinfo -N"):
        gpus, gtype = parse_gres_gpus(f[2])
        out.setdefault(f[0], NodeShape(f[0], _leading_int(f[1]), gpus, _leading_int(f[3]), gtype))
    return list(out.values())


def parse_config_value(text: str, key: str) -> str | None:
    """One value from `scontrol show config` output ("ClusterName             = hpcgrpo-dev")."""
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip().lower() == key.lower():
            return value.strip() or None
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


def parse_node_addrs(text: str) -> dict[str, str]:
    """NodeName -> NodeAddr from `scontrol -o show node` (one node per line); a node without NodeAddr is left out."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        name, addr = fields.get("NodeName"), fields.get("NodeAddr")
        if name and addr:
            out[name] = addr
    return out
