"""Checkpoint retention: which checkpoints a run keeps, why, and their safe removal.

hpc-grpo owns retention (verl's `max_actor_ckpt_to_keep` forgets checkpoints saved before a
restart, deletes only actor/ and never a partial save; trl's save_total_limit is off too). The
policy is `decide`, a pure function from the listed checkpoints and their protections to one
Verdict each; `prune_run` lists, decides and removes under the run's checkpoint lock.

Checkpoints are read only through hpc_grpo.runstate.checkpoints. Completeness is checked in full only where
it changes a verdict (newest first until keep_last complete ones are found, milestones, the best):
a checkpoint that goes either way is not opened, which keeps listing 1,000 checkpoints fast. Resume
preparation does not use this module and always checks in full.

Files in RUN_DIR: leases/step_N.HOST.PID.lease (readers: evaluation, export), .checkpoints.lock (while held).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout
from hpc_grpo.runstate.metrics import read_raw  # the one reader of metrics.jsonl (both engines)
from hpc_grpo.runstate.runs import checkpoint_lock

LEASE_MAX_AGE_S = 2 * 86400
WORKERS = 8  # threads for listing and removal (tools/bench_prune.py measures 1 against 8)  # a lease from another host whose holder cannot be asked is trusted this long


# ---------------------------------------------------------------------------------------- policy
@dataclass(frozen=True, slots=True)
class Policy:
    keep_last: int = 3
    keep_every: int | None = None
    keep_best: str | None = None  # metric name (fnmatch pattern allowed)
    best_mode: str = "max"
    max_bytes: int | None = None
    grace_s: float = 600.0
    quarantine_s: float = 7 * 86400.0

    @classmethod
    def from_recipe(cls, ckpt: Any, **overrides: Any) -> Policy:
        """The recipe's checkpoint section, with command-line overrides (None = not given)."""
        best = overrides.pop("keep_best", None) or ckpt.keep_best
        metric, mode = split_best(best)
        base = cls(keep_last=ckpt.keep_last, keep_every=ckpt.keep_every, keep_best=metric, best_mode=mode,
                   max_bytes=ckpt.max_bytes, grace_s=float(ckpt.grace_s), quarantine_s=ckpt.quarantine_days * 86400)
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})


def split_best(value: str | None) -> tuple[str | None, str]:
    if not value:
        return None, "max"
    metric, _, mode = value.rpartition(":") if value.endswith((":max", ":min")) else (value, "", "max")
    return metric, mode or "max"


@dataclass(frozen=True, slots=True)
class Item:
    """One checkpoint as prune sees it; complete is None when it was not opened (its verdict does not depend on it)."""

    step: int
    path: Path
    complete: bool | None
    reason: str
    size_bytes: int
    mtime: float
    export_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Protections:
    now: float
    tracker_step: int | None = None
    leased: frozenset[int] = frozenset()
    metrics: dict[int, float] = field(default_factory=dict)  # step -> value of the keep-best metric


@dataclass(frozen=True, slots=True)
class Verdict:
    step: int
    path: Path
    keep: bool
    reason: str
    protected: bool
    complete: bool | None
    size_bytes: int
    export_bytes: int

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def best_step(items: Sequence[Item], prot: Protections, policy: Policy) -> int | None:
    """The complete checkpoint with the best metric (ties: the newest)."""
    scored = [(prot.metrics[i.step], i.step) for i in items if i.complete and i.step in prot.metrics]
    if not scored:
        return None
    pick = max(scored) if policy.best_mode == "max" else min(scored, key=lambda t: (t[0], -t[1]))
    return pick[1]


