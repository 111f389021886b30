"""Run `hpc-grpo import` and `plan` over a folder of verl launch scripts and count what happens to each.

The corpus itself (verl's published example scripts) is not part of this repository: fetch verl and point this at
its examples/ folder. Nothing is executed: each script is only read. Usage:

    PYTHONPATH=$PWD .venv/bin/python tools/import_corpus.py /path/to/verl/examples [--cluster h100-efa] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

TRAINER = re.compile(r"-m\s+\S*(main_ppo|main_dapo)\b")


def one(path: Path, root: Path, cluster: str) -> dict:
    """Import one script and plan the recipe it becomes; never raises."""
    from hpc_grpo.common.yamlio import SpecError
    from hpc_grpo.engines.verl_import import UNUSABLE, import_script
    from hpc_grpo.engines.verl_script import parse_script
    from hpc_grpo.engines.verl_keymap import resolve_with_verl_keys
    from hpc_grpo.planning.plan import run_plan

    row: dict = {"script": str(path)}
    name = "c-" + re.sub(r"[^a-z0-9-]+", "-", path.stem.lower()).strip("-")[:50]
    try:
        result = import_script(path.read_text(errors="replace"), name, source=path)
    except SpecError as exc:
        row.update(outcome="refused", why=f"{exc.key}: {exc}")
        return row
    except Exception:  # noqa: BLE001 - counting tracebacks is the point
        row.update(outcome="traceback", why=traceback.format_exc(limit=3)[-600:])
        return row
    script = result.script
    items = {r.item for r in result.rows}
    every = parse_script(path.read_text(errors="replace")).overrides
    row["dropped_silently"] = [o for o in every if o not in items and o.split("=", 1)[0] not in items]
    row["refused"] = [f"{r.item}: {r.why}" for r in result.rows if r.went == UNUSABLE]
    problems = list(getattr(script, "errors", []))
    row.update(outcome="imported" if not problems else "import-errors", problems=problems,
               overrides=len(script.overrides), to_fill=[f"{k}" for k, _ in getattr(script, "placeholders", [])],
               ignored=list(script.ignored), unresolved=list(script.unresolved), entry=getattr(script, "entry", ""))
    (root / "recipes" / f"{name}.yaml").write_text(result.yaml_text(path.name))
    try:
        spec, _ = resolve_with_verl_keys(name, cluster, ["cluster.runs_root=/nonexistent/runs"], run_name="p")
        plan = run_plan(spec)
        errs = [f"{f.key}: {f.message}" for f in plan.findings if f.severity.value == "error"]
        row.update(plan="ok" if not errs else "errors", plan_errors=errs)
    except SpecError as exc:
        row.update(plan="refused", plan_errors=[f"{exc.key}: {exc}"])
    except Exception:  # noqa: BLE001
        row.update(plan="traceback", plan_errors=[traceback.format_exc(limit=3)[-600:]])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--cluster", default="h100-efa")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--reverse", action="store_true", help="last script first (a second process meets the first)")
    ap.add_argument("--start", type=int, default=0, help="begin at this script of the sorted list (a third process)")
    ap.add_argument("--only", type=Path, help="a file listing the scripts to run, relative to the folder, one a line")
    args = ap.parse_args()
    scripts = sorted((p for p in args.folder.rglob("*.sh") if TRAINER.search(p.read_text(errors="replace"))),
                     reverse=args.reverse)[args.start:]
    if args.only:
        wanted = set(args.only.read_text().split())
        scripts = [p for p in scripts if str(p.relative_to(args.folder)) in wanted]
    root = Path(tempfile.mkdtemp(prefix="import-corpus-"))
    (root / "recipes").mkdir()
    os.environ["HPC_GRPO_PATH"] = str(root)
    rows = []
    for path in scripts:
        row = one(path, root, args.cluster)
        rows.append(row)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        print(f"{row['outcome']:13} {row.get('plan', '-'):9} {path.relative_to(args.folder)}", flush=True)
    counts: dict[str, int] = {}
    for row in rows:
        key = f"{row['outcome']}/{row.get('plan', '-')}"
        counts[key] = counts.get(key, 0) + 1
    print(json.dumps({"scripts": len(rows), **counts}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    sys.exit(0)


if __name__ == "__main__":
    main()
