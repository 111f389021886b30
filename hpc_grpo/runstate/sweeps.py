"""A sweep's manifest (RUNS_ROOT/SWEEP/sweep.json): which members it has, what each overrides, and every job array
it was submitted as. The members are ordinary run directories beside it (runstate.layout.member_dir), so
everything a run has (history, checkpoints, metrics) is read from them; the manifest holds only what ties them
together. Stdlib only: `sweep status` reads it on a login node.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.common.atomic import write_json_atomic
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.runstate import layout
from hpc_grpo.runstate.metrics import read_raw


@dataclass(frozen=True, slots=True)
class Member:
    index: int  # its array task index, and the I of its folder SWEEP-mI
    name: str
    overrides: list[str]  # the axes' values this member takes, key=value


@dataclass
class Manifest:
    name: str
    recipe: str
    cluster: str
    base: list[str]  # the overrides every member shares
    axes: dict[str, list[Any]]  # key -> the values swept, in the order given
    members: list[Member]
    parallel: int  # array tasks in flight at once (%P)
    how: str = "grid"  # "grid", or "random K of N (seed S)"
    metric: str = "reward"  # what `sweep status` ranks by: an engine's metric key, or eval/...
    mode: str = "max"  # max or min: which end of `metric` is best
    rungs: list[int] = field(default_factory=list)  # successive halving: the steps at which members are compared
    eta: int = 2  # at each rung a member goes on only within the top 1/eta of the members that reached it
    arrays: list[dict[str, Any]] = field(default_factory=list)  # {"job_id", "indices", "purpose", "time"}

    def member_dir(self, sweep_dir: Path, member: Member) -> Path:
        return layout.member_dir(sweep_dir, self.name, member.index)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_manifest(sweep_dir: Path, manifest: Manifest) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(layout.sweep_file(sweep_dir), manifest.as_dict())


def read_manifest(sweep_dir: Path) -> Manifest:
    path = layout.sweep_file(sweep_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        members = [Member(int(m["index"]), str(m["name"]), list(m["overrides"])) for m in data.pop("members")]
        return Manifest(members=members, **data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecError(f"{path} is not a readable sweep manifest ({exc}): give a sweep's folder or its name",
                        key="sweep") from None


def record_array(sweep_dir: Path, job_id: str, indices: list[int], purpose: str, when: str) -> Manifest:
    """Add one submitted job array (the first, or a `resume SWEEP`) to the manifest."""
    manifest = read_manifest(sweep_dir)
    manifest.arrays.append({"job_id": str(job_id), "indices": list(indices), "purpose": purpose, "time": when})
    write_manifest(sweep_dir, manifest)
    return manifest


def is_sweep(folder: Path) -> bool:
    return layout.sweep_file(folder).is_file()


def find_sweep(name: str, roots: list[Path]) -> Path | None:
    """A sweep's folder from its folder path or its name under one of the runs roots; None when neither."""
    folder = Path(name).expanduser()
    if is_sweep(folder):
        return folder.resolve()
    if "/" in name:
        return None
    for root in roots:
        if is_sweep(root / name):
            return (root / name).resolve()
    return None


def member_of(run_dir: Path) -> tuple[Path, Manifest, Member] | None:
    """(the sweep's folder, its manifest, this member) for a run directory that is a sweep's member; else None."""
    folder = Path(run_dir).parent
    if not is_sweep(folder):
        return None
    manifest = read_manifest(folder)
    for m in manifest.members:
        if manifest.member_dir(folder, m).resolve() == Path(run_dir).resolve():
            return folder, manifest, m
    return None


def rung_values(folder: Path, manifest: Manifest, step: int, exclude: Member) -> list[float]:
    """The sweep's metric at `step` as the other members logged it (their metrics.jsonl), those that reached it."""
    out = []
    for m in manifest.members:
        if m.index == exclude.index:
            continue
        value = read_raw(layout.metrics_file(manifest.member_dir(folder, m))).get(step, {}).get(manifest.metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(float(value))
    return out