def decide(items: Sequence[Item], policy: Policy, prot: Protections) -> list[Verdict]:
    """One verdict per checkpoint, oldest first. Pure: no file is read.

    Hard protections (never removed, max_bytes included): the newest complete checkpoint, the tracker's step,
    a leased step, one younger than grace_s, an incomplete one newer than the newest complete (a save under way,
    or a crash resume preparation sets aside). Then keep_last / keep_every / keep_best; incomplete ones older than
    the newest complete go; max_bytes drops the oldest soft-kept ones (milestones, then keep-last, then best).
    """
    items = sorted(items, key=lambda i: i.step)
    complete = [i for i in items if i.complete]
    newest = complete[-1].step if complete else None
    hard: dict[int, str] = {}
    for i in items:
        why = []
        if i.complete and i.step == newest:
            why.append("newest complete checkpoint")
        if prot.tracker_step is not None and i.step == prot.tracker_step:
            why.append("verl's tracker names this step")
        if i.step in prot.leased:
            why.append("leased by a reader (evaluation/export)")
        age = prot.now - i.mtime
        if age < policy.grace_s:
            why.append(f"written {max(age, 0):.0f}s ago (grace {policy.grace_s:.0f}s)")
        if i.complete is False and (newest is None or i.step > newest):
            why.append(f"incomplete, newer than the newest complete one ({i.reason})")
        if why:
            hard[i.step] = "; ".join(why)
    soft: dict[int, tuple[int, str]] = {}  # step -> (drop priority: lower goes first under max_bytes, reason)
    for i in complete[::-1][: policy.keep_last]:
        soft[i.step] = (1, f"one of the {policy.keep_last} newest complete")
    if policy.keep_every:
        for i in complete:
            if i.step % policy.keep_every == 0 and i.step not in soft:
                soft[i.step] = (0, f"milestone (every {policy.keep_every} steps)")
    best = best_step(items, prot, policy) if policy.keep_best else None
    if best is not None:
        soft[best] = (2, f"best {policy.keep_best}={prot.metrics[best]:.4g} ({policy.best_mode})")

    keep: dict[int, str] = {}
    removed: dict[int, str] = {}
    for i in items:
        if i.step in hard:
            keep[i.step] = hard[i.step]
        elif i.step in soft:
            keep[i.step] = soft[i.step][1]
        elif i.complete is False:
            removed[i.step] = f"incomplete, older than the newest complete step {newest} ({i.reason})"
        else:
            note = "" if i.complete else " (not opened: removed either way)"
            removed[i.step] = f"not among the {policy.keep_last} newest complete, no milestone, not the best{note}"
    if policy.max_bytes is not None:
        by_step = {i.step: i for i in items}
        total = sum(by_step[s].size_bytes + by_step[s].export_bytes for s in keep)
        order = sorted((soft[s][0], s) for s in keep if s not in hard)
        for _, s in order:
            if total <= policy.max_bytes:
                break
            total -= by_step[s].size_bytes + by_step[s].export_bytes
            removed[s] = f"over max_bytes {policy.max_bytes}: {keep.pop(s)}, but oldest of its kind"
    return [
        Verdict(i.step, i.path, i.step in keep, keep.get(i.step) or removed[i.step], i.step in hard, i.complete,
                i.size_bytes, i.export_bytes)
        for i in items
    ]


def decide_quarantine(entries: Sequence[tuple[Path, float, int]], policy: Policy, now: float) -> list[Verdict]:
    """checkpoints-incomplete/ entries (path, time set aside, bytes): removed once older than quarantine_s."""
    out = []
    for path, since, size in entries:
        age = now - since
        gone = age > policy.quarantine_s
        why = (f"set aside {age / 86400:.1f} days ago (retention {policy.quarantine_s / 86400:g} days)")
        out.append(Verdict(-1, path, not gone, why, False, False, size, 0))
    return out


# --------------------------------------------------------------------------------------- leases
def _lease_files(run_dir: Path) -> Iterator[tuple[int, str, int, Path]]:
    folder = layout.leases_dir(run_dir)
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        lease = layout.parse_lease(name)
        if lease is not None:
            yield *lease, folder / name


def active_leases(run_dir: Path, now: float | None = None) -> frozenset[int]:
    """Steps a live reader holds. A lease of this host whose process is gone is stale (ignored)."""
    now = time.time() if now is None else now
    host = socket.gethostname()
    steps = set()
    for step, lhost, pid, path in _lease_files(run_dir):
        if lhost == host:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
        else:
            try:
                if now - path.lstat().st_mtime > LEASE_MAX_AGE_S:
                    continue
            except OSError:
                continue
        steps.add(step)
    return frozenset(steps)


