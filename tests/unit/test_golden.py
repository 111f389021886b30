"""Golden files: a representative set of recipe x cluster pairs renders exactly the files in
tests/golden/<recipe>__<cluster>/.

The set, not the whole matrix: every recipe on one cluster and every cluster with at least one recipe, chosen so
each branch of the templates and of the engines' commands that differs between pairs is pinned somewhere (GOLDEN_SET
says why each pair is in it). The rest of the matrix is covered without golden files: docs/recipe-matrix.md (plan's
verdict for every pair, tests/unit/test_recipe_matrix.py), tests/unit/test_render.py (every pair's scripts pass
`bash -n` and shellcheck, their header), tests/unit/test_quoting.py (no secret in any pair's files) and
tests/unit/test_render_props.py (every pair's scripts ask Slurm for the plan's layout, start it, and carry each value
through the one shell filter to bash exactly). So a new recipe key changes at most one file per golden folder plus the
launch script of the folders whose engine passes it on (test_a_new_recipe_key_changes_at_most_20_golden_files).

Inputs are pinned so the output depends on the repository only: run name "golden", override
`cluster.runs_root=/runs`, `now=0` (spec.yaml's `created:`) in UTC, HOME=/home/user and USER=user (so `~`
and $USER expand the same on every machine), HPC_GRPO_PATH unset (only this checkout's recipes and clusters).

Normalisation: render_sbatch puts `sys.executable` (the interpreter submitit's srun line runs) into
scripts/sbatch.sh; it differs per machine, so `normalise` replaces it with the literal `{python}` before comparing.
Nothing else is rewritten.

A new recipe or cluster profile fails test_the_set_covers_every_recipe_and_cluster until a pair of it is added to
GOLDEN_SET (with its reason). To (re)write the files after an intended change:

    UPDATE_GOLDEN=1 python -m pytest tests/unit/test_golden.py

then review `git diff tests/golden` before committing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from hpc_grpo.config import registry
from hpc_grpo.launch.render import render_all
from hpc_grpo.config.resolve import resolve_spec

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
RUN_NAME = "golden"
OVERRIDES = ["cluster.runs_root=/runs"]
NOW = 0.0
# rendered path -> golden file name (eval_sbatch.sh: only where submit queues an eval job after training)
FILES = {"spec.yaml": "spec.yaml", "scripts/sbatch.sh": "sbatch.sh", "scripts/launch.sh": "launch.sh",
         "scripts/eval_sbatch.sh": "eval_sbatch.sh"}
UPDATE_CMD = "UPDATE_GOLDEN=1 python -m pytest tests/unit/test_golden.py"


def updating() -> bool:
    return os.environ.get("UPDATE_GOLDEN") == "1"


MAX_FOLDERS = 20
MAX_FILES_PER_KEY = 20

# (recipe, cluster) -> why the pair is in the set: the branch of a template or an engine command it pins.
GOLDEN_SET: dict[tuple[str, str], str] = {
    ("qwen2.5-3b-gsm8k-lora", "a100-ib"): "verl FSDP + LoRA + vLLM on GPUs; setup modules and venv, InfiniBand NCCL "
                                          "env, --gpus-per-node with a GPU type",
    ("qwen2.5-3b-gsm8k-lora", "h100-roce"): "the same recipe in a container: pyxis srun options, mounts, python3 of "
                                            "the image, requeue asked by the batch script, --gres, a qos",
    ("qwen2.5-72b-megatron", "h100-efa"): "verl Megatron dense, multi-node (4 x 8): TP x PP, sequence parallel, "
                                          "optimizer offload",
    ("qwen2.5-7b-codegen", "a100-ib"): "verl Megatron with the code-execution reward (its pkg:// path and kwargs), "
                                       "dynamic batch size, `+` passthrough keys, HumanEval eval job",
    ("qwen3-30b-a3b-moe", "h100-roce"): "verl Megatron MoE (EP, ETP) over 2 nodes in a container with --gres",
    ("ray-probe", "slurm-dev"): "a custom driver (launch.driver: no resume overrides), 2 nodes on slurm-dev, "
                                "eval disabled (no eval script)",
    ("tiny-verl-megatron", "local"): "verl Megatron's CPU mode on cluster=local: mbridge keys, bshd, local attention, "
                                     "host init and the fusions off, TP 2 on stand-in GPUs",
    ("tiny-verl", "local"): "verl's CPU mode (node env, stand-in GPUs) on cluster=local: local Ray address, "
                            "no requeue line, no eval script",
    ("tiny-verl-math", "slurm-dev"): "verl's CPU mode as a Slurm CPU job with the MATH reward and its eval job "
                                     "(the path CI runs)",
    ("tiny-gsm8k", "local"): "trl on CPU on cluster=local: the trl launch script, the README's first run",
    ("tiny-codegen", "slurm-dev"): "trl with the code reward as a Slurm CPU job: the eval job's own CPU resources",
    ("tiny-math", "a100-ib"): "a CPU job on a GPU profile: no GPU line, the profile's modules and venv; MATH eval",
}


def discover_pairs() -> list[tuple[str, str]]:
    """Every recipe x cluster pair this checkout ships (HPC_GRPO_PATH unset)."""
    with mock.patch.dict(os.environ):
        os.environ.pop("HPC_GRPO_PATH", None)
        return [(r, c) for r in registry.list_names("recipes") for c in registry.list_names("clusters")]


MATRIX = discover_pairs()
PAIRS = sorted(GOLDEN_SET)


@pytest.fixture
def pinned_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HOME", "/home/user")
    monkeypatch.setenv("USER", "user")
    monkeypatch.setenv("TZ", "UTC")
    for var in ("HPC_GRPO_PATH", "WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def normalise(text: str) -> str:
    return text.replace(sys.executable, "{python}")


def render_pair(recipe: str, cluster: str) -> dict[str, str]:
    """Golden file name -> normalised text. Call inside `pinned_env`."""
    spec = resolve_spec(recipe, cluster, list(OVERRIDES), run_name=RUN_NAME, now=NOW)
    files = render_all(spec)
    assert set(files) <= set(FILES), f"render_all now writes {sorted(files)}: update FILES in {__file__}"
    return {FILES[rel]: normalise(text) for rel, text in files.items()}


@pytest.mark.parametrize(("recipe", "cluster"), PAIRS, ids=[f"{r}__{c}" for r, c in PAIRS])
def test_golden(recipe: str, cluster: str, pinned_env: None) -> None:
    folder = GOLDEN / f"{recipe}__{cluster}"
    rendered = render_pair(recipe, cluster)
    if updating():
        folder.mkdir(parents=True, exist_ok=True)
        changed = []
        for name, text in rendered.items():
            path = folder / name
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                changed.append(name)
        for path in folder.iterdir():
            if path.name not in rendered:
                path.unlink()
                changed.append(f"removed {path.name}")
        print(f"UPDATE_GOLDEN: {folder.relative_to(GOLDEN.parent.parent)}: "
              + (f"updated {', '.join(changed)}" if changed else "unchanged"))
        return
    missing = [name for name in rendered if not (folder / name).is_file()]
    if missing:
        pytest.fail(f"no golden file {', '.join(str(folder / m) for m in missing)}; create it with:\n    {UPDATE_CMD}")
    extra = sorted(p.name for p in folder.iterdir() if p.name not in rendered)
    assert not extra, f"{recipe}__{cluster} no longer renders {extra}: {UPDATE_CMD}"
    for name, text in rendered.items():
        expected = (folder / name).read_text(encoding="utf-8")
        # Plain == so pytest prints a diff; the name says which file.
        assert text == expected, f"{recipe}__{cluster}/{name} differs from its golden file (intended? {UPDATE_CMD})"


def test_no_stale_golden() -> None:
    """Every golden folder belongs to a pair of the set (UPDATE_GOLDEN=1 removes the others)."""
    if not GOLDEN.is_dir():
        pytest.fail(f"{GOLDEN} is missing; create the golden files with:\n    {UPDATE_CMD}")
    current = {f"{r}__{c}" for r, c in PAIRS}
    stale = sorted(p for p in GOLDEN.iterdir() if p.is_dir() and p.name not in current)
    if updating():
        for folder in stale:
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()
            print(f"UPDATE_GOLDEN: removed stale {folder}")
        return
    assert not stale, f"golden folders of no pair in GOLDEN_SET: {[p.name for p in stale]}; {UPDATE_CMD}"


def test_the_set_covers_every_recipe_and_cluster() -> None:
    """Each shipped recipe on one cluster, each shipped cluster with one recipe; only shipped pairs; at most
    MAX_FOLDERS of them, each with its reason."""
    assert set(PAIRS) <= set(MATRIX), f"pairs of no shipped recipe or cluster: {sorted(set(PAIRS) - set(MATRIX))}"
    missing_recipes = sorted({r for r, _ in MATRIX} - {r for r, _ in PAIRS})
    missing_clusters = sorted({c for _, c in MATRIX} - {c for _, c in PAIRS})
    assert not missing_recipes and not missing_clusters, (
        f"no golden pair for recipes {missing_recipes} / clusters {missing_clusters}: add one pair each to "
        f"GOLDEN_SET in {Path(__file__).name} (with why), then {UPDATE_CMD}")
    assert len(PAIRS) <= MAX_FOLDERS, f"{len(PAIRS)} golden pairs: the set is at most {MAX_FOLDERS}"
    assert all(why.strip() for why in GOLDEN_SET.values())


def test_the_golden_folder_holds_at_most_max_folders() -> None:
    folders = [p for p in GOLDEN.iterdir() if p.is_dir()]
    assert 0 < len(folders) <= MAX_FOLDERS, f"{len(folders)} folders in {GOLDEN}"


NEW_KEY = ("loss_agg_mode", "token-mean")  # a new grpo key, as a maintainer adds one
NEW_OVERRIDE = "actor_rollout_ref.actor.loss_agg_mode"


def test_a_new_recipe_key_changes_at_most_20_golden_files(pinned_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new recipe key reaches the frozen spec of every run and, where the engine passes it on, its launch script:
    simulated here by adding it where the real code writes those (the spec's YAML, verl's derived overrides), then
    rendering the set and counting the golden files that would change."""
    from hpc_grpo.engines import verl as verl_engine
    from hpc_grpo.launch import render

    dump, algorithm = render.dump_yaml, verl_engine._algorithm_and_data

    def dump_with_key(data: dict) -> str:
        data["recipe"]["grpo"][NEW_KEY[0]] = NEW_KEY[1]
        return dump(data)

    def algorithm_with_key(spec: object) -> list:
        return [*algorithm(spec), verl_engine.Override(NEW_OVERRIDE, NEW_KEY[1], f"grpo.{NEW_KEY[0]}")]

    monkeypatch.setattr(render, "dump_yaml", dump_with_key)
    monkeypatch.setattr(verl_engine, "_algorithm_and_data", algorithm_with_key)
    changed = [f"{r}__{c}/{name}" for r, c in PAIRS for name, text in render_pair(r, c).items()
               if text != (GOLDEN / f"{r}__{c}" / name).read_text(encoding="utf-8")]
    specs = {n for n in changed if n.endswith("/spec.yaml")}
    launches = {n for n in changed if n.endswith("/launch.sh")}
    verl_driven = {f"{r}__{c}/launch.sh" for r, c in PAIRS
                   if "verl.trainer.main_ppo" in (GOLDEN / f"{r}__{c}" / "launch.sh").read_text(encoding="utf-8")}
    assert len(specs) == len(PAIRS), changed  # every frozen spec records the key
    assert launches == verl_driven and verl_driven, (launches, verl_driven)  # verl's command passes it on, trl's not
    assert set(changed) == specs | launches, changed
    assert len(changed) <= MAX_FILES_PER_KEY, f"a new recipe key changes {len(changed)} golden files: {changed}"


def test_render_is_deterministic(pinned_env: None) -> None:
    recipe, cluster = PAIRS[0]
    assert render_pair(recipe, cluster) == render_pair(recipe, cluster)
