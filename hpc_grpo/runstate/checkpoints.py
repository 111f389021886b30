"""The one module that knows each engine's checkpoint layout: which folders are checkpoints, of which
step, how big, and whether a resume may trust them.

resume preparation, status, prune-ckpts and eval read checkpoint folders only through here. Light
on purpose (status and prune import it): no torch. A torch file is judged by its zip end record and
central directory, a safetensors file by its header against its size, both without loading data.

Layouts (the pinned verl, checked against its checkpoint managers; trl/transformers 5):
- verl FSDP: RUN/checkpoints/global_step_N/{data.pt, actor/{model,optim,extra_state}_world_size_W_rank_R.pt,
  actor/fsdp_config.json, actor/huggingface/, actor/lora_train_meta.json (LoRA)}. fsdp_config.json holds W
  but is not a completion marker (rank 0 writes it while other ranks may still be saving); data.pt is
  written after every rank's actor save.
- verl Megatron (layout v2): actor/ckpt_contents.json, written last (tmp + rename), lists what was saved
  (paths relative to actor/): model/dist_ckpt, model/huggingface, optimizer/dist_ckpt, extra/dist_ckpt,
  transformer_config.json.
- trl: RUN/checkpoints/checkpoint-N/{trainer_state.json, adapter_model.safetensors | model.safetensors,
  optimizer.pt, scheduler.pt, rng_state*.pth}; trainer_state.json is written after the others.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import struct
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_grpo.config.engine_traits import ENGINE_NAMES, traits_of
from hpc_grpo.runstate.layout import checkpoints_dir, quarantine_dir  # the run directory's names

TRACKER = "latest_checkpointed_iteration.txt"  # verl's tracker, in RUN/checkpoints/
ENGINES = ENGINE_NAMES

FOLDER_RE = {"verl": re.compile(r"^global_step_(\d+)$"), "trl": re.compile(r"^checkpoint-(\d+)$")}
FOLDER_FORM = {"verl": "global_step_N", "trl": "checkpoint-N"}  # how messages name them
TRAINER_STATE = "trainer_state.json"  # trl: written after the rest of a checkpoint
ADAPTER_CONFIG = "adapter_config.json"  # peft: a folder whose weights are a LoRA adapter
FSDP_KINDS = ("model", "optim", "extra_state")
FSDP_SHARD_RE = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")
ACTOR = "actor"  # verl: the actor's state in global_step_N/ (the merger's input)
LORA_META = "lora_train_meta.json"  # verl FSDP LoRA: r and lora_alpha, in actor/
LORA_ADAPTER = "lora_adapter"  # verl: where a LoRA adapter is written (Megatron's checkpoint, FSDP's merger output)
TRL_WEIGHTS = ("adapter_model.safetensors", "model.safetensors", "adapter_model.bin", "pytorch_model.bin")
TRL_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TRL_STATE = ("optimizer.pt", "scheduler.pt")
TORCH_SUFFIXES = (".pt", ".pth", ".bin")
# A Hugging Face model folder's tokenizer (export copies them; trl's prompt-length cache keys on them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                   "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json")
_MAX_SAFETENSORS_HEADER = 100_000_000


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint folder as found on disk."""

    step: int
    path: Path  # RUN/checkpoints/global_step_N (verl) or RUN/checkpoints/checkpoint-N (trl)
    layout: str  # "verl-fsdp" | "verl-megatron" | "trl" | "unknown" (too broken to tell)
    complete: bool
    reason: str  # why complete ("4 FSDP shards") or not ("model shard rank 3 truncated")
    size_bytes: int  # regular files below path; symlinks neither followed nor counted
    mtime: float  # newest mtime below path: a writer still at work keeps it fresh


