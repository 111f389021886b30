"""docs/recipe-matrix.md is what `hpc-grpo recipes --matrix` prints now: every shipped recipe planned on every shipped
cluster profile, ok or refused and why. A recipe change that breaks a pair, or a new profile, fails here until the
file is regenerated (`hpc-grpo recipes --matrix > docs/recipe-matrix.md`), so no pair changes unnoticed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpc_grpo.commands import matrix
from hpc_grpo.config import registry
from tests.cli_run import run_cli

MATRIX_FILE = Path(__file__).resolve().parents[2] / "docs" / "recipe-matrix.md"
ROW_RE = re.compile(r"^\| `([^`]+)` \| (.*) \|$", re.M)


def shipped_verdicts() -> dict[tuple[str, str], bool]:
    """(recipe, cluster) -> ok, as docs/recipe-matrix.md records it (other tests' list of planned pairs)."""
    text = MATRIX_FILE.read_text()
    head = re.search(r"^\| recipe \| (.*) \|$", text, re.M)
    assert head, f"{MATRIX_FILE} has no table header"
    clusters = head[1].split(" | ")
    return {(recipe, c): verdict == "ok" for recipe, cells in ROW_RE.findall(text)
            for c, verdict in zip(clusters, cells.split(" | "), strict=True)}


def test_the_shipped_matrix_is_what_plan_says_now(isolated: Path, monkeypatch, capsys) -> None:
    code, text = run_cli(monkeypatch, capsys, "recipes", "--matrix", stdout_only=True)
    assert code in (None, 0)
    assert text == MATRIX_FILE.read_text(), \
        "docs/recipe-matrix.md is stale: regenerate it with `hpc-grpo recipes --matrix > docs/recipe-matrix.md`"


def test_the_matrix_names_every_pair_and_reasons_only_for_refusals(isolated: Path) -> None:
    verdicts = shipped_verdicts()
    assert set(verdicts) == {(r, c) for r in registry.list_names("recipes") for c in registry.list_names("clusters")}
    refused_in_text = set(re.findall(r"^- `([^`]+)` on `([^`]+)`:$", MATRIX_FILE.read_text(), re.M))
    assert refused_in_text == {pair for pair, ok in verdicts.items() if not ok}
    assert any(verdicts.values()) and not all(verdicts.values())


def test_a_refused_cell_carries_plans_errors(isolated: Path) -> None:
    cell = matrix.plan_cell("qwen2.5-3b-gsm8k-lora", "local")
    assert not cell.ok
    assert any(r.startswith("resources.gpus_per_node: ") and "'local' nodes have 0" in r for r in cell.reasons)
    assert matrix.plan_cell("tiny-gsm8k", "local").ok


def test_json_lists_the_same_verdicts(isolated: Path, monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run_cli(monkeypatch, capsys, "recipes", "--matrix", "--json", stdout_only=True)
    assert code in (None, 0)
    rows = json.loads(text)
    assert {(r["recipe"], r["cluster"]): r["ok"] for r in rows} == shipped_verdicts()
    assert all(bool(r["reasons"]) != r["ok"] for r in rows)
