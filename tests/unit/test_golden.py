"""Golden files: every recipe x cluster pair renders exactly the files in tests/golden/<recipe>__<cluster>/.

Inputs are pinned so the output depends on the repository only: run name "golden", override
`cluster.runs_root=/runs`, `now=0` (spec.yaml's `created:`) in UTC, HOME=/home/user and USER=user (so `~`
and $USER expand the same on every machine), HPC_GRPO_PATH unset (only this checkout's recipes and clusters).

Normalisation: render_sbatch puts `sys.executable` (the interpreter submitit's srun line runs) into
scripts/sbatch.sh; it differs per machine, so `normalise` replaces it with the literal `{python}` before comparing.
Nothing else is rewritten.

Pairs are discovered when the tests are collected (hpc_grpo.config.registry.list_names), so a new recipe or cluster
profile gets a golden test, which fails until its files exist. To (re)write the files after an intended change:

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


def discover_pairs() -> list[tuple[str, str]]:
    with mock.patch.dict(os.environ):
        os.environ.pop("HPC_GRPO_PATH", None)
        return [(r, c) for r in registry.list_names("recipes") for c in registry.list_names("clusters")]


PAIRS = discover_pairs()


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
    """Every golden folder belongs to a pair that still exists (UPDATE_GOLDEN=1 removes the others)."""
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
    assert not stale, f"golden folders without a recipe x cluster pair: {[p.name for p in stale]}; {UPDATE_CMD}"


def test_pairs_discovered() -> None:
    assert PAIRS, "no recipe x cluster pairs found"
    assert {"local"} <= {c for _, c in PAIRS}


def test_render_is_deterministic(pinned_env: None) -> None:
    recipe, cluster = PAIRS[0]
    assert render_pair(recipe, cluster) == render_pair(recipe, cluster)