# ------------------------------------------------------------------------------------ single files
def file_is_whole(path: Path) -> tuple[bool, str]:
    """Whether one file was written to its end, judged without loading it.

    .pt/.pth/.bin: a torch.save zip whose end record and central directory are there and whose last
    member ends inside the file (a write cut short has no end record). .safetensors: the header parses
    and the tensors it describes end exactly at the file's end. .json: it parses. Other files: they exist.
    """
    path = Path(path)
    name = path.name
    try:
        st = path.lstat()
    except OSError:
        return False, f"{name} is missing"
    if path.is_symlink() or not path.is_file():
        return False, f"{name} is not a regular file"
    if st.st_size == 0:
        return False, f"{name} is empty"
    if name.endswith(TORCH_SUFFIXES):
        return _torch_zip_whole(path, st.st_size)
    if name.endswith(".safetensors"):
        return _safetensors_whole(path, st.st_size)
    if name.endswith(".json"):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return False, f"{name} does not parse ({exc.__class__.__name__})"
        return True, f"{name} parses"
    return True, f"{name} exists"


def _torch_zip_whole(path: Path, size: int) -> tuple[bool, str]:
    try:
        with zipfile.ZipFile(path) as zf:  # reads the end record and central directory only
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, struct.error):
        return False, f"{path.name} is truncated or not a torch zip ({size} bytes, no zip end record)"
    if not infos:
        return False, f"{path.name} is an empty zip"
    end = max(i.header_offset + 30 + len(i.filename.encode()) + i.compress_size for i in infos)
    if end > size:
        return False, f"{path.name} is truncated (its last member ends at byte {end}, file has {size})"
    return True, f"{path.name} is a whole torch zip"


def _safetensors_whole(path: Path, size: int) -> tuple[bool, str]:
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return False, f"{path.name} is truncated (no header length)"
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8 or n > _MAX_SAFETENSORS_HEADER:
                return False, f"{path.name} is truncated (header of {n} bytes, file has {size})"
            header = json.loads(fh.read(n))
    except (OSError, ValueError) as exc:
        return False, f"{path.name} has an unreadable header ({exc.__class__.__name__})"
    if not isinstance(header, dict):
        return False, f"{path.name} has an unreadable header"
    try:
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    except (KeyError, TypeError, ValueError, IndexError):
        return False, f"{path.name} has a malformed header"
    expected = 8 + n + max(ends, default=0)
    if expected != size:
        return False, f"{path.name} is truncated ({size} of {expected} bytes)"
    return True, f"{path.name} is whole"


# ------------------------------------------------------------------------------------ listing
def list_checkpoints(run_dir: Path, engine: str) -> list[Checkpoint]:
    """Every checkpoint folder of the run, oldest first. Never raises on broken trees: a broken one is
    complete=False with its reason. engine: "verl" (global_step_N) or "trl" (checkpoint-N)."""
    if engine not in FOLDER_RE:
        raise ValueError(f"engine {engine!r} is not one of {ENGINES}")
    root = checkpoints_dir(run_dir)
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    found = []
    for entry in entries:
        m = FOLDER_RE[engine].match(entry.name)
        if m:
            found.append(judge(Path(entry.path), engine, int(m.group(1))))
    return sorted(found, key=lambda c: c.step)


def candidates(run_dir: Path, engine: str) -> list[tuple[int, Path]]:
    """(step, entry) of every checkpoint-named entry, oldest first, none opened: the cheap first pass.
    Prune's first pass (hpc_grpo.runstate.prune): it opens only the entries whose verdict needs it."""
    pattern = FOLDER_RE[engine]
    try:
        with os.scandir(checkpoints_dir(run_dir)) as it:
            found = [(int(m.group(1)), Path(e.path)) for e in it if (m := pattern.match(e.name))]
    except OSError:
        return []
    return sorted(found)


