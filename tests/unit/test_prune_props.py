"""Property tests of retention over random checkpoint trees in each engine's layout (hypothesis).

Trees hold whole and broken checkpoints (missing or truncated shard, cut manifest), symlinks out of the
checkpoint folder (as a checkpoint entry and inside a checkpoint), a tracker naming any step (or garbage),
leases and fresh mtimes. Checked on every tree: no protected checkpoint is removed, nothing outside the
checkpoint folder changes, and what stays on disk is exactly what an independent statement of the policy
keeps (written here from the documented rules, docs/guide.md, not by calling retention.decide).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout, metrics, prune, retention
from hpc_grpo.runstate.layout import CHECKPOINT_LOCK
from tests.prune_trees import MAKERS, set_mtime, snapshot

NOW = time.time()
OLD = NOW - 10 * 86400

trees = st.fixed_dictionaries({
    "layout": st.sampled_from(sorted(MAKERS)),
    "ckpts": st.dictionaries(st.integers(1, 40), st.sampled_from(("whole", "whole", "whole", "missing", "truncated")),
                             min_size=0, max_size=9),
    "young": st.sets(st.integers(1, 40), max_size=2),
    "leased": st.sets(st.integers(1, 40), max_size=2),
    "tracker": st.one_of(st.none(), st.integers(0, 45), st.just("garbage")),
    "link_entry": st.one_of(st.none(), st.integers(1, 40)),
    "inner_link": st.booleans(),
    "keep_last": st.integers(1, 4),
    "keep_every": st.one_of(st.none(), st.integers(2, 10)),
    "best": st.one_of(st.none(), st.sampled_from(("max", "min"))),
    "metric": st.dictionaries(st.integers(1, 40), st.floats(0, 1, allow_nan=False), max_size=8),
    "max_bytes": st.one_of(st.none(), st.integers(0, 40_000)),
})


def build(root: Path, t: dict) -> tuple[Path, Path, str]:
    run = root / "run"
    outside = root / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / "weights.pt").write_bytes(b"precious")
    ckpt_dir = run / "checkpoints"
    ckpt_dir.mkdir(parents=True)
    engine = "trl" if t["layout"] == "trl" else "verl"
    for step, how in t["ckpts"].items():
        d = MAKERS[t["layout"]](ckpt_dir, step, how)
        if t["inner_link"]:
            os.symlink(outside / "victim", d / "link_out")
        set_mtime(d, NOW - 30 if step in t["young"] else OLD + step)
    name = "checkpoint-{}" if engine == "trl" else "global_step_{}"
    if t["link_entry"] is not None and t["link_entry"] not in t["ckpts"]:
        link = ckpt_dir / name.format(t["link_entry"])
        os.symlink(outside / "victim", link)
        os.utime(link, (OLD, OLD), follow_symlinks=False)
    if t["tracker"] is not None:
        (ckpt_dir / ck.TRACKER).write_text(str(t["tracker"]))
    for step in t["leased"]:
        (run / layout.LEASES_DIR).mkdir(exist_ok=True)
        (run / layout.LEASES_DIR / f"step_{step}.{os.uname().nodename}.abcd.{os.getpid()}.lease").write_text("{}")
    if t["metric"]:
        (run / layout.METRICS_FILE).write_text("".join(f'{{"step": {s}, "score": {v}}}\n' for s, v in t["metric"].items()))
    return run, outside, engine


def expected(run: Path, engine: str, t: dict, policy: retention.Policy) -> tuple[set[int], set[int]]:
    """(kept steps, protected steps) from the documented rules, on fully checked checkpoints."""
    full = {c.step: c for c in ck.list_checkpoints(run, engine)}
    complete = sorted(s for s, c in full.items() if c.complete)
    newest = complete[-1] if complete else None
    tracker = t["tracker"] if engine == "verl" and isinstance(t["tracker"], int) else None
    protected = set()
    for s in full:
        young = s in t["young"] and s in t["ckpts"]  # only real folders get a fresh mtime (a link entry stays old)
        if (s == newest or s == tracker or s in t["leased"] or young
                or (not full[s].complete and (newest is None or s > newest))):
            protected.add(s)
    soft: list[tuple[int, int]] = [(1, s) for s in complete[::-1][: policy.keep_last]]
    if policy.keep_every:
        soft += [(0, s) for s in complete if s % policy.keep_every == 0 and s not in complete[::-1][: policy.keep_last]]
    if policy.keep_best:
        vals = retention.metric_per_checkpoint(metrics.logged_metrics(run, engine), sorted(full), "score")
        scored = [(vals[s], s) for s in complete if s in vals]
        if scored:
            b = max(scored)[1] if policy.best_mode == "max" else min(scored, key=lambda x: (x[0], -x[1]))[1]
            soft = [x for x in soft if x[1] != b] + [(2, b)]
    kept = protected | {s for _, s in soft}
    if policy.max_bytes is not None:
        size = {s: full[s].size_bytes for s in full}
        total = sum(size[s] for s in kept)
        for _, s in sorted(x for x in soft if x[1] not in protected):
            if total <= policy.max_bytes:
                break
            if s in kept:
                kept.discard(s)
                total -= size[s]
    return kept, protected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=trees, dry=st.booleans())
def test_prune_keeps_exactly_the_policy(t: dict, dry: bool) -> None:
    root = Path(tempfile.mkdtemp(prefix="prune-prop-"))
    try:
        run, outside, engine = build(root, t)
        policy = retention.Policy(keep_last=t["keep_last"], keep_every=t["keep_every"],
                              keep_best="score" if t["best"] else None, best_mode=t["best"] or "max",
                              max_bytes=t["max_bytes"], grace_s=600)
        want_kept, protected = expected(run, engine, t, policy)
        before_outside, before_run = snapshot(outside), snapshot(root / "run")
        result = prune.prune_run(run, engine, policy, dry_run=dry, now=NOW)
        assert not result.errors
        assert snapshot(outside) == before_outside  # nothing outside the folder, through any link
        assert {v.step for v in result.verdicts if v.keep} == want_kept
        assert {v.step for v in result.verdicts if v.protected} == protected
        left = {s for s, _ in ck.candidates(run, engine)}
        if dry:
            after = snapshot(root / "run")
            assert CHECKPOINT_LOCK not in after  # the lock file goes when the lock is released
            assert after == before_run  # --dry-run changes nothing
        else:
            assert protected <= left, f"protected steps {sorted(protected - left)} were removed"
            assert left == want_kept
            assert result.freed_bytes == sum(v.size_bytes for v in result.verdicts if not v.keep)
    finally:
        shutil.rmtree(root)
