"""In-job entry point of the trl engine: `python -m hpc_grpo.job.trl_job --spec RUN_DIR/spec.yaml`.

Everything it needs is in the run directory (the frozen spec names model, data and settings), so a
requeued job on another node carries on where the last one stopped: it resumes from the newest
COMPLETE checkpoint (checked file by file, never "the newest folder"), moves newer incomplete ones
aside (hpc_grpo.job.prepare_resume, shared with verl), and drops metric lines of steps that will be trained again. Heavy imports (torch, transformers,
trl, peft, datasets) happen inside main(), so importing this module stays cheap.

Files it writes in RUN_DIR: checkpoints/checkpoint-N/ (trl), metrics.jsonl (one line per step),
train_done.json (on success), checkpoints-incomplete/ (moved-aside partial checkpoints),
prompt_lengths.json (tokenized prompt lengths, reused by requeued jobs), wandb/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout, runs, sweeps
from hpc_grpo.common.atomic import write_json_atomic, write_text_atomic as write_atomic
from hpc_grpo.runstate.checkpoints import Checkpoint
from hpc_grpo.runstate.metrics import file_rows, parse_record, read_raw
from hpc_grpo.engines.trl import TrlEngine, grpo_config_kwargs, lora_config_kwargs
from hpc_grpo.job import disk, health_watch, prepare_resume, save_signal
from hpc_grpo.job.early_stop import Plateau, halved
from hpc_grpo.runstate.prune import job_prune
from hpc_grpo.runstate import save_request
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.common.loading import load_object
from hpc_grpo.config import reward_registry as rewards

ENGINE = TrlEngine.name  # this job trains trl runs only; its checkpoints, disk reserve and resume are trl's

# trl log key -> metrics.jsonl key
METRIC_KEYS = {
    "reward": "reward",
    "reward_std": "reward_std",
    "loss": "loss",
    "kl": "kl",
    "learning_rate": "lr",
    "entropy": "entropy",
    "grad_norm": "grad_norm",
    "completions/mean_length": "completion_length",
    "step_time": "step_time",
    "epoch": "epoch",
}


class JobError(RuntimeError):
    """A problem the user fixes in the spec or the run directory; printed without a traceback."""


_T0 = time.monotonic()


def log(message: str) -> None:
    """One prefixed line with seconds since start: Slurm logs then show where the time went."""
    print(f"[hpc-grpo trl +{time.monotonic() - _T0:.1f}s] {message}", flush=True)


# ------------------------------------------------------------------------------------ run dir state
def trim_metrics(path: Path, resume_step: int) -> int:
    """Drop lines of steps after resume_step (they will be trained again); return how many.

    Without this a requeued run would log steps 5..k twice, once per attempt. Unparseable lines
    (a line cut by the kill) are dropped too.
    """
    if not path.is_file():
        return 0
    kept: list[str] = []
    dropped = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = parse_record(line)
        if rec is not None and rec[0] <= resume_step:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        write_atomic(path, "".join(f"{line}\n" for line in kept))
    return dropped


def wandb_env(spec: RunSpec) -> dict[str, str]:
    """Environment for W&B when it is a logger: one W&B run per hpc-grpo run across requeues,
    its files inside the run directory. Empty when W&B is not used."""
    if "wandb" not in spec.recipe.logging.logger:
        return {}
    group = spec.recipe.logging.group
    return {
        "WANDB_RUN_ID": runs.wandb_run_id(spec.path),
        "WANDB_RESUME": "allow",
        "WANDB_DIR": spec.run_dir,
        "WANDB_PROJECT": spec.recipe.logging.project,
        "WANDB_NAME": spec.recipe.logging.experiment or spec.run_name,
        **({"WANDB_RUN_GROUP": group} if group else {}),  # trl's report_to passes no group: wandb reads this
    }


# ------------------------------------------------------------------------------------- model & data
def prepare_model(spec: RunSpec) -> str:
    """The model folder; a missing `tiny*` folder is built on first use (tiny-gsm8k needs no Hub)."""
    path = Path(spec.recipe.model.path)
    if (path / "config.json").is_file():
        return str(path)
    if path.name.startswith("tiny"):
        from hpc_grpo.data.tiny_model import ensure_tiny_model

        log(f"building the tiny model in {path}")
        return str(ensure_tiny_model(path))
    if path.is_absolute() or path.exists():
        raise JobError(f"model.path {path} has no config.json: point it at a Hugging Face model folder")
    return str(path)  # a Hub id: transformers resolves it (needs network or a warm HF cache)


def load_train_dataset(spec: RunSpec) -> Any:
    """Train rows with `prompt` and `ground_truth` (trl passes columns to the reward by name).

    jsonl/json as written by `prepare_gsm8k` for trl; parquet in verl's layout also works: its
    reward_model.ground_truth becomes the ground_truth column.
    """
    return load_rows(Path(spec.recipe.data.train_list[0]), "data.train_files")  # plan refuses a list for trl


def load_val_dataset(spec: RunSpec) -> Any:
    """train.early_stop's validation set: the first early_stop.val_rows rows of data.val_files."""
    stop = spec.recipe.train.early_stop
    assert stop is not None
    ds = load_rows(Path(spec.recipe.data.val_list[0]), "data.val_files")
    return ds.select(range(min(stop.val_rows, len(ds))))


