#!/usr/bin/env python3
"""Build the tiny random Qwen2 test model (offline; no Hub access needed).

Usage: python tools/build_tiny_model.py --out runs/tiny-qwen2 [--seed 0] [--force]
Without --force an existing model (config.json present) is kept, so CI can call this every time.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

try:
    from hpc_grpo.data.tiny_model import ensure_tiny_model
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hpc_grpo.data.tiny_model import ensure_tiny_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and tokenizer corpus (default 0)")
    parser.add_argument("--force", action="store_true", help="rebuild even if OUT already holds a model")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    if args.force and args.out.exists():
        if not (args.out / "config.json").is_file():
            parser.error(f"{args.out} exists but holds no model (no config.json); refusing to delete it")
        shutil.rmtree(args.out)
    existed = (args.out / "config.json").is_file()
    path = ensure_tiny_model(args.out, seed=args.seed)
    verb = "kept existing" if existed else "built"
    print(f"{verb} tiny model at {path} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
