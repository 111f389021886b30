"""Each file and folder name of a run directory is spelled in hpc_grpo/runstate/layout.py only.

The check reads every module of hpc_grpo/ as an AST and looks at its string constants (f-string pieces included,
docstrings left out: they describe, they do not build paths):
- a file name of the layout (anything with a dot, dash or underscore: spec.yaml, .submit.lock, save_request,
  checkpoints-incomplete, ...) and submitit's log and result names (JOB_TASK_log.out/.err, JOB_0_result.pkl) may
  not stand as a word anywhere: in a path, a glob, a message or a help text, they come from layout;
- a folder name that is also a common word (eval, ray, scripts, exports, ...) may not be a path part or a
  constant's value: a side of `/`, `NAME = "exports"`, an argument of Path()/joinpath/os.path.join, or a part of
  a slash-separated string that follows a leading slash or RUN/RUN_DIR, or comes before a file name
  (`scripts/launch.sh`). As a plain word (a history purpose "eval", a W&B metric "eval/step", a JSON key
  "checkpoints") it is not a path and passes.
The checkpoint layout inside an engine's checkpoint (global_step_N, checkpoint-N, actor/, trainer_state.json) is
hpc_grpo.runstate.checkpoints's: the same check keeps those names in that module.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from hpc_grpo.runstate import checkpoints, layout

PACKAGE = Path(layout.__file__).resolve().parents[1]
LAYOUT = Path(layout.__file__).resolve()
SUBMITIT_NAMES = re.compile(r"_log\.(out|err)$|_result\.pkl$")
CHECKPOINTS = Path(checkpoints.__file__).resolve()
# checkpoint folders (global_step_N, checkpoint-N, as names, globs or f-string pieces) and FSDP shard names
CHECKPOINT_NAMES = re.compile(r"^(global_step_|checkpoint-)(\d+|N|\*)?$|_world_size_")
ROOT_WORDS = ("RUN", "RUN_DIR")

# (module relative to hpc_grpo/, name) -> why the literal stays
ALLOWED: dict[tuple[str, str], str] = {
    ("evaluation/scoring.py", "tasks"): "lm_eval's own package folder lm_eval/tasks, not a run directory's",
    ("planning/preflight.py", "huggingface"): "huggingface_hub's cache (~/.cache/huggingface), not a checkpoint's",
}


def layout_names() -> tuple[set[str], set[str]]:
    """(file names, folder names) of the layout: every part of its upper-case string constants."""
    parts = {p for k, v in vars(layout).items() if k.isupper() and isinstance(v, str) for p in v.split("/")}
    files = {p for p in parts if re.search(r"[._-]", p)}
    return files, parts - files


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}


def _pieces(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every string constant that is not a docstring; an f-string gives its literal pieces."""
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def _path_operands(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """String constants used as path parts: `x / "name"`, Path(x, "name"), x.joinpath("name"), os.path.join, and
    the value of an upper-case constant (`EXPORT_DIR = "exports"`: a second home of the name)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id.isupper() for t in targets) and isinstance(node.value.value, str):
                yield node.value.lineno, node.value.value
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and isinstance(side.value, str):
                    yield side.lineno, side.value
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in ("Path", "PurePath", "joinpath", "join"):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        yield arg.lineno, arg.value


def _words(text: str) -> list[str]:
    return [w.rstrip(".") for w in re.split(r"[\s/'\"`(),:;=\[\]{}<>|]+", text) if w.rstrip(".")]


def _folder_parts(text: str, folders: set[str]) -> list[str]:
    """Folder names that stand as path parts in a slash-separated string."""
    hits = []
    for token in text.split():
        parts = token.split("/")
        if len(parts) < 2:
            continue
        for i, part in enumerate(parts):
            if part not in folders:
                continue
            after_root = i > 0 and (parts[i - 1] == "" or parts[i - 1].strip("{}$") in ROOT_WORDS)
            before_file = i + 1 < len(parts) and "." in parts[i + 1]
            if after_root or before_file:
                hits.append(part)
    return hits


def checkpoint_names() -> tuple[set[str], set[str]]:
    """(file names, folder names) of the checkpoint layouts that hpc_grpo.runstate.checkpoints alone may spell."""
    files = {checkpoints.TRACKER, checkpoints.TRAINER_STATE, checkpoints.ADAPTER_CONFIG, checkpoints.LORA_META,
             checkpoints.LORA_ADAPTER, "fsdp_config.json", "ckpt_contents.json", "data.pt"}
    return files, {checkpoints.ACTOR, "huggingface"}


def spelled(path: Path, files: set[str], folders: set[str], pattern: re.Pattern[str] = SUBMITIT_NAMES
            ) -> list[tuple[int, str]]:
    """(line, name) of each of these names (and words matching `pattern`) this module spells itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for line, text in _pieces(tree):
        out += [(line, w) for w in _words(text) if w in files or pattern.search(w)]
        out += [(line, f) for f in _folder_parts(text, folders)]
    for line, text in _path_operands(tree):
        out += [(line, p) for p in text.split("/") if p in folders]
    return sorted(set(out))


def elsewhere(home: Path, files: set[str], folders: set[str], pattern: re.Pattern[str]) -> list[str]:
    """Every spelling of these names in hpc_grpo/ outside their home module, less the allowed ones."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.resolve() == home:
            continue
        rel = str(path.relative_to(PACKAGE))
        found += [f"{rel}:{line}: {name!r}" for line, name in spelled(path, files, folders, pattern)
                  if (rel, name) not in ALLOWED]
    return found


def test_layout_names_are_spelled_in_layout_only() -> None:
    files, folders = layout_names()
    assert {"spec.yaml", "metrics.jsonl", "train_done.json", "checkpoints", "eval", "submitit"} <= files | folders
    found = elsewhere(LAYOUT, files, folders, SUBMITIT_NAMES)
    assert not found, "spell these through hpc_grpo.runstate.layout:\n" + "\n".join(found)


def test_checkpoint_layouts_are_spelled_in_checkpoints_only() -> None:
    files, folders = checkpoint_names()
    found = elsewhere(CHECKPOINTS, files, folders, CHECKPOINT_NAMES)
    assert not found, "read these through hpc_grpo.runstate.checkpoints:\n" + "\n".join(found)


def test_the_check_sees_each_form(tmp_path: Path) -> None:
    """The forms the check must catch (and the plain words it must let pass), so a weakened check fails here."""
    files, folders = layout_names()
    module = tmp_path / "m.py"
    module.write_text('"""RUN/spec.yaml in a docstring is prose."""\n'
                      'a = run / "spec.yaml"\n'
                      'b = f"{run}/ray"\n'
                      'c = run / "submitit"\n'
                      'd = "scripts/launch.sh"\n'
                      'e = f"{job}_0_log.out"\n'
                      'f = Path(run, "exports")\n'
                      'g = "see RUN/eval/ for the scores"\n'
                      'LEASES = "leases"\n'
                      'ok = ("eval", "eval/step", {"checkpoints": []}, ["ray", "start"])\n')
    got = sorted({line for line, _ in spelled(module, files, folders)})
    assert got == [2, 3, 4, 5, 6, 7, 8, 9]
    ckpt_files, ckpt_folders = checkpoint_names()
    module.write_text('a = f"global_step_{n}"\n'
                      'b = ckpt / "actor" / "huggingface"\n'
                      'c = f"model_world_size_{w}_rank_*.pt"\n'
                      'd = path / "trainer_state.json"\n'
                      'ok = ("checkpoint-lock-lease", "actor", "checkpoint-and-requeue")\n')
    got = sorted({line for line, _ in spelled(module, ckpt_files, ckpt_folders, CHECKPOINT_NAMES)})
    assert got == [1, 2, 3, 4]
