"""`hpc-grpo data codegen`: every accepted layout, the files both engines read, and bad input (exit 2, nothing written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_grpo.rewards.code import score_completion
from hpc_grpo.data.codegen import SHIPPED_PROBLEMS, load_problems, normalize, prepare_codegen
from hpc_grpo.data.gsm8k import DataError


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HOME=str(cwd))
    return subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "data", "codegen", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=120)


def test_shipped_problems_are_small_and_solvable() -> None:
    """16 problems of our own, each one solvable: a reference answer passes every test in the sandbox."""
    assert SHIPPED_PROBLEMS.stat().st_size < 20_000
    problems = load_problems(SHIPPED_PROBLEMS)
    assert len(problems) == 16 and len({p["entry_point"] for p in problems}) == 16
    refs = {"add_two": "return a + b", "is_even": "return n % 2 == 0", "largest": "m = xs[0]\n    for x in xs: m = x if x > m else m\n    return m"}
    sigs = {"add_two": "a, b", "is_even": "n", "largest": "xs"}
    for p in problems:
        if p["entry_point"] in refs:
            code = f"```python\ndef {p['entry_point']}({sigs[p['entry_point']]}):\n    {refs[p['entry_point']]}\n```"
            gt = json.dumps({"tests": p["tests"], "entry_point": p["entry_point"]})
            assert score_completion(code, gt).kind == "passed", p["id"]


def test_cli_writes_both_engines_formats(tmp_path: Path) -> None:
    proc = cli("--source", "tiny", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "12 train, 4 test rows" in proc.stdout
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "out/verl/train.parquet").to_pylist()
    assert len(rows) == 12 and rows[0]["data_source"] == "hpc-grpo/codegen"
    assert rows[0]["prompt"][0]["role"] == "user" and "```python" in rows[0]["prompt"][0]["content"]
    gt = json.loads(rows[0]["reward_model"]["ground_truth"])
    assert gt["entry_point"] == "add_two" and gt["tests"][0].startswith("assert add_two(")
    assert set(rows[0]["extra_info"]) >= {"split", "index", "task_id"}
    trl = [json.loads(line) for line in (tmp_path / "out/trl/test.jsonl").read_text().splitlines()]
    assert len(trl) == 4 and {"prompt", "ground_truth"} <= set(trl[0])


def test_mbpp_apps_taco_humaneval_layouts(tmp_path: Path) -> None:
    mbpp = normalize({"task_id": 2, "text": "Find shared items.", "code": "def similar(a, b): ...",
                      "test_list": ["assert similar((1, 2), (2, 3)) == (2,)"], "test_setup_code": "import math"}, "x", 1)
    assert (mbpp["entry_point"], mbpp["setup"]) == ("similar", "import math")
    apps = normalize({"problem_id": 7, "question": "Double it.",
                      "input_output": json.dumps({"inputs": ["3\n"], "outputs": ["6\n"]})}, "x", 1)
    assert apps["tests"] == [{"stdin": "3\n", "stdout": "6\n"}] and apps["entry_point"] is None
    taco = normalize({"question": "Sum.", "input_output": {"inputs": [[1, 2]], "outputs": [3], "fn_name": "add"}}, "x", 1)
    assert taco["tests"] == ["assert add(*[1, 2]) == 3"]
    he = normalize({"task_id": "HumanEval/0", "prompt": "def f(x):\n", "test": "def check(c): assert c(1)",
                    "entry_point": "f"}, "x", 1)
    assert he["prompt_code"] == "def f(x):\n" and he["tests"] == ["def check(c): assert c(1)"]
    f = tmp_path / "mixed.json"
    f.write_text(json.dumps([{"id": "a", "prompt": "p", "tests": ["assert f() == 1"], "entry_point": "f"},
                             {"task_id": 3, "text": "t", "test_list": ["assert g(1) == 1"]}]))
    res = prepare_codegen(str(f), tmp_path / "o", test_every=0)
    assert (res.n_train, res.n_test) == (2, 2)


def test_fenced_definitions_of_a_prompt_are_given() -> None:
    """A natural-language prompt that shows a helper in a fence: the helper is the problem's (run by the judge and
    after the completion), so a completion that redefines it beside an identity decode gains nothing; the honest
    inverse passes. A fence's example call is not kept; a prompt with a code field takes nothing from its text."""
    from hpc_grpo.data.codegen import ground_truth

    prompt = ("Here is the encoder:\n```python\ndef encode(s):\n    return s[::-1]\n\nprint(encode('ab'))\n```\n"
              "Write `decode(s)`, its inverse.")
    p = normalize({"id": "d", "prompt": prompt, "entry_point": "decode",
                   "tests": ["assert decode(encode('hello')) == 'hello'", "assert decode('cba') == 'abc'"]}, "x", 1)
    assert "def encode" in p["given"] and "print" not in p["given"]
    gt = ground_truth(p)
    honest = score_completion("```python\ndef decode(s):\n    return s[::-1]\n```", gt)
    attack = score_completion("```python\ndef encode(s):\n    return s\n\ndef decode(s):\n    return s\n```", gt)
    assert (honest.score, attack.score) == (1.0, 0.0), (honest, attack)
    coded = normalize({"id": "c", "prompt": prompt, "prompt_code": "def decode(s):\n", "entry_point": "decode",
                       "tests": ["assert decode('a') == 'a'"]}, "x", 1)
    assert coded["given"] == ""


def test_overlong_prompts_dropped(tmp_path: Path) -> None:
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "tiny-qwen2")
    f = tmp_path / "p.jsonl"
    rows = [{"id": "short", "prompt": "Add.", "tests": ["assert f() == 1"], "entry_point": "f"},
            {"id": "long", "prompt": "word " * 400, "tests": ["assert f() == 1"], "entry_point": "f"}]
    f.write_text("\n".join(json.dumps(r) for r in rows))
    res = prepare_codegen(str(f), tmp_path / "o", test_every=0, max_prompt_tokens=128, tokenizer=str(model))
    assert res.dropped_overlong == 1 and res.n_train == 1


@pytest.mark.parametrize("content,expect", [
    ('{"prompt": "p", "entry_point": "f"}\n', "missing field(s) tests"),
    ('{"prompt": "p", "tests": [], "entry_point": "f"}\n', "non-empty list"),
    ('not json\n', "invalid JSON"),
    ('{"question": "q", "input_output": "{\\"inputs\\": [1]}"}\n', "input_output"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path, content: str, expect: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    proc = cli("--source", str(f), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expect in proc.stderr and "bad.jsonl:1" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_hf_offline_is_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    proc = cli("--source", "hf:mbpp", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2 and "hf:mbpp: could not load the dataset" in proc.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(DataError, match="file not found"):
        load_problems(tmp_path / "missing.jsonl")
