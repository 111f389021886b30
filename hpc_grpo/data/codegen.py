"""Code-generation problems with their tests -> verl parquet and trl jsonl (`hpc-grpo data codegen`).

Accepted record layouts (JSON array or JSONL, or a Hugging Face dataset id `hf:NAME[:CONFIG]`):
- ours:      {"id", "prompt", "tests": ["assert f(1) == 2", ...], "entry_point": "f", "setup"?}
- MBPP:      {"task_id", "text", "code", "test_list", "test_setup_code"?}  (entry point from the tests)
- APPS/TACO: {"problem_id"?, "question", "input_output": "{\"inputs\": [...], \"outputs\": [...], \"fn_name\"?}"}
- HumanEval: {"task_id", "prompt", "test", "entry_point"}  (evaluation and CPU tests only)
Each becomes one prompt (a user message asking for a ```python block) and one ground-truth JSON string
that hpc_grpo/rewards/code.py runs. A natural-language prompt (no code field) that shows definitions in a fenced
Python block gives them: they go to the ground truth as "given" (given_from_text), out of the completion's reach. Prompts longer than max_prompt_tokens (chat template applied,
as the trainer sees them) are dropped, like verl's filter_overlong_prompts does for GSM8K.
Stdlib only at import time.
"""

from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hpc_grpo.rewards.code import DATA_SOURCE, fences
from hpc_grpo.common.atomic import atomic_write
from hpc_grpo.data.gsm8k import DataError, PrepareResult, _write_jsonl, _write_parquet

__all__ = ["SHIPPED_PROBLEMS", "CodegenResult", "load_problems", "normalize", "make_prompt", "prepare_codegen"]

SHIPPED_PROBLEMS = Path(__file__).resolve().parents[1] / "_data" / "codegen_tiny.jsonl"
INSTRUCTION = "Write the Python function `{entry}`. Answer with the complete code in one ```python block."
IO_INSTRUCTION = "Write a Python program that reads standard input and prints the answer. Answer with the code in one ```python block."
_ASSERT_NAME = re.compile(r"assert\s+(?:not\s+)?\(?\s*([A-Za-z_]\w*)\s*\(")


@dataclass(frozen=True)
class CodegenResult(PrepareResult):
    """Where prepare_codegen wrote its files, what it kept, and how many overlong prompts it dropped."""

    dropped_overlong: int = 0

    @property
    def note(self) -> str:
        return f", {self.dropped_overlong} overlong prompts dropped" if self.dropped_overlong else ""


def _bad(source: str, line: int | None, problem: str) -> DataError:
    return DataError(source, line, problem,
                     'give each problem "prompt", "tests" (a list of assert lines) and "entry_point", '
                     "or use the MBPP (text, test_list), APPS/TACO (question, input_output) or HumanEval layout")


_GIVEN = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)


def given_from_text(text: str) -> str:
    """The definitions a natural-language prompt shows in its fenced Python blocks (a helper such as `encode` for
    a `decode` task): the reward runs them in its judge, where the tests call them, and after the completion, so a
    completion cannot redefine them (it leaves out the entry point and stubs: rewards/code_tests.given_code). Only
    definitions and imports: an example call in the fence is not kept."""
    parts = []
    for lang, body in fences(text):
        if lang.lower() not in ("", "python", "py", "python3"):
            continue
        try:
            module = ast.parse(body)
        except (SyntaxError, ValueError, RecursionError):
            continue
        kept: list[ast.stmt] = [s for s in module.body if isinstance(s, _GIVEN)]
        if any(isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for s in kept):
            parts.append(ast.unparse(ast.Module(body=kept, type_ignores=[])))
    return "\n\n".join(parts)


def normalize(obj: Any, source: str, line: int | None) -> dict[str, Any]:
    """One record of any accepted layout -> {id, text, tests, entry_point, setup, prompt_code, given}."""
    problem = _normalize(obj, source, line)
    has_code = problem["prompt_code"] or not problem["entry_point"]
    problem["given"] = "" if has_code else given_from_text(problem["text"])
    return problem


