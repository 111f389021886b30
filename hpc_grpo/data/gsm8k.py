"""GSM8K preparation for both engines: verl parquet and trl jsonl, from local files or the HF Hub.

Row layout and ground truth follow verl's examples/data_preprocess/gsm8k.py so that verl's
built-in gsm8k reward (selected by data_source="openai/gsm8k") scores our files unchanged.
Top-level imports are stdlib only: the CLI imports this module; pyarrow/datasets load lazily.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hpc_grpo.common.atomic import atomic_write
from hpc_grpo.common.yamlio import SpecError

__all__ = [
    "DATA_SOURCE",
    "HF_DATASET",
    "HF_CONFIG",
    "PROMPT_SUFFIX",
    "SPLITS",
    "DataError",
    "PrepareResult",
    "load_jsonl",
    "validate_record",
    "ground_truth",
    "make_prompt",
    "to_verl_rows",
    "to_trl_rows",
    "prepare_gsm8k",
]

DATA_SOURCE = "openai/gsm8k"
HF_DATASET = "openai/gsm8k"
HF_CONFIG = "main"
PROMPT_SUFFIX = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")

# A ground truth verl's strict scorer can ever match: its regex is -?[0-9.,]+ and commas are removed.
_SCORABLE_GT = re.compile(r"-?[0-9.]+")


class DataError(SpecError):
    """Bad input data, located precisely (file and 1-based line) with the fix, so users can act on it."""

    def __init__(self, source: str | os.PathLike[str], line: int | None, problem: str, fix: str) -> None:
        self.source = str(source)
        self.line = line
        self.problem = problem
        self.fix = fix
        where = f"{self.source}:{line}" if line is not None else self.source
        super().__init__(f"{where}: {problem}. Fix: {fix}")


@dataclass(frozen=True)
class PrepareResult:
    """Where prepare_gsm8k wrote its files and how many rows each split has."""

    out_dir: Path
    verl_train: Path
    verl_test: Path
    trl_train: Path
    trl_test: Path
    n_train: int
    n_test: int
    source: str

    @property
    def note(self) -> str:
        """What `hpc-grpo data` adds to its row counts ('' or ', ...')."""
        return ""


def validate_record(obj: Any, source: str | os.PathLike[str], line: int | None) -> dict[str, str]:
    """Check one GSM8K record and return {question, answer}; raise DataError naming the problem."""
    if not isinstance(obj, dict):
        raise DataError(
            source, line, f"expected a JSON object, got {type(obj).__name__}",
            'write one object per line: {"question": "...", "answer": "... #### N"}',
        )
    missing = [k for k in ("question", "answer") if k not in obj]
    if missing:
        got = ", ".join(sorted(map(str, obj))) or "none"
        raise DataError(
            source, line, f"missing field(s) {', '.join(missing)} (fields present: {got})",
            "each line needs the GSM8K fields 'question' and 'answer'; rename the fields if they are spelled differently",
        )
    for key in ("question", "answer"):
        value = obj[key]
        if not isinstance(value, str):
            raise DataError(source, line, f"field '{key}' is {type(value).__name__}, not a string",
                            f"store '{key}' as a JSON string")
        if not value.strip():
            raise DataError(source, line, f"field '{key}' is empty", f"give a non-empty '{key}' or drop the line")
    answer = obj["answer"]
    if "#### " not in answer:
        raise DataError(
            source, line, "answer has no '#### ' final-answer marker",
            "end the answer with a line '#### N' holding the final number, as in GSM8K",
        )
    gt = ground_truth(answer)
    if not _SCORABLE_GT.fullmatch(gt):
        raise DataError(
            source, line, f"final answer {gt!r} after '#### ' is not a plain number",
            "write the final answer as a number such as 42, -3 or 1,234.5 (verl's scorer matches only -?[0-9.,]+)",
        )
    return {"question": obj["question"], "answer": answer}


def load_jsonl(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """Read and fully validate a GSM8K jsonl file. Blank lines are skipped; any bad line raises DataError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(path, None, "file not found", "point to a folder holding train.jsonl and test.jsonl") from None
    except UnicodeDecodeError as exc:
        raise DataError(path, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                        "re-encode the file as UTF-8") from None
    records: list[dict[str, str]] = []
    # split on "\n" only: str.splitlines would also break on U+2028 etc. inside JSON strings
    for lineno, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DataError(path, lineno, f"invalid JSON ({exc.msg} at column {exc.colno})",
                            "make every line one complete JSON object (jsonl: no pretty-printing across lines)") from None
        records.append(validate_record(obj, path, lineno))
    if not records:
        raise DataError(path, 1, "file is empty (no records)", "fill it with GSM8K records, one JSON object per line")
    return records


def ground_truth(answer: str) -> str:
    """The reference answer verl compares against: text after the last '#### ', commas removed, stripped."""
    if "#### " not in answer:
        raise ValueError("answer has no '#### ' marker")
    return answer.rsplit("#### ", 1)[1].replace(",", "").strip()


def make_prompt(question: str) -> list[dict[str, str]]:
    """verl's GSM8K prompt: one user message, question + space + the '####' instruction."""
    return [{"role": "user", "content": question + " " + PROMPT_SUFFIX}]


