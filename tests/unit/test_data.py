"""GSM8K preparation: real files end to end, and every kind of bad input located by line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import require_gsm8k

from hpc_grpo.data.gsm8k import PROMPT_SUFFIX, DataError, load_jsonl, prepare_gsm8k

SHARED_GSM8K = Path(__file__).resolve().parents[2].parent / "shared/data/gsm8k"
VERL_COLUMNS = {"data_source", "prompt", "ability", "reward_model", "extra_info"}
SUFFIX_TEXT = 'Let\'s think step by step and output the final answer after "####".'


_require_shared_data = require_gsm8k


def _raw_lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def _expected_gt(raw_line: str) -> str:
    """Ground truth computed independently: the text after the last '#### ', commas dropped."""
    answer = json.loads(raw_line)["answer"]
    return answer[answer.rindex("#### ") + len("#### "):].replace(",", "").strip()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory):
    src = _require_shared_data()
    out = tmp_path_factory.mktemp("prep") / "gsm8k"
    return src, prepare_gsm8k(src, out)


def test_prompt_suffix_is_verls() -> None:
    assert PROMPT_SUFFIX == SUFFIX_TEXT


def test_row_counts(prepared) -> None:
    src, res = prepared
    assert (res.n_train, res.n_test) == (7473, 1319)
    assert res.n_train == len(_raw_lines(src / "train.jsonl"))
    for p in (res.verl_train, res.verl_test, res.trl_train, res.trl_test):
        assert p.is_file()
    assert res.verl_train == res.out_dir / "verl" / "train.parquet"
    assert res.trl_test == res.out_dir / "trl" / "test.jsonl"
    assert len(_raw_lines(res.trl_train)) == 7473
    assert len(_raw_lines(res.trl_test)) == 1319
    # no temp files left behind
    assert sorted(p.name for p in (res.out_dir / "verl").iterdir()) == ["test.parquet", "train.parquet"]
    assert sorted(p.name for p in (res.out_dir / "trl").iterdir()) == ["test.jsonl", "train.jsonl"]


@pytest.mark.parametrize("split", ["train", "test"])
def test_verl_parquet_rows(prepared, split: str) -> None:
    import pyarrow.parquet as pq

    src, res = prepared
    table = pq.read_table(res.verl_train if split == "train" else res.verl_test)
    assert set(table.column_names) == VERL_COLUMNS
    assert len(table.column_names) == len(VERL_COLUMNS)
    rows = table.to_pylist()
    raw = _raw_lines(src / f"{split}.jsonl")
    assert len(rows) == len(raw)
    for idx in (0, len(raw) - 1):
        rec = json.loads(raw[idx])
        row = rows[idx]
        assert row["data_source"] == "openai/gsm8k"
        assert row["ability"] == "math"
        assert row["prompt"] == [{"role": "user", "content": rec["question"] + " " + SUFFIX_TEXT}]
        assert row["reward_model"] == {"style": "rule", "ground_truth": _expected_gt(raw[idx])}
        assert row["extra_info"] == {"split": split, "index": idx, "answer": rec["answer"], "question": rec["question"]}


def test_known_first_train_row(prepared) -> None:
    # GSM8K's first train item ends "#### 72" (Natalia's clips); a sanity anchor independent of parsing
    _, res = prepared
    import pyarrow.parquet as pq

    first = pq.read_table(res.verl_train).slice(0, 1).to_pylist()[0]
    assert first["reward_model"]["ground_truth"] == "72"
    assert first["prompt"][0]["content"].startswith("Natalia sold clips")


@pytest.mark.parametrize("split", ["train", "test"])
def test_trl_jsonl_rows(prepared, split: str) -> None:
    src, res = prepared
    out_lines = _raw_lines(res.trl_train if split == "train" else res.trl_test)
    raw = _raw_lines(src / f"{split}.jsonl")
    for idx in (0, len(raw) - 1):
        row = json.loads(out_lines[idx])
        rec = json.loads(raw[idx])
        assert set(row) == {"prompt", "ground_truth"}
        assert row["prompt"] == [{"role": "user", "content": rec["question"] + " " + SUFFIX_TEXT}]
        assert row["ground_truth"] == _expected_gt(raw[idx])


def test_ground_truth_with_commas_somewhere(prepared) -> None:
    # at least one GSM8K answer has a thousands separator; its ground truth must drop it
    src, res = prepared
    import pyarrow.parquet as pq

    raw = _raw_lines(src / "train.jsonl")
    idx = next(i for i, line in enumerate(raw) if "," in json.loads(line)["answer"].rsplit("#### ", 1)[1])
    gt = pq.read_table(res.verl_train).slice(idx, 1).to_pylist()[0]["reward_model"]["ground_truth"]
    assert "," not in gt and gt == _expected_gt(raw[idx])


GOOD = json.dumps({"question": "What is 1+1?", "answer": "1+1=2\n#### 2"})

BAD_CASES = {
    "invalid_json": (GOOD + "\n" + '{"question": "q", "answer": "#### 1"' + "\n", 2, "invalid JSON"),
    "missing_marker": (GOOD + "\n" + GOOD + "\n" + json.dumps({"question": "q", "answer": "it is 3"}) + "\n", 3, "####"),
    "empty_question": (json.dumps({"question": "  ", "answer": "#### 3"}) + "\n", 1, "question"),
    "wrong_fields": (GOOD + "\n" + json.dumps({"prompt": "q", "solution": "#### 3"}) + "\n", 2, "missing field"),
    "non_object": (GOOD + "\n" + GOOD + "\n" + GOOD + "\n" + '["q", "#### 3"]' + "\n", 4, "JSON object"),
    "empty_file": ("", 1, "empty"),
    "non_numeric_answer": (json.dumps({"question": "q", "answer": "#### forty"}) + "\n", 1, "not a plain number"),
    "non_string_answer": (json.dumps({"question": "q", "answer": 42}) + "\n", 1, "not a string"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_load_jsonl_rejects(tmp_path: Path, case: str) -> None:
    content, line, needle = BAD_CASES[case]
    path = tmp_path / "train.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as info:
        load_jsonl(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.line == line
    msg = str(err)
    assert f"{path}:{line}" in msg
    assert needle in msg
    assert "Fix:" in msg and err.fix


def test_blank_lines_skipped_but_counted(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(GOOD + "\n\n" + GOOD + "\n" + "not json\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        load_jsonl(path)
    assert info.value.line == 4
    path.write_text(GOOD + "\n\n" + GOOD + "\n", encoding="utf-8")
    assert len(load_jsonl(path)) == 2


@pytest.mark.parametrize("bad_split", ["train", "test"])
@pytest.mark.parametrize("case", ["invalid_json", "missing_marker", "empty_file"])
def test_prepare_writes_nothing_on_failure(tmp_path: Path, bad_split: str, case: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    good_split = "test" if bad_split == "train" else "train"
    (src / f"{good_split}.jsonl").write_text(GOOD + "\n" + GOOD + "\n", encoding="utf-8")
    (src / f"{bad_split}.jsonl").write_text(BAD_CASES[case][0], encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(DataError) as info:
        prepare_gsm8k(src, out)
    assert f"{bad_split}.jsonl" in str(info.value)
    assert not out.exists()
    # a pre-existing out_dir stays empty too
    out.mkdir()
    with pytest.raises(DataError):
        prepare_gsm8k(src, out)
    assert list(out.iterdir()) == []


def test_prepare_small_local_and_missing_split(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text(GOOD + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="test.jsonl"):
        prepare_gsm8k(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (src / "test.jsonl").write_text(
        json.dumps({"question": "Big?", "answer": "so\n#### 1,234,567"}) + "\n", encoding="utf-8"
    )
    res = prepare_gsm8k(str(src), tmp_path / "out")
    assert (res.n_train, res.n_test) == (1, 1)
    row = json.loads(res.trl_test.read_text(encoding="utf-8"))
    assert row["ground_truth"] == "1234567"
    assert row["prompt"][0]["content"] == "Big? " + SUFFIX_TEXT


def test_prepare_rejects_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a folder"):
        prepare_gsm8k(tmp_path / "nope", tmp_path / "out")
    with pytest.raises(ValueError):
        prepare_gsm8k(tmp_path, tmp_path / "out", source_kind="s3")


def test_data_module_import_is_cheap() -> None:
    import subprocess
    import sys

    code = "import sys, hpc_grpo.data.gsm8k; print(','.join(m for m in ('pyarrow', 'datasets', 'torch') if m in sys.modules))"
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_prepare_from_hf_uses_datasets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Hub path (no network here): datasets.load_dataset is faked, rows go through the same checks."""
    import datasets

    calls: list[tuple] = []
    fake = {
        "train": [{"question": "A?", "answer": "x\n#### 5"}, {"question": "B?", "answer": "#### -2,000"}],
        "test": [{"question": "C?", "answer": "#### 7"}],
    }

    def load_dataset(*args, **kwargs):
        calls.append(args)
        return fake

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    res = prepare_gsm8k("hf", tmp_path / "out")
    assert calls == [("openai/gsm8k", "main")]
    assert (res.n_train, res.n_test) == (2, 1)
    rows = [json.loads(line) for line in _raw_lines(res.trl_train)]
    assert [r["ground_truth"] for r in rows] == ["5", "-2000"]

    fake["test"] = [{"question": "C?", "answer": "no marker"}]
    with pytest.raises(DataError) as info:
        prepare_gsm8k("openai/gsm8k", tmp_path / "out2")
    assert info.value.line == 1 and "[test]" in str(info.value)
    assert not (tmp_path / "out2").exists()