def judge(path: Path, engine: str, step: int | None = None) -> Checkpoint:
    """One folder as a Checkpoint (step from its name unless given)."""
    path = Path(path)
    if step is None:
        named = folder_step(engine, path.name)
        step = -1 if named is None else named
    size, mtime = _size_and_mtime(path)
    if path.is_symlink():
        return Checkpoint(step, path, "unknown", False, "a symlink (never followed)", 0, mtime)
    if not path.is_dir():
        return Checkpoint(step, path, "unknown", False, "not a folder", size, mtime)
    try:
        if traits_of(engine).checkpoint_format == "hf-trainer":
            layout, ok, reason = "trl", *_trl_complete(path, step)
        else:
            layout, ok, reason = _verl_complete(path)
    except OSError as exc:  # a folder that vanishes or turns unreadable under us
        layout, ok, reason = "unknown", False, f"unreadable ({exc.strerror or exc})"
    return Checkpoint(step, path, layout, ok, reason, size, mtime)


def newest_complete(ckpts: list[Checkpoint]) -> Checkpoint | None:
    """The checkpoint a resume starts from: the highest complete step."""
    done = [c for c in ckpts if c.complete]
    return max(done, key=lambda c: c.step) if done else None


def tracker_file(run_dir: Path) -> Path:
    """verl's latest_checkpointed_iteration.txt, in RUN/checkpoints/."""
    return checkpoints_dir(run_dir) / TRACKER


