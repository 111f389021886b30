"""`hpc-grpo import` on each construct class of tests/verl_scripts/constructs/ (scripts written for these tests):
every override is accounted for (a row says where it went, or the import is refused with the script's lines),
nothing ends in a traceback, and the command import prints for the file it wrote works as printed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.engines.verl_import import UNUSABLE, import_script
from hpc_grpo.engines.verl_script import parse_script
from tests.conftest import require_verl_yamls

CONSTRUCTS = Path(__file__).resolve().parents[1] / "verl_scripts" / "constructs"
CHECKOUT = Path(__file__).resolve().parents[2]
REFUSED = {"branch_undecided": "line 8: ", "broken_continuation": "line 7: "}


@pytest.mark.parametrize("stem", sorted(p.stem for p in CONSTRUCTS.glob("*.sh")))
def test_every_override_is_accounted_for_or_the_import_is_refused_with_the_line(stem: str) -> None:
    require_verl_yamls()
    path = CONSTRUCTS / f"{stem}.sh"
    text = path.read_text()
    if stem in REFUSED:
        with pytest.raises(SpecError) as exc:
            import_script(text, "imp", source=path)
        assert exc.value.key == "SCRIPT" and REFUSED[stem] in str(exc.value)
        return
    result = import_script(text, "imp", source=path)
    items = {r.item for r in result.rows}
    for override in parse_script(text).overrides + result.script.overrides:  # the script's and its config's
        assert override in items or override.split("=", 1)[0] in items, override


def test_another_trainers_own_keys_are_named_and_the_shared_ones_imported() -> None:
    require_verl_yamls()
    result = import_script((CONSTRUCTS / "other_entry.sh").read_text(), "imp")
    dropped = {r.item.split("=", 1)[0]: r.why for r in result.rows if r.went == UNUSABLE}
    assert set(dropped) == {"reward_model.overlong_buffer.enable", "reward_model.overlong_buffer.len"}
    assert all("main_dapo's own key" in why and "line 3" in why for why in dropped.values())
    assert any("recipe.dapo.main_dapo" in n for n in result.script.notes)
    assert result.spec is not None and result.spec.recipe.batch.train == 64


def test_placeholders_stay_in_the_recipe_and_are_listed_to_fill() -> None:
    require_verl_yamls()
    result = import_script((CONSTRUCTS / "placeholders.sh").read_text(), "imp")
    text = result.yaml_text("placeholders.sh")
    assert "#   actor_rollout_ref.model.path=<path_to_your_model>" in text
    assert result.spec is not None and result.spec.recipe.model.path == "<path_to_your_model>"


def test_the_printed_command_works_for_the_file_import_wrote(tmp_path: Path) -> None:
    """Run import as a user does, then the exact command its last line prints, from the same folder."""
    require_verl_yamls()
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    cli = [sys.executable, "-m", "hpc_grpo.cli"]
    done = subprocess.run([*cli, "import", str(CONSTRUCTS / "arrays.sh"), "-o", "mine/arrays.yaml"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = re.search(r"check it with `([^`]+)`", done.stderr)
    assert printed and (tmp_path / "mine" / "arrays.yaml").is_file(), done.stderr[-500:]
    words = shlex.split(printed.group(1))
    assert words[:2] == ["hpc-grpo", "plan"]
    plan = subprocess.run([*cli, *words[1:], "cluster=h100-efa", "cluster.runs_root=/nonexistent/runs"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in plan.stderr and "no recipe" not in plan.stderr, plan.stderr[-2000:]
    assert "recipe arrays " in plan.stdout, plan.stdout[-2000:]


def test_the_scripts_own_config_beside_it_is_imported_and_the_scripts_overrides_win() -> None:
    require_verl_yamls()
    path = CONSTRUCTS / "own_config.sh"
    result = import_script(path.read_text(), "imp", source=path)
    assert result.config_name == "ppo_trainer" and result.spec is not None
    assert result.spec.recipe.data.max_prompt_length == 768  # from config/own_grpo.yaml
    assert result.spec.recipe.grpo.n == 8  # the script's override, over the config's 6
    assert any("own_grpo" in n and "extends verl's ppo_trainer" in n for n in result.script.notes)
    with pytest.raises(SpecError) as exc:
        import_script(path.read_text(), "imp")  # without the script's location its config cannot be found
    assert exc.value.key == "--config-name" and "own_grpo" in str(exc.value)


def test_verls_deprecated_global_micro_batch_becomes_the_per_gpu_form() -> None:
    """verl divides `ppo_micro_batch_size` by world size / ulysses SP at start-up: the import does the same."""
    require_verl_yamls()
    text = (CONSTRUCTS / "arrays.sh").read_text().replace(
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.ppo_micro_batch_size=16")
    result = import_script(text, "imp")
    (row,) = [r for r in result.rows if r.item == "actor_rollout_ref.actor.ppo_micro_batch_size=16"]
    assert row.went == "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4" and "4 GPUs" in row.why
    assert result.spec is not None and result.spec.recipe.batch.micro_per_gpu == 4
