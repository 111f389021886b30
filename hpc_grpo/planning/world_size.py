"""Whether a checkpoint loads at the world size a job will run at. The pinned verl does not reshard FSDP checkpoints: it
looks for model_world_size_<new>_rank_R.pt and the job dies at load, after its wait in the queue. `hpc-grpo resume`
checks it before it submits (hpc_grpo.commands.resume) and the job again at its start (hpc_grpo.job.prepare_resume);
the refusal names both ways out (resume at the saved size, or export and start a new run)."""

from __future__ import annotations

import shlex
from pathlib import Path

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.engines import get_engine
from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate.layout import export_dir


class WorldSizeMismatch(SpecError):
    """A verl FSDP checkpoint saved at another world size than the job would run at: verl cannot load it."""

    def __init__(self, message: str, checkpoint: Path, saved: int, new: int) -> None:
        super().__init__(message, key="resources")
        self.data = {"cause": "world size mismatch", "checkpoint": str(checkpoint),
                     "checkpoint_world_size": saved, "world_size": new}


def _shape_for(world: int, *specs: RunSpec) -> str:
    """resources overrides giving `world` training processes: the shape of a spec that had that size, else whole
    nodes of the last spec's processes per node, else one node."""
    key = specs[-1].procs_key
    for s in specs:
        if s.world_size == world:
            return f"resources.nodes={s.recipe.resources.nodes} {key}={s.procs_per_node}"
    per_node = specs[-1].procs_per_node
    if per_node and world % per_node == 0:
        return f"resources.nodes={world // per_node} {key}={per_node}"
    return f"resources.nodes=1 {key}={world}"


def new_run_command(spec: RunSpec, model_dir: Path) -> str:
    """`hpc-grpo submit` of a new run like this one (recipe, cluster, overrides, resources as now asked) whose
    model is `model_dir`."""
    keep: dict[str, str] = {}
    for item in spec.overrides:
        key = item.split("=", 1)[0].strip()
        keep.pop(key, None)  # the last value of a key wins, at its place
        if key != "model.path":
            keep[key] = item
    words = [f"recipe={spec.recipe.name}", f"cluster={spec.cluster.name}", *keep.values(), f"model.path={model_dir}"]
    return "hpc-grpo submit " + " ".join(shlex.quote(w) for w in words)


def check_world_size(spec: RunSpec, ckpt: ck.Checkpoint | None, before: RunSpec | None = None) -> None:
    """Refuse to resume a verl FSDP checkpoint at another world size than it was saved at (the pinned verl does not
    reshard: it looks for model_world_size_<new>_rank_R.pt and the job dies at load, after its wait in the queue).
    Megatron dist checkpoints reshard and trl saves whole weights: no refusal. `before`: the run's spec before
    this resume's overrides, whose shape the fix offers first. Used by `resume` and again in the job."""
    if ckpt is None:
        return
    saved = get_engine(spec.recipe.engine).checkpoint_world_size(ckpt)
    new = spec.world_size
    if saved is None or saved == new:
        return
    res = spec.recipe.resources
    run = shlex.quote(str(spec.path))
    exported = export_dir(spec.path, ckpt.step)
    back = _shape_for(saved, *[s for s in (before, spec) if s is not None])
    raise WorldSizeMismatch(
        f"world size {new} (resources.nodes={res.nodes} x {spec.procs_key}={spec.procs_per_node}) is refused: "
        f"the newest complete checkpoint {ckpt.path} is a verl FSDP checkpoint saved at world size {saved} "
        f"({ck.ACTOR}/{ck.fsdp_shard('model', saved, '*')}), and verl loads FSDP shards only at the world size that "
        f"wrote them (it would look for {ck.fsdp_shard('model', new, '*')} and fail at load, after the queue wait).\n"
        f"Fix, one of:\n"
        f"  (a) resume at world size {saved}: hpc-grpo resume {run} {back}\n"
        f"  (b) export step {ckpt.step} to a Hugging Face folder with verl's merger and start a new run from those "
        f"weights (optimizer state and step count start anew): hpc-grpo export {run} --step {ckpt.step} "
        f"(writes {exported}), then {new_run_command(spec, exported)}",
        ckpt.path, saved, new)
