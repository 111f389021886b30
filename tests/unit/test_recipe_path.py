"""A recipe can be named by its file's path (`plan recipe=./my.yaml`), its `extends:` resolving by name as for any
recipe; a wrong path is one message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.resolve import resolve_spec


def test_a_recipe_by_relative_and_absolute_path_extends_a_shipped_one(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mine.yaml").write_text("extends: qwen2.5-3b-gsm8k-lora\ngrpo:\n  n: 3\n")
    monkeypatch.chdir(tmp_path)
    for typed in ("./sub/mine.yaml", "sub/mine.yaml", str(tmp_path / "sub" / "mine.yaml")):
        spec = resolve_spec(typed, "local", [], run_name="r", now=0.0)
        assert spec.recipe.name == "mine" and spec.recipe.grpo.n == 3, typed
        assert spec.recipe.engine == "verl"  # from the base it extends


@pytest.mark.parametrize("typed, says", [("./nope.yaml", "no recipe file ./nope.yaml"),
                                         ("./sub/x.txt", "not a recipe file")])
def test_a_wrong_path_names_the_key(typed: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as exc:
        resolve_spec(typed, "local", [], run_name="r", now=0.0)
    assert exc.value.key == "recipe" and says in str(exc.value)
