"""A list of data files (data.train_files=[a,b], verl concatenates them): accepted, checked file by file, rendered as
one Hydra list whose elements survive the shell, refused by trl, and the one-file places take the first and say so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from hpc_grpo.cli import app as cli
from hpc_grpo.commands import rehearse as R
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.config.verl_keys import format_value
from hpc_grpo.evaluation import evaluate
from hpc_grpo.launch.render import render_all
from hpc_grpo.planning.preflight import check_data
from hpc_grpo.planning.schedule import dataset_rows
from hpc_grpo.common.findings import error
from tests.unit.test_quoting import driver_argv, pinned

RECIPE = "qwen2.5-3b-gsm8k-lora"


def spec_with(tmp_path: Path, *extra: str, recipe: str = RECIPE):
    return resolve_spec(recipe, "slurm-dev", [f"cluster.runs_root={tmp_path}", *extra], run_name="r")


def yaml_list(paths: list[str]) -> str:
    return "[" + ",".join(json.dumps(p) for p in paths) + "]"


def test_a_list_reaches_verl_as_one_hydra_list_with_every_path_intact(tmp_path: Path, monkeypatch) -> None:
    paths = ["/data/gsm8k/train.parquet", "/data/my math/it's `touch pwned`;.parquet", "/d/a,b[1].parquet"]
    pinned(monkeypatch)
    spec = spec_with(tmp_path, f"data.train_files={yaml_list(paths)}")
    assert spec.recipe.data.train_list == paths
    argv = driver_argv(render_all(spec)["scripts/launch.sh"], tmp_path)
    override = next(a for a in argv if a.startswith("data.train_files="))
    assert override == "data.train_files=" + format_value(paths)
    # what verl's Hydra makes of the argv element: the same three paths, not a split or mangled string
    parsed = OverridesParser.create().parse_overrides([override])[0]
    assert parsed.value() == paths
    assert not (tmp_path / "pwned").exists()


def test_one_path_still_renders_as_a_plain_string(tmp_path: Path) -> None:
    spec = spec_with(tmp_path)
    assert isinstance(spec.recipe.data.train_files, str)
    assert spec.recipe.data.train_list == [spec.recipe.data.train_files]


@pytest.mark.parametrize("value", ["[]", "[/a.parquet,5]", "[/a.parquet,'']", "7"])
def test_a_bad_shape_exits_2_naming_the_key_and_the_form(value: str, isolated: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "plan", f"recipe={RECIPE}", f"data.train_files={value}"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    message = capsys.readouterr().err
    assert exc.value.code == 2, message
    assert "data.train_files: must be one file path or a non-empty list of paths, e.g. [a.parquet,b.parquet]" in message


def test_preflight_checks_each_file_and_names_the_missing_one(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = tmp_path / "gsm8k.parquet"
    pq.write_table(pa.table({"prompt": ["q"], "reward_model": [{"ground_truth": "1"}], "data_source": ["x"]}), good)
    missing = tmp_path / "math.parquet"
    spec = spec_with(tmp_path, f"data.train_files=[{good},{missing}]", f"data.val_files=[{good}]")
    findings = [f for f in check_data(spec, error) if f.key.startswith("data.")]
    assert [(f.key, f.message) for f in findings] == [("data.train_files", f"{missing} does not exist here")]


def test_rows_of_a_list_are_summed_and_unknown_if_one_is_unknown(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"x": 1}\n' * 3)
    b.write_text('{"x": 1}\n' * 4)
    rows, how = dataset_rows([str(a), str(b)])
    assert rows == 7 and str(a) in how and str(b) in how
    assert dataset_rows([str(a), str(tmp_path / "gone.jsonl")])[0] is None


def test_trl_refuses_a_list_with_the_fix(isolated: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "plan", "recipe=tiny-gsm8k", "data.train_files=[/a.jsonl,/b.jsonl]"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    text = capsys.readouterr().out
    assert exc.value.code == 1
    assert ("error: data.train_files: a list of 2 files: the trl engine trains on one file Fix: merge them into one "
            ".jsonl") in text


def test_rehearsal_samples_the_first_file_and_says_so(tmp_path: Path) -> None:
    spec = spec_with(tmp_path, "data.train_files=[/d/gsm8k.parquet,/d/math.parquet]")
    sh = R.shrink(spec, R.ShrinkInputs("/m", "/run/train.parquet", "/run/val.parquet"))
    change = next(c for c in sh.replaced if c.key == "data.train_files")
    assert change.was == ["/d/gsm8k.parquet", "/d/math.parquet"]
    assert "the first of its 2 files" in change.why


def test_eval_finds_gsm8k_beside_the_first_val_file(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "test.jsonl").write_text("")
    verl = tmp_path / "gsm8k" / "verl"
    verl.mkdir(parents=True)
    (verl / evaluate.SOURCE_FILE).write_text(json.dumps({"raw_dir": str(raw)}))
    spec = spec_with(tmp_path, f"data.val_files=[{verl / 'test.parquet'},/elsewhere/math.parquet]")
    assert evaluate.data_files(spec) == (str(raw / "train.jsonl"), str(raw / "test.jsonl"))