@contextmanager
def lease(run_dir: Path, step: int) -> Iterator[Path]:
    """Hold checkpoint `step` (and its export) against pruning while reading it: evaluation and export take one.

    The lease file is created under the run's checkpoint lock, so a prune already deciding finishes first and
    one starting later sees the lease. After entering, check the checkpoint still exists (a prune may have
    removed it just before). The file goes when the block ends; a crashed holder's lease is ignored later.
    """
    run_dir = Path(run_dir)
    path = layout.lease_file(run_dir, step, socket.gethostname(), uuid.uuid4().hex[:8], os.getpid())
    with checkpoint_lock(run_dir):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"step": int(step), "pid": os.getpid(), "time": time.time()}) + "\n")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


# -------------------------------------------------------------------------------------- metrics
def _flatten(prefix: str, data: Any, out: dict[str, float]) -> None:
    if isinstance(data, dict):
        for k, v in data.items():
            _flatten(f"{prefix}/{k}" if prefix else str(k), v, out)
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        out[prefix] = float(data)


def logged_metrics(run_dir: Path, engine: str) -> dict[int, dict[str, float]]:
    """step -> {metric: value} from every record hpc-grpo knows, later sources winning:
    RUN_DIR/metrics.jsonl (flat lines, or verl's file-logger lines {"step", "data"}), trl's
    trainer_state.json log_history (newest checkpoint that has one), and RUN_DIR/eval/step_N.json
    (numeric leaves of its "metrics" object, else of the whole file, as eval/<path>: eval/gsm8k/strict_match)."""
    run_dir = Path(run_dir)
    out: dict[int, dict[str, float]] = {}

    def put(step: Any, row: dict[str, Any]) -> None:
        if isinstance(step, int) and not isinstance(step, bool):
            flat: dict[str, float] = {}
            _flatten("", row, flat)
            out.setdefault(step, {}).update(flat)

    for step, raw in read_raw(layout.metrics_file(run_dir)).items():
        put(step, raw)
    if engine == "trl":
        for _, path in reversed(candidates(run_dir, engine)):
            state = ck.trainer_state(path)
            if state is None or "log_history" not in state:
                continue
            history = state["log_history"]
            for row in history if isinstance(history, list) else []:
                if isinstance(row, dict):
                    put(row.get("step"), {k: v for k, v in row.items() if k != "step"})
            break
    for step, path in layout.eval_results(run_dir):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        flat: dict[str, float] = {}
        # evaluation's files keep their scores under "metrics" (eval/gsm8k/strict_match); other numbers too
        scores = data.get("metrics") if isinstance(data, dict) and isinstance(data.get("metrics"), dict) else data
        _flatten("eval", scores, flat)
        flat.pop("eval/step", None)
        out.setdefault(step, {}).update(flat)
    return out


def metric_per_checkpoint(logged: dict[int, dict[str, float]], steps: Sequence[int], metric: str) -> dict[int, float]:
    """A checkpoint's value: the metric logged at its step, else the last one logged since the previous checkpoint.
    `metric` may be an fnmatch pattern (val-core/*/reward/mean@1); it must match one key per step."""
    def value(row: dict[str, float]) -> float | None:
        if metric in row:
            return row[metric]
        hits = [k for k in row if fnmatch.fnmatchcase(k, metric)]
        return row[hits[0]] if len(hits) == 1 else None

    out: dict[int, float] = {}
    prev = -1
    for s in sorted(steps):
        found = [(ls, v) for ls, row in logged.items() if prev < ls <= s and (v := value(row)) is not None]
        if found:
            out[s] = max(found)[1]
        prev = s
    return out


# --------------------------------------------------------------------------------------- listing
def candidates(run_dir: Path, engine: str) -> list[tuple[int, Path]]:
    """(step, entry) of every checkpoint-named entry, oldest first, none opened: the cheap first pass.
    Names come from checkpoints.FOLDER_RE, so the layout knowledge stays in that module."""
    pattern = ck.FOLDER_RE[engine]
    try:
        with os.scandir(layout.checkpoints_dir(run_dir)) as it:
            found = [(int(m.group(1)), Path(e.path)) for e in it if (m := pattern.match(e.name))]
    except OSError:
        return []
    return sorted(found)


def footprint(path: Path) -> tuple[int, float]:
    """Bytes of regular files below path and their newest mtime (symlinks not followed, not counted)."""
    size, newest = 0, 0.0
    stack = [os.fspath(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                        newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
                    elif e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        size += st.st_size
                        newest = max(newest, st.st_mtime)
        except OSError:
            continue
    if not newest:
        try:
            newest = os.lstat(path).st_mtime
        except OSError:
            pass
    return size, newest


def _parallel(fn: Any, args: Sequence[Any], workers: int | None = None) -> list[Any]:
    """Threads pay on many entries (stat and unlink release the GIL; parallel filesystems serve them at once)."""
    workers = workers or WORKERS
    if len(args) < 16 or workers == 1:
        return [fn(a) for a in args]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, args))


