"""Facts spelled once: the pinned verl version, the checkpoint retention defaults, the data folder. Each test fails
when a second spelling comes back or when two spellings drift apart."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from hpc_grpo.config import registry
from hpc_grpo.config.spec import Checkpoint
from hpc_grpo.config.verl_keys import VERL_VERSION
from hpc_grpo.evaluation.evaluate import default_data_files
from hpc_grpo.runstate.retention import Policy
from tests.cli_run import run_cli

REPO = Path(__file__).resolve().parents[2]
# Where the version may be written out: the constant, the two install pins (pip reads them, so they stay literal),
# and measured figures, which record the release they were measured on.
VERSION_HOMES = {"hpc_grpo/config/verl_keys.py", "pyproject.toml", "tools/setup-env.sh", "docs/benchmarks.md"}
SCANNED = ("hpc_grpo", "tests", "docs", "tools", "recipes", "clusters", "templates", "README.md")


def test_the_verl_constant_equals_both_install_pins() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [re.fullmatch(r"verl(\[[^]]*\])?==(\S+)", dep) for dep in extras["train-verl"]]
    assert [m[2] for m in pins if m] == [VERL_VERSION], extras["train-verl"]
    setup = re.findall(r'^verl_version="([^"]+)"', (REPO / "tools/setup-env.sh").read_text(), re.M)
    assert setup == [VERL_VERSION], "tools/setup-env.sh must set verl_version once, to the pinned verl"


def test_no_other_file_spells_the_verl_version() -> None:
    spelled = re.compile(rf"(?<![\d.]){re.escape(VERL_VERSION)}(?![\d])")
    found = []
    for top in SCANNED:
        paths = [REPO / top] if (REPO / top).is_file() else sorted((REPO / top).rglob("*"))
        for path in paths:
            rel = str(path.relative_to(REPO))
            if not path.is_file() or rel in VERSION_HOMES or "__pycache__" in rel or "/golden/" in f"/{rel}":
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            found += [f"{rel}:{n}" for n, line in enumerate(text.splitlines(), 1) if spelled.search(line)]
    assert not found, ("the verl version is spelled outside its homes: say 'the pinned verl' or use "
                       "hpc_grpo.config.verl_keys.VERL_VERSION:\n" + "\n".join(found))


def test_a_policy_built_in_code_has_the_recipes_defaults() -> None:
    assert Policy() == Policy.from_recipe(Checkpoint())


def test_the_data_folder_honours_the_variable_and_defaults_to_home(isolated: Path, monkeypatch) -> None:
    monkeypatch.delenv(registry.DATA_ENV, raising=False)
    assert registry.data_root() == isolated / "home" / "hpc-grpo-data"
    monkeypatch.setenv(registry.DATA_ENV, str(isolated / "elsewhere"))
    assert registry.data_root() == isolated / "elsewhere"


def test_what_data_gsm8k_writes_is_where_evaluation_looks(isolated: Path, monkeypatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    raw = isolated / "raw"
    raw.mkdir()
    for split in ("train", "test"):
        rows = [{"question": f"{split} {n}: 2 + {n}?", "answer": f"2 + {n} = {2 + n}\n#### {2 + n}"} for n in range(3)]
        (raw / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv(registry.DATA_ENV, str(isolated / "data"))
    assert default_data_files() is None
    code, text = run_cli(monkeypatch, capsys, "data", "gsm8k", "--source", str(raw))
    assert code in (None, 0), text
    assert (isolated / "data" / "gsm8k" / "verl" / "train.parquet").is_file()
    assert default_data_files() == (str(raw / "train.jsonl"), str(raw / "test.jsonl"))