def tracker_step(run_dir: Path) -> int | None:
    """The step in verl's latest_checkpointed_iteration.txt; None when missing, empty or garbage
    (verl's own `auto` mode crashes on an empty one and restarts from 0 on a missing one)."""
    try:
        text = tracker_file(run_dir).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def quarantine(run_dir: Path, ckpt: Checkpoint) -> Path:
    """Move (never delete) a checkpoint folder into RUN_DIR/checkpoints-incomplete/ under a unique
    name; returns the new path. The caller holds the run's checkpoint lock (runs.checkpoint_lock)."""
    target_dir = quarantine_dir(run_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{ckpt.path.name}.{time.strftime('%Y%m%d-%H%M%S')}"
    for i in range(1000):
        target = target_dir / (stem if i == 0 else f"{stem}.{i}")
        if not os.path.lexists(target):
            break
    else:
        raise FileExistsError(f"no free name for {ckpt.path.name} in {target_dir}")
    try:
        os.rename(ckpt.path, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.move(str(ckpt.path), str(target))  # checkpoints/ on another filesystem: copy, then remove
    return target


# ------------------------------------------------------------------------------------ internals
def _size_and_mtime(path: Path) -> tuple[int, float]:
    """Sum of regular files below path and their newest mtime; symlinks are not followed or counted."""
    try:
        st = path.lstat()
    except OSError:
        return 0, 0.0
    newest = st.st_mtime
    if path.is_symlink() or not path.is_dir():
        return (st.st_size if path.is_file() and not path.is_symlink() else 0), newest
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False, onerror=lambda _e: None):
        for name in dirnames:
            try:
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
            except OSError:
                continue
        for name in filenames:
            try:
                s = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            newest = max(newest, s.st_mtime)
            if stat.S_ISREG(s.st_mode):
                total += s.st_size
    return total, newest


def _first_problem(files: list[Path]) -> str:
    for f in files:
        ok, why = file_is_whole(f)
        if not ok:
            return why
    return ""


def _trl_complete(path: Path, step: int) -> tuple[bool, str]:
    """transformers writes weights, then optimizer/scheduler/RNG state, then trainer_state.json."""
    state = path / TRAINER_STATE
    ok, why = file_is_whole(state)
    if not ok:
        return False, why
    try:
        global_step = json.loads(state.read_text(encoding="utf-8")).get("global_step")
    except AttributeError:
        return False, "trainer_state.json is not a mapping"
    if global_step != step:
        return False, f"trainer_state.json has global_step {global_step}, expected {step}"
    problem = _trl_weights(path)
    if problem:
        return False, problem
    rng = sorted(path.glob("rng_state*.pth"))
    if not rng:
        return False, "rng_state.pth is missing"
    problem = _first_problem([path / n for n in TRL_STATE] + rng)
    if problem:
        return False, problem
    weights = next((n for n in TRL_WEIGHTS if (path / n).exists()), "sharded weights")
    return True, f"complete ({weights}, optimizer, scheduler, {len(rng)} rng state)"


def _trl_weights(path: Path) -> str:
    for name in TRL_WEIGHTS:
        if (path / name).exists():
            ok, why = file_is_whole(path / name)
            return "" if ok else why
    for name in TRL_INDEXES:
        index = path / name
        if index.exists():
            ok, why = file_is_whole(index)
            if not ok:
                return why
            try:
                shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            except (KeyError, TypeError, AttributeError):
                return f"{name} has no weight_map"
            return _first_problem([path / s for s in shards])
    return "no weights file (adapter_model.safetensors or model.safetensors)"


def _verl_complete(path: Path) -> tuple[str, bool, str]:
    actor = actor_dir(path)
    if (actor / "ckpt_contents.json").exists() or any((actor / d).is_dir() for d in ("model", "optimizer", "extra")):
        layout = "verl-megatron"
        ok, reason = _megatron_complete(actor)
    elif (actor / "fsdp_config.json").exists() or (actor.is_dir() and any(FSDP_SHARD_RE.match(p.name)
                                                                          for p in actor.iterdir())):
        layout = "verl-fsdp"
        ok, reason = _fsdp_complete(actor)
    else:
        return "unknown", False, "no actor/ state (neither FSDP shards nor a Megatron ckpt_contents.json)"
    if ok:
        data_ok, why = file_is_whole(path / "data.pt")
        if not data_ok:
            return layout, False, f"{why} (dataloader state, written after the actor)"
    return layout, ok, reason


def _fsdp_complete(actor: Path) -> tuple[bool, str]:
    cfg = actor / "fsdp_config.json"
    ok, why = file_is_whole(cfg)
    if not ok:
        return False, why
    world = _fsdp_world(actor)
    if world is None:
        return False, "fsdp_config.json has no positive integer world_size"
    for kind in FSDP_KINDS:
        for rank in range(world):
            shard = actor / fsdp_shard(kind, world, rank)
            if not shard.exists():
                return False, f"{kind} shard rank {rank} of {world} is missing"
            ok, why = file_is_whole(shard)
            if not ok:
                return False, f"{kind} shard rank {rank} of {world}: {why}"
    extras = [actor / n for n in (LORA_META,) if (actor / n).exists()]
    hf = hf_dir(actor.parent, "verl-fsdp")
    if hf.is_dir():
        extras += sorted(p for p in hf.iterdir() if p.suffix in (".json", ".safetensors"))
    problem = _first_problem(extras)
    if problem:
        return False, problem
    lora = " (LoRA)" if (actor / LORA_META).exists() else ""
    return True, f"{world} FSDP shards{lora}"


def _fsdp_world(actor: Path) -> int | None:
    """W of actor/fsdp_config.json (the world size whose shards verl wrote); None without a positive integer."""
    try:
        world = int(json.loads((actor / "fsdp_config.json").read_text(encoding="utf-8"))["world_size"])
    except (OSError, KeyError, TypeError, ValueError, AttributeError):
        return None
    return world if world >= 1 else None


def _megatron_complete(actor: Path) -> tuple[bool, str]:
    manifest = actor / "ckpt_contents.json"
    if not manifest.exists():
        return False, "no actor/ckpt_contents.json (Megatron writes it last)"
    ok, why = file_is_whole(manifest)
    if not ok:
        return False, why
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        contents = data["contents"]
        paths = sorted({str(v["path"]) for v in contents.values()})
    except (KeyError, TypeError, AttributeError):
        return False, "ckpt_contents.json has no contents"
    step = data.get("global_step")
    folder = actor.parent.name.removeprefix("global_step_")
    if folder.isdigit() and isinstance(step, int) and step != int(folder):
        return False, f"ckpt_contents.json is for step {step}, folder is {actor.parent.name}"
    for rel in paths:
        target = actor / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            return False, f"ckpt_contents.json lists {rel!r} outside the checkpoint"
        if target.is_dir():
            if rel.endswith("dist_ckpt") and not (target / ".metadata").is_file():
                return False, f"{rel} has no .metadata (dist checkpoint not finished)"
            if not any(target.iterdir()):
                return False, f"{rel} is empty"
            problem = _first_problem(sorted(p for p in target.iterdir()
                                            if p.suffix in (".json", ".safetensors", ".pt")))
            if problem:
                return False, f"{rel}: {problem}"
        else:
            ok, why = file_is_whole(target)
            if not ok:
                return False, f"{rel} listed in ckpt_contents.json: {why}"
    return True, f"Megatron manifest and its {len(paths)} entries"


def recorded_total_steps(ckpt: Checkpoint) -> int | None:
    """The run's total step count as the engine recorded it in a checkpoint: trl's trainer_state.json max_steps
    (verl records none: its total comes from the recipe). None when absent or not a positive integer."""
    if ckpt.layout != "trl":
        return None
    value = (trainer_state(ckpt.path) or {}).get("max_steps")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def trainer_state(path: Path) -> dict[str, Any] | None:
    """A trl checkpoint's trainer_state.json (log_history, max_steps, ...); None when missing, unreadable or not a
    mapping."""
    try:
        state = json.loads((Path(path) / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def folder_step(engine: str, name: str) -> int | None:
    """The step of a checkpoint folder's name (global_step_N, checkpoint-N); None for any other name."""
    m = FOLDER_RE[engine].match(name)
    return int(m.group(1)) if m else None


def holds_adapter(folder: Path) -> bool:
    """Whether a trl checkpoint (or any Hugging Face folder) holds a peft adapter rather than whole weights."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def fsdp_world_size(ckpt: Checkpoint) -> int | None:
    """The world size a verl FSDP checkpoint was saved at: the pinned verl loads `model_world_size_W_rank_R.pt` only
    for its own W (no resharding, verl issue #2265), so a resume must run at this size. None for other layouts
    (Megatron dist checkpoints reshard; trl saves whole weights) and for an FSDP folder without a readable W."""
    if ckpt.layout != "verl-fsdp":
        return None
    return _fsdp_world(actor_dir(ckpt.path))


def fsdp_shard(kind: str, world: int | str, rank: int | str) -> str:
    """The name of one FSDP shard file in actor/ ("model", 4, 0 -> model_world_size_4_rank_0.pt; "*" globs)."""
    return f"{kind}_world_size_{world}_rank_{rank}.pt"


def actor_dir(ckpt: Path) -> Path:
    """verl: a global_step_N folder's actor state (FSDP shards or Megatron's dist checkpoint)."""
    return Path(ckpt) / ACTOR


def hf_dir(ckpt: Path, layout: str) -> Path:
    """verl: the Hugging Face folder a checkpoint carries: FSDP's config and tokenizer copy (actor/huggingface/),
    Megatron's weights written by mbridge (actor/model/huggingface/)."""
    actor = actor_dir(ckpt)
    return actor / "model" / "huggingface" if layout == "verl-megatron" else actor / "huggingface"


def megatron_adapter(ckpt: Path) -> Path | None:
    """verl Megatron with LoRA: the adapter folder, beside mbridge's HF weights or in actor/; None without LoRA."""
    for folder in (hf_dir(ckpt, "verl-megatron") / LORA_ADAPTER, actor_dir(ckpt) / LORA_ADAPTER):
        if folder.is_dir():
            return folder
    return None


TRL_TRAINER_FILES = ("trainer_state", "training_args", "optimizer", "scheduler", "rng_state")  # name prefixes


def trl_model_files(path: Path) -> list[Path]:
    """A full fine-tune trl checkpoint's Hugging Face model files (weights, config, tokenizer), without the trainer's
    state; empty when the checkpoint holds no whole weights (model.safetensors or its shards)."""
    path = Path(path)
    if not ((path / "model.safetensors").is_file() or any(path.glob("model-*.safetensors"))):
        return []
    return [f for f in sorted(path.iterdir()) if f.is_file() and f.suffix in (".safetensors", ".json", ".jinja", ".txt")
            and not f.name.startswith(TRL_TRAINER_FILES)]