def scan(run_dir: Path, engine: str, policy: Policy, prot: Protections) -> list[Item]:
    """Every checkpoint with size and mtime; completeness opened only where it can change a verdict."""
    run_dir = Path(run_dir)
    found = candidates(run_dir, engine)
    prints = _parallel(lambda sp: footprint(sp[1]) if not sp[1].is_symlink() else (0, os.lstat(sp[1]).st_mtime), found)
    exports = _parallel(lambda sp: footprint(layout.export_dir(run_dir, sp[0]))[0], found)
    items = {s: Item(s, p, None, "not opened", sz, mt, ex) for (s, p), (sz, mt), ex in zip(found, prints, exports)}

    def check(step: int) -> bool:
        it = items[step]
        if it.complete is None:
            c = ck.judge(it.path, engine, step)
            items[step] = replace(it, complete=c.complete, reason=c.reason)
        return bool(items[step].complete)

    n_complete = 0
    for step in sorted(items, reverse=True):  # newest first, until keep_last complete ones are known
        if n_complete >= max(policy.keep_last, 1):
            break
        n_complete += check(step)
    if policy.keep_every:
        for step in items:
            if step % policy.keep_every == 0:
                check(step)
    if policy.keep_best:
        # best first, ties newest first: the same order best_step() picks in
        sign = 1 if policy.best_mode == "max" else -1
        order = sorted((s for s in items if s in prot.metrics), key=lambda s: (sign * prot.metrics[s], s), reverse=True)
        for step in order:
            if check(step):
                break
    return [items[s] for s in sorted(items)]


def quarantined(run_dir: Path) -> list[tuple[Path, float, int]]:
    """checkpoints-incomplete/ entries: (path, when set aside: ctime of the entry, which a move updates, bytes)."""
    folder = layout.quarantine_dir(run_dir)
    out = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for e in entries:
        st = e.stat(follow_symlinks=False)
        size = footprint(Path(e.path))[0] if e.is_dir(follow_symlinks=False) else 0
        out.append((Path(e.path), max(st.st_ctime, st.st_mtime), size))
    return sorted(out)


# -------------------------------------------------------------------------------------- removal
class UnsafePath(RuntimeError):
    """A removal target is not a direct entry of the folder it must be in."""


def remove_entry(path: Path, folder: Path) -> None:
    """Remove one entry of `folder` without following links: a symlink is unlinked (never what it points at),
    a folder is removed by shutil.rmtree's fd-based walk (it does not descend through symlinks)."""
    real_folder = os.path.realpath(folder)
    if os.path.realpath(path.parent) != real_folder or path.name in ("", ".", "..") or "/" in path.name:
        raise UnsafePath(f"{path} is not an entry of {folder}")
    target = os.path.join(real_folder, path.name)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        if not shutil.rmtree.avoids_symlink_attacks:  # pragma: no cover - Linux has the fd-based walk
            raise UnsafePath("this platform's shutil.rmtree may follow symlinks: refusing to remove")
        shutil.rmtree(target)
    else:
        os.unlink(target)


@dataclass
class PruneResult:
    run_dir: Path
    engine: str
    policy: Policy
    verdicts: list[Verdict]
    quarantine: list[Verdict]
    dry_run: bool
    freed_bytes: int = 0
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir), "engine": self.engine, "dry_run": self.dry_run,
            "policy": asdict(self.policy), "freed_bytes": self.freed_bytes,
            "checkpoints": [v.as_dict() for v in self.verdicts],
            "quarantine": [v.as_dict() for v in self.quarantine],
            "errors": self.errors, "notes": self.notes,
        }


