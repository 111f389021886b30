"""MATH-style problems -> verl parquet and trl jsonl (`hpc-grpo data math --from FILE`), plus the problem/solution
rows lm-eval's MATH task reads (raw/, recorded in source.json as GSM8K's preparer does).

Input: a jsonl or parquet file of rows with `problem` and either `solution` (the answer is its last `\\boxed{}`, as
in MATH) or `answer`. The reference answer is kept as written: the reward normalises both sides when it compares.
Stdlib only at import time (pyarrow loads lazily).
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path
from typing import Any

from hpc_grpo.common.atomic import atomic_write
from hpc_grpo.data.gsm8k import DataError, PrepareResult, _write_jsonl, _write_parquet
from hpc_grpo.rewards.math_boxed import last_boxed

__all__ = ["SHIPPED_PROBLEMS", "DATA_SOURCE", "INSTRUCTION", "load_rows", "record", "prepare_math"]

SHIPPED_PROBLEMS = Path(__file__).resolve().parents[1] / "_data" / "math_tiny.jsonl"
DATA_SOURCE = "hpc_grpo/math"  # verl scores it with the registry's math_boxed function, never by data_source
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
FIX = 'give each row "problem" and "solution" (with a \\boxed{} answer) or "answer", as MATH\'s files have'


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a jsonl or parquet file, each a dict (line numbers kept for errors by position)."""
    if not path.is_file():
        raise DataError(path, None, "no such file", "pass a MATH jsonl or parquet file with --from")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [dict(r) for r in pq.read_table(path).to_pylist()]
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise DataError(path, n, f"not JSON ({exc})", FIX) from None
            if not isinstance(obj, dict):
                raise DataError(path, n, f"expected a JSON object, got {type(obj).__name__}", FIX)
            rows.append(obj)
    return rows


def record(obj: dict[str, Any], source: Path, line: int) -> dict[str, str]:
    """{problem, solution, answer} of one row; DataError naming the row when it has no problem or no answer."""
    problem = obj.get("problem")
    if not isinstance(problem, str) or not problem.strip():
        raise DataError(source, line, "no 'problem' text", FIX)
    solution = obj.get("solution")
    answer = obj.get("answer")
    if answer is None and isinstance(solution, str):
        answer = last_boxed(solution)
    if answer is None or not str(answer).strip():
        raise DataError(source, line, "no answer: neither an 'answer' field nor a \\boxed{} in 'solution'", FIX)
    answer = str(answer).strip()
    # lm-eval's MATH task reads the answer from the solution's last \boxed{}: a row with only an answer gets one
    if not isinstance(solution, str) or last_boxed(solution) is None:
        solution = f"The answer is $\\boxed{{{answer}}}$."
    return {"problem": problem.strip(), "solution": solution, "answer": answer}


def make_prompt(problem: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{problem} {INSTRUCTION}"}]


def to_verl_rows(records: list[dict[str, str]], split: str) -> list[dict[str, Any]]:
    return [{"data_source": DATA_SOURCE, "prompt": make_prompt(r["problem"]), "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": r["answer"]},
             "extra_info": {"split": split, "index": i, "problem": r["problem"]}} for i, r in enumerate(records)]


def to_trl_rows(records: list[dict[str, str]]) -> list[dict[str, Any]]:
    return [{"prompt": make_prompt(r["problem"]), "ground_truth": r["answer"]} for r in records]


def _split(records: list[dict[str, str]], test: list[dict[str, str]] | None, test_every: int
           ) -> dict[str, list[dict[str, str]]]:
    if test is not None:
        return {"train": records, "test": test}
    if test_every <= 0:
        return {"train": records, "test": records}
    return {"train": [r for i, r in enumerate(records) if (i + 1) % test_every],
            "test": [r for i, r in enumerate(records) if not (i + 1) % test_every]}


def _records(path: Path) -> list[dict[str, str]]:
    rows = [record(obj, path, i) for i, obj in enumerate(load_rows(path), 1)]
    if not rows:
        raise DataError(path, None, "holds no rows", FIX)
    return rows


def prepare_math(source: str | os.PathLike[str], out_dir: str | os.PathLike[str], test_source: str | None = None,
                 test_every: int = 4) -> PrepareResult:
    """Validate every row, then write out_dir/{verl,trl,raw}/{train,test}.* and out_dir/source.json. The test split
    is test_source's rows, else every test_every-th row of source (0: the same rows as train); source "tiny" is the
    shipped problems (SHIPPED_PROBLEMS)."""
    source = SHIPPED_PROBLEMS if str(source) == "tiny" else source
    src, out = Path(source).expanduser(), Path(out_dir).expanduser()
    splits = _split(_records(src), _records(Path(test_source).expanduser()) if test_source else None, test_every)
    for name, rows in splits.items():
        if not rows:
            raise DataError(src, None, f"the {name} split is empty", "give more rows, or --test-every 0")
    for kind in ("verl", "trl", "raw"):
        (out / kind).mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        atomic_write(out / "verl" / f"{split}.parquet", partial(_write_parquet, to_verl_rows(rows, split)))
        atomic_write(out / "trl" / f"{split}.jsonl", partial(_write_jsonl, to_trl_rows(rows)))
        atomic_write(out / "raw" / f"{split}.jsonl",
                     partial(_write_jsonl, [{"problem": r["problem"], "solution": r["solution"]} for r in rows]))
    marker = {"source": str(src), "raw_dir": str((out / "raw").resolve()), "data": "math"}
    atomic_write(out / "source.json", lambda p: p.write_text(json.dumps(marker, indent=2) + "\n"))
    return PrepareResult(out, out / "verl" / "train.parquet", out / "verl" / "test.parquet",
                         out / "trl" / "train.jsonl", out / "trl" / "test.jsonl",
                         len(splits["train"]), len(splits["test"]), str(src))
