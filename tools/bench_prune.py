#!/usr/bin/env python3
"""Benchmark of `hpc-grpo prune-ckpts`: removal against `rm -rf`, and listing 1,000 checkpoints.

    ./.venv/bin/python tools/bench_prune.py [--ckpts 200] [--world 21] [--list 1000] [--repeat 3]

Synthetic verl FSDP trees under /tmp (deleted afterwards): each global_step_N holds 3 x world shard files
(world 21: 63) plus data.pt, i.e. 64 shard files, each a small but whole torch zip. Removal: two identical
trees; prune (keep_last 1, so it removes all but the newest: listing, decisions, lock and removal timed
together) on one, `rm -rf` of the same folders on the other, alternating which goes first. Listing: a
dry-run prune of a 1,000-checkpoint tree in a fresh process (nothing cached: no verdict cache exists), and
the full check of every checkpoint (checkpoints.list_checkpoints, what resume preparation pays) beside it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def torch_bytes(payload: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"x" * payload)
    return buf.getvalue()


def build(run: Path, n: int, world: int, payload: int) -> None:
    blob = torch_bytes(payload)
    ckpts = run / "checkpoints"
    old = time.time() - 86400
    for step in range(1, n + 1):
        actor = ckpts / f"global_step_{step}" / "actor"
        actor.mkdir(parents=True)
        (actor / "fsdp_config.json").write_text(json.dumps({"world_size": world}))
        for rank in range(world):
            for kind in ("model", "optim", "extra_state"):
                (actor / f"{kind}_world_size_{world}_rank_{rank}.pt").write_bytes(blob)
        (actor.parent / "data.pt").write_bytes(blob)
        for p in (*actor.iterdir(), actor, actor.parent / "data.pt", actor.parent):
            os.utime(p, (old + step, old + step))
    (ckpts / "latest_checkpointed_iteration.txt").write_text(str(n))


def time_prune(run: Path, workers: int) -> tuple[float, int]:
    from hpc_grpo.runstate import prune, retention

    prune.WORKERS = workers
    t0 = time.perf_counter()
    result = prune.prune_run(run, "verl", retention.Policy(keep_last=1, grace_s=0))
    dt = time.perf_counter() - t0
    assert not result.errors, result.errors[:3]
    return dt, sum(not v.keep for v in result.verdicts)


def time_rm(run: Path, keep: str) -> float:
    ckpts = run / "checkpoints"
    targets = sorted(str(p) for p in ckpts.iterdir() if p.name.startswith("global_step_") and p.name != keep)
    t0 = time.perf_counter()
    subprocess.run(["rm", "-rf", "--", *targets], check=True)
    return time.perf_counter() - t0


LIST_PROBE = """
import sys, time, json
t0 = time.perf_counter()
from hpc_grpo.runstate import prune, retention
t1 = time.perf_counter()
c1 = time.process_time()
r = prune.prune_run(sys.argv[1], "verl", retention.Policy(keep_last=3, keep_every=100, grace_s=0), dry_run=True)
t2 = time.perf_counter()
cpu = time.process_time() - c1
from hpc_grpo.runstate import checkpoints
full = checkpoints.list_checkpoints(sys.argv[1], "verl")
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "prune_list_s": t2 - t1, "n": len(r.verdicts),
                  "opened": sum(v.complete is not None for v in r.verdicts), "full_check_s": t3 - t2, "list_cpu_s": cpu,
                  "n_full": len(full)}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpts", type=int, default=200)
    ap.add_argument("--world", type=int, default=21, help="FSDP world size: 3 x world + 1 shard files each")
    ap.add_argument("--payload", type=int, default=256, help="bytes inside each shard's zip")
    ap.add_argument("--list", type=int, default=1000, help="checkpoints in the listing tree")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-prune-", dir="/tmp"))
    try:
        prune_t, serial_t, rm_t = [], [], []
        for i in range(args.repeat):
            a, b, c = tmp / f"a{i}", tmp / f"b{i}", tmp / f"c{i}"
            for d in (a, b, c):
                build(d, args.ckpts, args.world, args.payload)
            files = sum(len(f) for _, _, f in os.walk(a / "checkpoints" / "global_step_1"))
            os.sync()
            order = [("rm", b), ("prune", a), ("serial", c)]
            for kind, d in order[i % 3:] + order[: i % 3]:  # rotate who goes first
                if kind == "rm":
                    rm_t.append(time_rm(d, f"global_step_{args.ckpts}"))
                    continue
                dt, removed = time_prune(d, 8 if kind == "prune" else 1)
                (prune_t if kind == "prune" else serial_t).append(dt)
                assert removed == args.ckpts - 1
            assert sorted(os.listdir(a / "checkpoints")) == sorted(os.listdir(b / "checkpoints"))
            for d in (a, b, c):
                shutil.rmtree(d)
        p, s1, r = statistics.median(prune_t), statistics.median(serial_t), statistics.median(rm_t)
        print(f"removal of {args.ckpts - 1} checkpoints x {files} files: prune (8 threads) {p:.3f} s, prune (1 thread) "
              f"{s1:.3f} s, rm -rf {r:.3f} s: ratio {p / r:.2f}x, serial {s1 / r:.2f}x (target <= 1.5x) "
              f"[runs: prune {', '.join(f'{x:.3f}' for x in prune_t)}; serial {', '.join(f'{x:.3f}' for x in serial_t)}; "
              f"rm {', '.join(f'{x:.3f}' for x in rm_t)}]")
        lst = tmp / "list"
        t0 = time.perf_counter()
        build(lst, args.list, args.world, args.payload)
        print(f"built {args.list} checkpoints in {time.perf_counter() - t0:.1f} s")
        proc = subprocess.run([sys.executable, "-c", LIST_PROBE, str(lst)], capture_output=True, text=True,
                              cwd=REPO, check=True)
        m = json.loads(proc.stdout)
        print(f"listing {m['n']} checkpoints (fresh process, dry-run prune keep_last 3 keep_every 100): "
              f"{m['prune_list_s']:.3f} s ({m['list_cpu_s']:.3f} s CPU), {m['opened']} opened in full (target < 1 s); "
              f"full check of all {m['n_full']} (resume preparation's path): {m['full_check_s']:.3f} s")
        print(json.dumps({"prune_s": p, "prune_serial_s": s1, "rm_s": r, "ratio": p / r, **m}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