def load_rows(path: Path, key: str) -> Any:
    """A trl data file's rows, with the columns the reward needs; JobError naming `key` otherwise."""
    from datasets import load_dataset

    if not path.is_file():
        raise JobError(f"{key} {path} does not exist: prepare GSM8K first (hpc_grpo.data.gsm8k.prepare_gsm8k)")
    kind = "parquet" if path.suffix == ".parquet" else "json"
    ds = load_dataset(kind, data_files=str(path), split="train")
    if "ground_truth" not in ds.column_names and "reward_model" in ds.column_names:
        ds = ds.map(lambda row: {"ground_truth": row["reward_model"]["ground_truth"]})
    missing = [c for c in ("prompt", "ground_truth") if c not in ds.column_names]
    if missing:
        raise JobError(f"{path} has no column(s) {', '.join(missing)} (has {', '.join(ds.column_names)}): "
                       "use the trl/train.jsonl that prepare_gsm8k writes")
    return ds


def lengths_key(spec: RunSpec, model_path: str) -> dict[str, Any] | None:
    """What the cached prompt lengths depend on: the train file and the tokenizer's files.
    None (no caching) when the model is a Hub id without a local folder."""
    folder = Path(model_path)
    if not folder.is_dir():
        return None
    train = Path(spec.recipe.data.train_list[0])
    st = train.stat()
    digest = hashlib.sha256()
    for name in ck.TOKENIZER_FILES:
        f = folder / name
        if f.is_file():
            digest.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return {"train_file": str(train.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "tokenizer_sha256": digest.hexdigest()}


def prompt_lengths(prompts: list[Any], tokenizer: Any, cache: Path | None, key: dict[str, Any] | None) -> list[int]:
    """Token count of every prompt as the model sees it (chat template + generation prompt).

    Tokenizing GSM8K's 7.5k prompts costs seconds; the result is kept in the run directory so a
    requeued job does not pay again (bigger data sets: minutes).
    """
    if cache is not None and key is not None and cache.is_file():
        try:
            data = json.loads(cache.read_text(encoding="utf-8"))
            if data.get("key") == key and len(data.get("lengths", ())) == len(prompts):
                return [int(n) for n in data["lengths"]]
        except (OSError, ValueError, TypeError):
            pass  # a damaged cache is recomputed
    out: list[int] = []
    for i in range(0, len(prompts), 1000):
        chunk = prompts[i:i + 1000]
        if chunk and isinstance(chunk[0], str):
            ids = tokenizer(chunk)["input_ids"]
        else:
            ids = tokenizer.apply_chat_template(chunk, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        out.extend(len(x) for x in ids)
    if cache is not None and key is not None:
        write_atomic(cache, json.dumps({"key": key, "lengths": out}))
    return out


def filter_prompts(ds: Any, tokenizer: Any, spec: RunSpec, model_path: str) -> Any:
    """Enforce data.max_prompt_length (trl 1.16 has no such setting): drop overlong prompts like
    verl's filter_overlong_prompts, or stop when data.truncation is 'error'."""
    d = spec.recipe.data
    limit = d.max_prompt_length
    n_before = len(ds)
    lengths = prompt_lengths(list(ds["prompt"]), tokenizer, layout.prompt_lengths_file(spec.run_dir),
                             lengths_key(spec, model_path))
    keep = [i for i, n in enumerate(lengths) if n <= limit]
    too_long = n_before - len(keep)
    if too_long and d.filter_overlong_prompts:
        ds = ds.select(keep)
        log(f"dropped {too_long} of {n_before} prompts longer than data.max_prompt_length={limit}")
    elif too_long and d.truncation == "error":
        raise JobError(f"{too_long} of {n_before} prompts are longer than data.max_prompt_length={limit}: "
                       "raise it, or set data.filter_overlong_prompts=true")
    elif too_long:
        log(f"warning: {too_long} prompts exceed data.max_prompt_length={limit} and are kept whole")
    if not len(ds):
        raise JobError(f"no prompt fits data.max_prompt_length={limit}")
    return ds


def reward_function(spec: RunSpec) -> Any:
    """The recipe's reward for trl, built by its registry entry's factory."""
    return rewards.trl_reward(spec.recipe)


def build_grpo_config(kwargs: dict[str, Any]) -> Any:
    """GRPOConfig, with transformers < 5's spelling of activation checkpointing if needed."""
    import dataclasses

    from trl import GRPOConfig

    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    if "activation_checkpointing" in kwargs and "activation_checkpointing" not in names:
        kwargs = dict(kwargs)
        kwargs["gradient_checkpointing"] = kwargs.pop("activation_checkpointing")
    return GRPOConfig(**kwargs)


def write_row(path: Path, row: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def eval_row(step: int, logs: dict[str, Any]) -> dict[str, Any] | None:
    """A validation's line for metrics.jsonl (trl's eval_* keys, as trl logs them), or None for any other log."""
    found = {k: float(v) for k, v in logs.items() if k.startswith("eval_") and isinstance(v, (int, float))
             and not isinstance(v, bool) and math.isfinite(v)}
    return {"step": step, **found, "time": round(time.time(), 3)} if found else None


class Halving:
    """Successive halving in a sweep (runstate.sweeps: the manifest's rungs, eta, metric and mode): at a rung step
    this member goes on only if its metric is within the top 1/eta of what the other members logged there so far."""

    def __init__(self, folder: Path, manifest: sweeps.Manifest, member: sweeps.Member) -> None:
        self.folder, self.manifest, self.member = folder, manifest, member
        self.stopped: dict[str, Any] | None = None

    def check(self, step: int, row: dict[str, Any]) -> bool:
        m = self.manifest
        value = row.get(m.metric)
        if self.stopped is not None or step not in m.rungs or not isinstance(value, (int, float)):
            return False
        others = sweeps.rung_values(self.folder, m, step, self.member)
        stop, cutoff = halved(float(value), others, m.eta, m.mode)
        where = (f"{m.metric} {value:.4g} at rung step {step}, cutoff {cutoff:.4g} (top 1/{m.eta}, {m.mode}, of the "
                 f"{len(others)} other member(s) that reached it)" if cutoff is not None else
                 f"{m.metric} {value:.4g} at rung step {step}: the first member there")
        log(f"successive halving: {where}: {'stopping' if stop else 'going on'}")
        if stop:
            self.stopped = {"halving": True, "rung": step, "value": float(value), "cutoff": cutoff, "others": others,
                            "eta": m.eta, "metric": m.metric, "mode": m.mode,
                            "reason": f"stopped by the sweep's successive halving: {where}"}
        return stop


def halving_of(spec: RunSpec) -> Halving | None:
    """The member's successive halving when its run is a member of a sweep with rungs; else None."""
    found = sweeps.member_of(spec.path)
    if found is None or not found[1].rungs:
        return None
    return Halving(*found)


def metrics_callback(path: Path, max_steps: int, halving: Halving | None = None) -> Any:
    """A TrainerCallback that appends one JSON line per logged step (and one per validation: its eval_* keys at
    the step it validated), prints a short progress line, and with `halving` stops the member at a rung where it
    falls behind (the trainer then saves at this step and ends the loop)."""
    from transformers import TrainerCallback

    def halve(step: int, row: dict[str, Any], control: Any) -> None:
        if halving is not None and halving.check(step, row):
            control.should_save = True
            control.should_training_stop = True

    class MetricsCallback(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if state.is_world_process_zero and logs and (evals := eval_row(state.global_step, logs)) is not None:
                write_row(path, evals)
                log(f"validation at step {state.global_step}: " + ", ".join(
                    f"{k} {v:.4g}" for k, v in evals.items() if k.startswith("eval_reward")))
                halve(state.global_step, evals, control)
                return
            if not state.is_world_process_zero or not logs or not ("loss" in logs or "reward" in logs):
                return  # one writer; and the end-of-training summary has neither key
            row: dict[str, Any] = {"step": state.global_step}
            for src, dst in METRIC_KEYS.items():
                value = logs.get(src)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    row[dst] = float(value) if math.isfinite(value) else None
            row["time"] = round(time.time(), 3)
            write_row(path, row)
            halve(state.global_step, row, control)

            def fmt(key: str) -> str:
                value = row.get(key)
                return "nan" if value is None else f"{value:.4g}"

            total = f"/{max_steps}" if max_steps > 0 else ""
            log(f"step {state.global_step}{total} reward {fmt('reward')} loss {fmt('loss')} kl {fmt('kl')} "
                f"lr {fmt('lr')} ({fmt('step_time')} s)")

    return MetricsCallback()


def early_stop_callback(spec: RunSpec, plateau: Plateau) -> Any:
    """A TrainerCallback that feeds each validation to `plateau`; on a plateau the trainer saves at this step and
    stops (transformers saves after evaluating when control.should_save is set, then ends the loop)."""
    from transformers import TrainerCallback

    metric = plateau.rule.metric

    class EarlyStopCallback(TrainerCallback):
        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None,
                        **kw: Any) -> None:
            metrics = metrics or {}
            if metric not in metrics:
                raise JobError(f"train.early_stop.metric={metric} is not among the validation's metrics ("
                               f"{', '.join(sorted(metrics))}): set it to one of them")
            if plateau.update(state.global_step, float(metrics[metric])):
                log(plateau.reason(state.global_step) + ": saving and stopping")
                control.should_save = True
                control.should_training_stop = True

    return EarlyStopCallback()


def replayed_plateau(spec: RunSpec) -> Plateau | None:
    """train.early_stop's state at the job's start: the validations logged before it (metrics.jsonl, already trimmed
    to the resume step), so a requeue or resume goes on counting."""
    rule = spec.recipe.train.early_stop
    if rule is None:
        return None
    plateau = Plateau(rule)
    plateau.feed(read_raw(layout.metrics_file(spec.path)))
    if plateau.seen:
        log(f"early stopping: {len(plateau.seen)} earlier validation(s) replayed, best {plateau.best:.4g} at step "
            f"{plateau.best_step}, {plateau.since_best} since")
    return plateau


def health_callback(path: Path, watcher: health_watch.Watcher) -> Any:
    """A TrainerCallback after the metrics one: the health findings of the rows so far (job/health_watch); a
    finding `health.stop_on` names saves this step (the trainer saves after on_log) and stops training; a NaN
    stops without saving."""
    from transformers import TrainerCallback

    class HealthCallback(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> Any:
            if not state.is_world_process_zero or not logs or not ("loss" in logs or "reward" in logs):
                return control
            stop = watcher.check(file_rows(path))
            if stop is not None:
                # after a non-finite update the weights may be NaN: no save of this step, the newest one stays
                control.should_save = control.should_save or stop.kind != "nan"
                control.should_training_stop = True
            return control

    return HealthCallback()


# --------------------------------------------------------------------------------------------- main
def start_point(spec: RunSpec, spec_path: Path, t0: float) -> tuple[Checkpoint | None, dict[str, Any] | None]:
    """(the checkpoint to resume from, the finished result when there is nothing left to train), decided from
    disk before any heavy import, so a requeue of a finished run ends in a second. One path for both engines
    (hpc_grpo.job.prepare_resume): newer incomplete checkpoints are quarantined, the decision goes into
    history.jsonl; retention runs after it so it holds across requeues; metric lines of steps trained again go."""
    run_dir = Path(spec.run_dir)
    if spec_path.resolve().parent != run_dir.resolve():
        log(f"warning: {spec_path} is not inside the spec's run_dir {run_dir}; using run_dir")
    layout.checkpoints_dir(spec.path).mkdir(parents=True, exist_ok=True)
    prepared = prepare_resume.prepare_and_record(run_dir, ENGINE)
    for old, new, why in prepared.quarantined:
        log(f"moved incomplete {Path(old).name} ({why}) to {new}")
    resume: Checkpoint | None = prepared.checkpoint
    job_prune(run_dir, "job start", log, grace_s=0)
    resume_step = resume.step if resume else 0
    if resume:
        log(f"resuming from {resume.path} (step {resume.step})")
    else:
        log("no complete checkpoint: starting from step 0")
    target = target_steps(int(grpo_config_kwargs(spec)["max_steps"]), resume)
    if resume and target is not None and resume.step >= target:
        # transformers would train one extra step when resumed at the end (it checks max_steps only
        # after a step), so a requeue of a finished run must not call train() at all.
        log(f"already trained: {resume.path.name} is step {resume.step} of {target}")
        return resume, finish(spec, resume.step, target, resume, resume, t0, 0.0)
    dropped = trim_metrics(layout.metrics_file(run_dir), resume_step)
    if dropped:
        log(f"dropped {dropped} metric line(s) after step {resume_step} from {layout.METRICS_FILE} "
            "(they are trained again)")
    return resume, None


def train(spec: RunSpec, spec_path: Path, on_signal: save_signal.SaveOnSignal | None = None) -> dict[str, Any]:
    """Build everything from the spec, resume from the newest complete checkpoint, train, report.

    With `on_signal` (installed by main), a USR2 makes the trainer save at the next step end and stop; the
    result then has "stopped_on_signal" and no train_done.json is written (the run is not done)."""
    t0 = time.time()
    resume, done = start_point(spec, spec_path, t0)
    if done is not None:
        return done

    if rewards.get(spec.recipe.grpo.reward).runs_code:  # before any heavy import: a refusal costs a second
        from hpc_grpo.cluster import isolation

        try:
            log(isolation.job_line(spec.recipe.grpo.code.isolation))
        except isolation.IsolationRefused as exc:
            raise JobError(str(exc)) from None

    runs.drop_inherited_wandb_service(os.environ)
    os.environ.update(wandb_env(spec))  # before the trainer (and so W&B) starts

    import warnings

    # transformers 5 renamed gradient -> activation checkpointing and trl still calls the old
    # names internally: nothing a user can act on.
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*activation_checkpointing", category=FutureWarning)

    import torch

    use_cpu = not torch.cuda.is_available()
    if spec.recipe.rollout.name == "vllm" and use_cpu:
        raise JobError("rollout.name=vllm needs a GPU and none is visible: use rollout.name=hf")
    model_path = prepare_model(spec)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=spec.recipe.model.trust_remote_code)
    dataset = filter_prompts(load_train_dataset(spec), tokenizer, spec, model_path)
    entry = rewards.get(spec.recipe.grpo.reward)
    if entry.ground_truth_check is not None:
        try:
            load_object(entry.ground_truth_check)(dataset[0]["ground_truth"])
        except (ValueError, TypeError) as exc:
            raise JobError(f"grpo.reward={entry.name} but {spec.recipe.data.train_files} holds rows it cannot score "
                           f"({exc}): prepare it with `hpc-grpo data {entry.data_command}`") from None

    plateau = replayed_plateau(spec)
    halving = halving_of(spec)
    watcher = health_watch.Watcher(spec, say=log, alert=health_watch.alerter(spec),
                                   after_step=resume.step if resume else 0)
    trainer = build_trainer(spec, model_path, dataset, use_cpu, on_signal, watcher, plateau, halving)
    result = run_trainer(trainer, spec, resume)
    if watcher.stop is not None and trainer.state.global_step < trainer.state.max_steps:
        return stopped_by_health(Path(spec.run_dir), trainer.state.global_step, watcher)
    if halving is not None and halving.stopped is not None and trainer.state.global_step < trainer.state.max_steps:
        return halted(spec, trainer.state.global_step, halving.stopped)
    return trained(spec, trainer, result, resume, t0, on_signal, plateau)


def halted(spec: RunSpec, step: int, why: dict[str, Any]) -> dict[str, Any]:
    """A member the sweep stopped: saved at this step, not trained (no train_done.json: its eval job skips it, and
    `resume SWEEP` leaves it unless --force); the reason goes into the history for `sweep status`."""
    from hpc_grpo.cluster.job_env import job_identity

    job_id, executor = job_identity()
    runs.append_history(spec.path, job_id, "stopped", executor, note=str(why["reason"]), data={**why, "step": step})
    log(f"stopped at step {step}: {why['reason']}")
    return {"halted": True, "final_step": step}


def stopped_by_health(run_dir: Path, step: int, watcher: health_watch.Watcher) -> dict[str, Any]:
    """Training stopped on a health finding (health.stop_on) after saving this step: the reason in the history,
    no train_done.json (the run is not trained)."""
    saved = ck.newest_complete(ck.list_checkpoints(run_dir, ENGINE))
    what = ("no complete checkpoint: a resume starts from the beginning" if saved is None else
            f"checkpoint step {saved.step} saved" if saved.step == step else
            f"the newest checkpoint is step {saved.step}")
    watcher.record_stop(run_dir, what)
    log(f"stopped by health at step {step}: {what}")
    return {"stopped_by_health": True, "final_step": step}


def build_trainer(spec: RunSpec, model_path: str, dataset: Any, use_cpu: bool,
                  on_signal: save_signal.SaveOnSignal | None, watcher: health_watch.Watcher,
                  plateau: Plateau | None = None, halving: Halving | None = None) -> Any:
    """trl's GRPOTrainer for the spec, with our callbacks: one metrics line per step, its health (a save and a stop
    on a finding health.stop_on names), saves under the checkpoint lock, retention after each save, and (with
    on_signal) a save at the step end after a USR2."""
    from peft import LoraConfig
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    run_dir = Path(spec.run_dir)
    config = build_grpo_config(grpo_config_kwargs(spec, use_cpu=use_cpu))
    lora_kwargs = lora_config_kwargs(spec)
    peft_config = LoraConfig(**lora_kwargs) if lora_kwargs else None
    log(f"run {spec.run_name}: device {'cpu' if use_cpu else 'cuda'}, {len(dataset)} prompts, "
        f"max_steps {config.max_steps}, checkpoints in {layout.checkpoints_dir(spec.path)}")

    val = load_val_dataset(spec) if plateau is not None else None
    if val is not None and plateau is not None:
        log(f"early stopping on {plateau.rule.metric} ({plateau.rule.mode}, patience {plateau.rule.patience}): "
            f"validating {len(val)} prompts every {spec.recipe.train.test_freq} steps")
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=reward_function(spec),
        args=config,
        train_dataset=dataset,
        eval_dataset=val,
        peft_config=peft_config,
    )
    trainer.remove_callback(PrinterCallback)  # prints every raw log dict; ours prints one line per step
    trainer.add_callback(metrics_callback(layout.metrics_file(run_dir), config.max_steps, halving))
    trainer.add_callback(health_callback(layout.metrics_file(run_dir), watcher))
    lock_saves(trainer, run_dir)
    trainer.add_callback(prune_callback(run_dir))
    if on_signal is not None:
        trainer.add_callback(save_signal.callback(on_signal))
    if plateau is not None:
        trainer.add_callback(early_stop_callback(spec, plateau))
    return trainer


def run_trainer(trainer: Any, spec: RunSpec, resume: Checkpoint | None) -> Any:
    """trainer.train from the resume checkpoint; a full disk becomes a JobError that says what to free, after the
    reserve (hpc_grpo.job.disk) is released so the message reaches the log and the history."""
    run_dir = Path(spec.run_dir)
    log("trainer ready: training")
    try:
        return trainer.train(resume_from_checkpoint=str(resume.path) if resume else None)
    except Exception as exc:
        if not disk.is_disk_full(run_dir, exc):
            raise
        message = disk.explain(run_dir, spec.run_name, ENGINE)
        disk.report(run_dir, message)
        raise JobError(message) from exc


def trained(spec: RunSpec, trainer: Any, result: Any, resume: Checkpoint | None, t0: float,
            on_signal: save_signal.SaveOnSignal | None, plateau: Plateau | None = None) -> dict[str, Any]:
    """The result of a train() that returned: stopped by a USR2 before the last step, or done (train_done.json),
    also when it stopped early on a plateau (the reason in train_done.json and in the history)."""
    run_dir = Path(spec.run_dir)
    step = trainer.state.global_step
    if on_signal is not None and on_signal.requested and step < trainer.state.max_steps:
        return stopped_on_signal(run_dir, step, on_signal)
    runtime = float(result.metrics.get("train_runtime", 0.0))
    final = ck.newest_complete(ck.list_checkpoints(run_dir, ENGINE))
    early = plateau.as_dict(step) if plateau is not None and plateau.stop and step < trainer.state.max_steps else None
    if early is not None:
        from hpc_grpo.cluster.job_env import job_identity

        job_id, executor = job_identity()
        runs.append_history(run_dir, job_id, "stopped", executor, note=str(early["reason"]), data=early)
    return finish(spec, step, trainer.state.max_steps, final, resume, t0, runtime, early)


def stopped_on_signal(run_dir: Path, step: int, on_signal: save_signal.SaveOnSignal) -> dict[str, Any]:
    """The result of a training stopped by a USR2: its checkpoint must be complete on disk, and the marker
    tells the submitit handler (launch/submit) that the save is done and the job can be requeued."""
    saved = ck.newest_complete(ck.list_checkpoints(run_dir, ENGINE))
    if saved is None or saved.step != step:
        raise JobError(f"stopped on the signal at step {step}, but its checkpoint is not complete on disk (newest "
                       f"complete: {saved.path.name if saved else 'none'})")
    marker = on_signal.write_marker(run_dir, step, str(saved.path))
    log(f"saved {saved.path.name} on the signal {marker['saved_at'] - marker['signal_at']:.1f} s after it "
        "came: stopping for the requeue")
    return {"stopped_on_signal": True, "final_step": step, "last_checkpoint": str(saved.path)}


def lock_saves(trainer: Any, run_dir: Path) -> None:
    """Each save holds the run's checkpoint lock, so a prune (in this job or from a login node) never sees a
    half-written folder as anything but "being written". Wraps transformers' Trainer._save_checkpoint."""
    save = trainer._save_checkpoint

    def locked_save(*args: Any, **kwargs: Any) -> Any:
        with runs.checkpoint_lock(run_dir, timeout_s=86400):  # a save waits out any prune, never fails on it
            return save(*args, **kwargs)

    trainer._save_checkpoint = locked_save


def prune_callback(run_dir: Path) -> Any:
    """A TrainerCallback applying the retention policy after every save (hpc-grpo owns retention:
    save_total_limit is off, since trl's rotation, like verl's, knows nothing of milestones or leases)."""
    from transformers import TrainerCallback

    class PruneCallback(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.is_world_process_zero:
                job_prune(run_dir, f"after save of step {state.global_step}", log, grace_s=0)

    return PruneCallback()


def target_steps(max_steps: int, resume: Checkpoint | None) -> int | None:
    """The run's last step: max_steps, or (epoch-based runs) the max_steps trl recorded in the
    checkpoint's trainer_state.json; None when unknown (a fresh epoch-based run)."""
    if max_steps > 0:
        return max_steps
    return None if resume is None else ck.recorded_total_steps(resume)


def finish(spec: RunSpec, step: int, max_steps: int | None, final: Checkpoint | None,
           resume: Checkpoint | None, t0: float, runtime: float,
           early_stop: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write train_done.json: what later steps (prune, export, eval) start from."""
    done: dict[str, Any] = {
        "run_name": spec.run_name,
        "final_step": step,
        "max_steps": max_steps,
        "last_checkpoint": str(final.path) if final else None,
        "resumed_from": str(resume.path) if resume else None,
        "wall_time_s": round(time.time() - t0, 3),
        "train_runtime_s": round(runtime, 3),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if early_stop is not None:
        done["early_stop"] = early_stop
    job_prune(Path(spec.run_dir), "run end", log, grace_s=0)
    write_json_atomic(layout.done_file(spec.run_dir), done)
    log(f"done: step {step}, last checkpoint {done['last_checkpoint']}, {done['wall_time_s']} s")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_grpo.job.trl_job", description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, type=Path, help=f"RUN_DIR/{layout.SPEC_FILE} (the frozen run spec)")
    args = parser.parse_args(argv)
    # First of all: from here on a USR2 asks for a save instead of killing the process.
    on_signal = save_signal.SaveOnSignal(args.spec.resolve().parent)
    on_signal.install()
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.common.yamlio import SpecError

    try:
        spec = load_frozen(args.spec)
        if spec.recipe.engine != ENGINE:
            raise JobError(f"{args.spec} is a {spec.recipe.engine} run; this job trains {ENGINE} runs only")
        result = train(spec, args.spec, on_signal)
        # Python's shutdown puts the default action (death) back on signals it handled: a USR2 that came now
        # would kill a finished process. Ignored stays ignored.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    except (JobError, SpecError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    if result.get("stopped_by_health"):
        return health_watch.HEALTH_STOPPED
    return save_request.STOPPED_FOR_REQUEUE if result.get("stopped_on_signal") else 0


if __name__ == "__main__":
    sys.exit(main())