def prune_run(run_dir: Path, engine: str, policy: Policy, *, dry_run: bool = False, now: float | None = None,
              lock_timeout_s: float | None = 600.0) -> PruneResult:
    """List, decide and (unless dry_run) remove, all under the run's checkpoint lock so no save, resume
    preparation, second prune or new lease interleaves. Exports go with their checkpoint."""
    run_dir = Path(run_dir)
    with checkpoint_lock(run_dir, timeout_s=7 * 86400 if lock_timeout_s is None else lock_timeout_s):
        now = time.time() if now is None else now
        logged = logged_metrics(run_dir, engine) if policy.keep_best else {}
        steps = [s for s, _ in candidates(run_dir, engine)]
        metrics = metric_per_checkpoint(logged, steps, policy.keep_best) if policy.keep_best else {}
        tracker = ck.tracker_step(run_dir) if engine == "verl" else None
        prot = Protections(now=now, tracker_step=tracker, leased=active_leases(run_dir, now), metrics=metrics)
        items = scan(run_dir, engine, policy, prot)
        verdicts = decide(items, policy, prot)
        qverdicts = decide_quarantine(quarantined(run_dir), policy, now)
        result = PruneResult(run_dir, engine, policy, verdicts, qverdicts, dry_run)
        if policy.keep_best and not metrics:
            result.notes.append(f"no logged values of {policy.keep_best}: keep_best kept nothing extra")
        if policy.max_bytes is not None:
            kept = sum(v.size_bytes + v.export_bytes for v in verdicts if v.keep)
            if kept > policy.max_bytes:
                result.notes.append(f"protected checkpoints alone hold {kept} bytes, over max_bytes {policy.max_bytes}")
        gone = [v for v in verdicts if not v.keep]
        result.freed_bytes = sum(v.size_bytes + v.export_bytes for v in gone)
        result.freed_bytes += sum(v.size_bytes for v in qverdicts if not v.keep)
        if dry_run:
            return result
        ckpt_folder = layout.checkpoints_dir(run_dir)
        jobs: list[tuple[Path, Path]] = []
        for v in gone:
            jobs.append((v.path, ckpt_folder))
            export = layout.export_dir(run_dir, v.step)
            if os.path.lexists(export):
                jobs.append((export, layout.exports_dir(run_dir)))
        jobs += [(v.path, layout.quarantine_dir(run_dir)) for v in qverdicts if not v.keep]

        def remove(job: tuple[Path, Path]) -> str:
            try:
                remove_entry(*job)
                return ""
            except (OSError, UnsafePath) as exc:
                return f"{job[0]}: {exc}"

        result.errors = [e for e in _parallel(remove, jobs) if e]
        return result


def fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def prune_spec(run_dir: Path, *, lock_timeout_s: float | None = 600.0, **overrides: Any) -> PruneResult:
    """The recipe's policy applied to a run (what jobs call at start, after saves and at the end)."""
    from hpc_grpo.config.resolve import load_frozen

    spec = load_frozen(layout.spec_file(run_dir))
    policy = Policy.from_recipe(spec.recipe.checkpoint, **overrides)
    return prune_run(Path(run_dir), spec.recipe.engine, policy, lock_timeout_s=lock_timeout_s)


def summary(result: PruneResult) -> str:
    """One log line for jobs."""
    kept = [v.step for v in result.verdicts if v.keep]
    gone = [v.step for v in result.verdicts if not v.keep]
    q = sum(1 for v in result.quarantine if not v.keep)
    verb = "would remove" if result.dry_run else "removed"
    extra = f", {q} quarantined" if q else ""
    errs = f"; {len(result.errors)} error(s): {result.errors[0]}" if result.errors else ""
    return f"prune: kept steps {kept or '-'}, {verb} {gone or '-'}{extra} ({fmt_bytes(result.freed_bytes)}){errs}"


def job_prune(run_dir: Path, when: str, log: Any = print, lock_timeout_s: float = 120.0,
              **overrides: Any) -> PruneResult | None:
    """Apply the run's policy from inside a job (start, after a save, end). Never fails the job: a busy lock or a
    filesystem error is logged and retried at the next occasion. trl's job passes grace_s=0: its saves hold the
    checkpoint lock, so while prune holds it nothing is being written (verl's saves do not: the grace applies)."""
    from hpc_grpo.common.yamlio import SpecError

    try:
        result = prune_spec(Path(run_dir), lock_timeout_s=lock_timeout_s, **overrides)
    except (TimeoutError, OSError, SpecError) as exc:
        log(f"prune ({when}) skipped: {exc}")
        return None
    log(f"{summary(result)} [{when}]")
    return result
