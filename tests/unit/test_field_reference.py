"""Every recipe and cluster-profile field says what it is where it is declared, and docs/reference.md is the page
`hpc-grpo recipes --reference` generates from those declarations now (as docs/recipe-matrix.md is `--matrix`'s)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from hpc_grpo.commands import reference
from hpc_grpo.config import cluster, spec
from hpc_grpo.config.fields import Strict
from tests.cli_run import run_cli

REFERENCE_FILE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
REGENERATE = "hpc-grpo recipes --reference > docs/reference.md"


def declared_models() -> set[type[BaseModel]]:
    """Every model class the recipe and profile modules declare, found by reading the modules, not by walking."""
    found = {obj for module in (spec, cluster) for _, obj in inspect.getmembers(module, inspect.isclass)
             if issubclass(obj, Strict) and obj is not Strict and obj.__module__ == module.__name__}
    assert spec.Recipe in found and cluster.Cluster in found and cluster.Setup in found
    return found


def test_every_recipe_and_profile_field_has_a_description() -> None:
    missing = reference.undocumented()
    assert not missing, ("fields without a description (add Field(description=...) where each is declared, then "
                         f"`{REGENERATE}`): {', '.join(missing)}")


def test_the_walk_reaches_every_declared_model() -> None:
    """A model no recipe, profile or spec field holds would escape the description check and the page; a base class
    only lends its fields (checked through the classes that inherit them)."""
    walked = set(reference.all_models())
    bases = {m for m in declared_models() if any(issubclass(other, m) and other is not m for other in walked)}
    assert declared_models() - walked == bases - walked, sorted(m.__name__ for m in declared_models() - walked)


def test_the_check_names_a_field_without_a_description(monkeypatch: pytest.MonkeyPatch) -> None:
    class Nested(Strict):
        """A section."""

        told: int = Field(default=1, description="said")
        untold: int = 2

    class Root(Strict):
        """A root."""

        part: Nested = Field(default_factory=Nested, description="the nested section")
        items: list[Nested] = []

    monkeypatch.setattr(reference, "ROOTS", (("Root", "root.", Root),))
    assert reference.undocumented() == ["root.items (Root)", "root.part.untold (Nested)"]


def test_the_shipped_reference_is_what_the_models_say_now(isolated: Path, monkeypatch, capsys) -> None:
    code, text = run_cli(monkeypatch, capsys, "recipes", "--reference", stdout_only=True)
    assert code in (None, 0)
    assert text == REFERENCE_FILE.read_text(encoding="utf-8"), f"docs/reference.md is stale: `{REGENERATE}`"


def test_the_reference_lists_every_key_with_its_description_and_rule() -> None:
    text = REFERENCE_FILE.read_text(encoding="utf-8")
    for model, prefix in reference.all_models().items():
        for name, field in model.model_fields.items():
            row = next((ln for ln in text.splitlines() if ln.startswith(f"| `{prefix}{name}` |")), None)
            assert row is not None, f"{prefix}{name} is not in docs/reference.md"
            assert (field.description or "").replace("|", "\\|") in row
    lr = next(ln for ln in text.splitlines() if ln.startswith("| `grpo.lr` |"))
    assert "| > 0, < 1 |" in lr and "actor.optim.lr" in lr


@pytest.mark.parametrize("word", ["issue", "session", "field report"])
def test_no_description_cites_where_it_came_from(word: str) -> None:
    said = [f"{prefix}{name}" for model, prefix in reference.all_models().items()
            for name, field in model.model_fields.items() if word in (field.description or "").lower()]
    assert not said, said


@pytest.mark.parametrize(("override", "meant", "model", "field"), [
    ("grpo.learning_rate=1e-5", "grpo.lr", spec.Grpo, "lr"),  # a name from trl
    ("batch.trian=8", "batch.train", spec.Batch, "train"),  # a typo
    ("cluster.gpu_per_node=4", "gpus_per_node", cluster.Cluster, "gpus_per_node"),
])
def test_an_unknown_key_is_answered_with_the_meant_keys_description(override: str, meant: str, model: type[BaseModel],
                                                                    field: str, isolated: Path) -> None:
    from hpc_grpo.common.yamlio import SpecError
    from hpc_grpo.config.resolve import resolve_spec

    with pytest.raises(SpecError) as err:
        resolve_spec("tiny-gsm8k", "local", [override])
    description = model.model_fields[field].description
    assert description and f"did you mean '{meant}', {description}?" in str(err.value), err.value