def _normalize(obj: Any, source: str, line: int | None) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _bad(source, line, f"expected a JSON object, got {type(obj).__name__}")
    rid = str(obj.get("id", obj.get("task_id", obj.get("problem_id", line or 0))))
    if "test_list" in obj:  # MBPP
        tests = list(obj["test_list"]) + list(obj.get("challenge_test_list") or [])
        m = _ASSERT_NAME.search(tests[0]) if tests else None
        if not m:
            raise _bad(source, line, "MBPP record whose first test names no function")
        return {"id": rid, "text": str(obj.get("text") or obj.get("prompt") or ""), "tests": tests,
                "entry_point": m.group(1), "setup": str(obj.get("test_setup_code") or ""), "prompt_code": ""}
    if "input_output" in obj:  # APPS / TACO
        io = obj["input_output"]
        try:
            io = json.loads(io) if isinstance(io, str) else dict(io)
            inputs, outputs = list(io["inputs"]), list(io["outputs"])
        except (ValueError, KeyError, TypeError):
            raise _bad(source, line, "input_output is not JSON with 'inputs' and 'outputs' lists") from None
        if not inputs or len(inputs) != len(outputs):
            raise _bad(source, line, f"input_output has {len(inputs)} inputs and {len(outputs)} outputs")
        fn = io.get("fn_name")
        if fn:
            tests = [f"assert {fn}(*{inp!r}) == {out!r}" if isinstance(inp, list) else f"assert {fn}({inp!r}) == {out!r}"
                     for inp, out in zip(inputs, outputs)]
        else:
            tests = [{"stdin": inp if isinstance(inp, str) else "\n".join(map(str, inp)),
                      "stdout": out if isinstance(out, str) else "\n".join(map(str, out))} for inp, out in zip(inputs, outputs)]
        return {"id": rid, "text": str(obj.get("question", "")), "tests": tests, "entry_point": fn or None,
                "setup": "", "prompt_code": ""}
    if "test" in obj and "entry_point" in obj and "prompt" in obj:  # HumanEval
        return {"id": rid, "text": "", "tests": [str(obj["test"])], "entry_point": str(obj["entry_point"]),
                "setup": "", "prompt_code": str(obj["prompt"])}
    missing = [k for k in ("prompt", "tests", "entry_point") if k not in obj]
    if missing:
        raise _bad(source, line, f"missing field(s) {', '.join(missing)} (fields present: {', '.join(sorted(obj)) or 'none'})")
    tests = obj["tests"]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, (str, dict)) for t in tests):
        raise _bad(source, line, "'tests' must be a non-empty list of test snippets")
    if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
        raise _bad(source, line, "'prompt' is empty or not a string")
    return {"id": rid, "text": obj["prompt"], "tests": tests, "entry_point": str(obj["entry_point"]),
            "setup": str(obj.get("setup") or ""), "prompt_code": str(obj.get("prompt_code") or "")}