def to_verl_rows(records: Sequence[dict[str, str]], split: str) -> list[dict[str, Any]]:
    """Rows in verl's RL parquet layout (data_source selects verl's built-in gsm8k reward)."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": make_prompt(r["question"]),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": ground_truth(r["answer"])},
            "extra_info": {"split": split, "index": i, "answer": r["answer"], "question": r["question"]},
        }
        for i, r in enumerate(records)
    ]


def to_trl_rows(records: Iterable[dict[str, str]]) -> list[dict[str, Any]]:
    """Rows for trl GRPOTrainer: a conversational `prompt` and a `ground_truth` column for gsm8k_trl_reward."""
    return [{"prompt": make_prompt(r["question"]), "ground_truth": ground_truth(r["answer"])} for r in records]


def _load_local(folder: Path) -> dict[str, list[dict[str, str]]]:
    missing = [s for s in SPLITS if not (folder / f"{s}.jsonl").is_file()]
    if missing:
        raise DataError(folder, None, f"missing {', '.join(s + '.jsonl' for s in missing)}",
                        "use a folder holding train.jsonl and test.jsonl (openai/grade-school-math layout), or source 'hf'")
    return {s: load_jsonl(folder / f"{s}.jsonl") for s in SPLITS}


def _load_hf() -> dict[str, list[dict[str, str]]]:
    try:
        import datasets  # lazy: heavy, and only needed on a login node with internet
    except ImportError as exc:
        raise DataError(HF_DATASET, None, f"the 'datasets' package is not installed ({exc})",
                        "pip install datasets, or pass a local folder with train.jsonl and test.jsonl") from None
    try:
        ds = datasets.load_dataset(HF_DATASET, HF_CONFIG)
    except Exception as exc:  # network/offline/cache errors come in many types
        raise DataError(HF_DATASET, None, f"could not load the dataset ({type(exc).__name__}: {exc})",
                        "run on a node with internet (compute nodes are often offline), or pass a local folder") from None
    out: dict[str, list[dict[str, str]]] = {}
    for split in SPLITS:
        if split not in ds:
            raise DataError(HF_DATASET, None, f"dataset has no '{split}' split", "use config 'main' of openai/gsm8k")
        out[split] = [validate_record(dict(row), f"{HF_DATASET}[{split}] row", i) for i, row in enumerate(ds[split], 1)]
        if not out[split]:
            raise DataError(HF_DATASET, None, f"split '{split}' is empty", "check the dataset download")
    return out


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa  # lazy: keeps `import hpc_grpo.data.gsm8k` cheap
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def _write_jsonl(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def prepare_gsm8k(source: str | os.PathLike[str], out_dir: str | os.PathLike[str], source_kind: str = "auto") -> PrepareResult:
    """Validate both splits fully, then write out_dir/verl/{train,test}.parquet and out_dir/trl/{train,test}.jsonl.

    source_kind: "local" (folder with train.jsonl and test.jsonl), "hf" (openai/gsm8k, config main),
    or "auto" ("hf"/"openai/gsm8k" means the Hub, anything else a local folder).
    Nothing is written if any record is invalid.
    """
    out_dir = Path(out_dir)
    src = str(source)
    if source_kind == "auto":
        source_kind = "hf" if src in ("hf", HF_DATASET) else "local"
    if source_kind == "local":
        folder = Path(source)
        if not folder.is_dir():
            raise DataError(folder, None, "not a folder",
                            "pass a folder holding train.jsonl and test.jsonl, or 'hf' for the openai/gsm8k dataset")
        splits = _load_local(folder)
        src = str(folder)
    elif source_kind == "hf":
        splits = _load_hf()
        src = f"hf:{HF_DATASET}/{HF_CONFIG}"
    else:
        raise ValueError(f"unknown source_kind {source_kind!r}: use 'auto', 'local' or 'hf'")

    verl_rows = {s: to_verl_rows(splits[s], s) for s in SPLITS}
    trl_rows = {s: to_trl_rows(splits[s]) for s in SPLITS}
    import pyarrow  # noqa: F401  fail on a missing pyarrow before creating any folder

    paths = {(kind, s): out_dir / kind / f"{s}.{ext}" for kind, ext in (("verl", "parquet"), ("trl", "jsonl")) for s in SPLITS}
    for kind in ("verl", "trl"):
        (out_dir / kind).mkdir(parents=True, exist_ok=True)
    for s in SPLITS:
        atomic_write(paths["verl", s], partial(_write_parquet, verl_rows[s]))
        atomic_write(paths["trl", s], partial(_write_jsonl, trl_rows[s]))
    # The evaluation (lm-eval's own gsm8k task) reads question/answer rows: record where they are. A local
    # source is named, not copied; rows fetched from the Hub are kept in out_dir/raw/ (no Hub in the eval job).
    raw_dir = Path(source).resolve() if source_kind == "local" else out_dir / "raw"
    if source_kind != "local":
        raw_dir.mkdir(parents=True, exist_ok=True)
        for s in SPLITS:
            atomic_write(raw_dir / f"{s}.jsonl", partial(_write_jsonl, splits[s]))
    atomic_write(out_dir / "source.json",
                  lambda p: p.write_text(json.dumps({"source": src, "raw_dir": str(raw_dir)}, indent=2) + "\n"))
    return PrepareResult(
        out_dir=out_dir,
        verl_train=paths["verl", "train"],
        verl_test=paths["verl", "test"],
        trl_train=paths["trl", "train"],
        trl_test=paths["trl", "test"],
        n_train=len(verl_rows["train"]),
        n_test=len(verl_rows["test"]),
        source=src,
    )