def load_problems(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSON array, JSONL or .jsonl.gz file of problems and normalize every record."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, None, "file not found", "pass a JSON/JSONL file of problems, or hf:NAME when online")
    if path.suffix == ".gz":
        import gzip

        text = gzip.decompress(path.read_bytes()).decode("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            records = [(i, r) for i, r in enumerate(json.loads(text), start=1)]
        except json.JSONDecodeError as exc:
            raise DataError(path, exc.lineno, f"invalid JSON ({exc.msg})", "fix the JSON array") from None
    else:
        records = []
        for lineno, raw in enumerate(text.split("\n"), start=1):
            if raw.strip():
                try:
                    records.append((lineno, json.loads(raw)))
                except json.JSONDecodeError as exc:
                    raise DataError(path, lineno, f"invalid JSON ({exc.msg} at column {exc.colno})",
                                    "make every line one complete JSON object") from None
    if not records:
        raise DataError(path, 1, "file holds no problems", "add one problem per line")
    return [normalize(obj, str(path), line) for line, obj in records]


def load_hf(name: str) -> list[dict[str, Any]]:
    """`hf:NAME[:CONFIG]` through the datasets library (needs internet or a warm HF cache)."""
    dataset, _, config = name.partition(":")
    try:
        import datasets
    except ImportError as exc:
        raise DataError(f"hf:{name}", None, f"the 'datasets' package is not installed ({exc})",
                        "pip install datasets, or pass a local JSON/JSONL file") from None
    try:
        ds = datasets.load_dataset(dataset, config or None)
    except Exception as exc:  # offline, unknown id, auth: many exception types
        raise DataError(f"hf:{name}", None, f"could not load the dataset ({type(exc).__name__}: {str(exc)[:200]})",
                        "run where the Hub is reachable (login node), or download it and pass the local file") from None
    rows = [row for split in ds for row in ds[split]]
    return [normalize(dict(row), f"hf:{name}", i) for i, row in enumerate(rows, start=1)]


def make_prompt(problem: dict[str, Any]) -> list[dict[str, str]]:
    """One user message: the problem, the function to write (or the code to complete), the answer format."""
    if problem.get("prompt_code"):
        body = ("Complete this Python function.\n\n```python\n" + problem["prompt_code"].rstrip() +
                "\n```\n\nAnswer with the whole function in one ```python block.")
    elif problem.get("entry_point"):
        body = problem["text"].strip() + "\n\n" + INSTRUCTION.format(entry=problem["entry_point"])
    else:
        body = problem["text"].strip() + "\n\n" + IO_INSTRUCTION
    return [{"role": "user", "content": body}]


def ground_truth(problem: dict[str, Any]) -> str:
    gt = {"tests": problem["tests"], "entry_point": problem.get("entry_point")}
    for key in ("setup", "prompt_code", "given"):
        if problem.get(key):
            gt[key] = problem[key]
    return json.dumps(gt, ensure_ascii=False)


def _token_lengths(prompts: list[list[dict[str, str]]], tokenizer_path: str) -> list[int]:
    from transformers import AutoTokenizer  # lazy: only when a token limit is asked for

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    encoded: Any = tok.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded  # a BatchEncoding or plain lists
    return [len(x) for x in ids]


def prepare_codegen(source: str, out_dir: str | os.PathLike[str], test_every: int = 4,
                    max_prompt_tokens: int | None = None, tokenizer: str | None = None) -> CodegenResult:
    """Write out_dir/verl/{train,test}.parquet and out_dir/trl/{train,test}.jsonl.

    Every `test_every`-th problem goes to the test split (0: all train, test = train). Problems whose
    prompt is longer than max_prompt_tokens under `tokenizer` are dropped. Nothing is written when a
    record is invalid. source "tiny" is the shipped problems (SHIPPED_PROBLEMS).
    """
    source = str(SHIPPED_PROBLEMS) if source == "tiny" else source
    problems = load_hf(source[3:]) if source.startswith("hf:") else load_problems(source)
    dropped = 0
    if max_prompt_tokens is not None:
        if not tokenizer:
            raise DataError(source, None, "max_prompt_tokens needs a tokenizer", "pass --tokenizer MODEL_FOLDER")
        lengths = _token_lengths([make_prompt(p) for p in problems], tokenizer)
        kept = [p for p, n in zip(problems, lengths) if n <= max_prompt_tokens]
        dropped = len(problems) - len(kept)
        problems = kept
        if not problems:
            raise DataError(source, None, f"every prompt is longer than {max_prompt_tokens} tokens",
                            "raise --max-prompt-tokens")
    if test_every > 0 and len(problems) >= 2:
        splits = {"train": [p for i, p in enumerate(problems) if (i + 1) % test_every],
                  "test": [p for i, p in enumerate(problems) if not (i + 1) % test_every]}
        if not splits["test"]:
            splits["test"] = splits["train"][-1:]
    else:
        splits = {"train": problems, "test": problems}
    import pyarrow  # noqa: F401  fail before creating any folder

    out_dir = Path(out_dir)
    paths = {}
    for kind, ext in (("verl", "parquet"), ("trl", "jsonl")):
        (out_dir / kind).mkdir(parents=True, exist_ok=True)
        for split, rows in splits.items():
            paths[kind, split] = out_dir / kind / f"{split}.{ext}"
            if kind == "verl":
                data = [{"data_source": DATA_SOURCE, "prompt": make_prompt(p), "ability": "code",
                         "reward_model": {"style": "rule", "ground_truth": ground_truth(p)},
                         "extra_info": {"split": split, "index": i, "task_id": p["id"], "entry_point": p.get("entry_point") or ""}}
                        for i, p in enumerate(rows)]
                atomic_write(paths[kind, split], partial(_write_parquet, data))
            else:
                data = [{"prompt": make_prompt(p), "ground_truth": ground_truth(p), "task_id": p["id"]} for p in rows]
                atomic_write(paths[kind, split], partial(_write_jsonl, data))
    return CodegenResult(out_dir, paths["verl", "train"], paths["verl", "test"], paths["trl", "train"],
                         paths["trl", "test"], len(splits["train"]), len(splits["test"]), source,
                         dropped_overlong=dropped)
