"""Nothing the user typed is silently dropped, leaked, or answered with a traceback.

Each case is typed as a user types it: the real CLI in a subprocess (or in-process through cli.main), inside an
isolated HOME and working directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import tree

RECIPE = "qwen2.5-3b-gsm8k-lora"  # verl FSDP; its recipe sets checkpoint.keep_last: 3
CLUSTER = "a100-ib"
SECRET = "abc123secret"


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`hpc-grpo ARGS` as a user runs it, with wide output so messages are not folded."""
    base = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                                                             "HPC_GRPO_PATH")}
    return subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**base, "COLUMNS": "200", "HOME": str(cwd / "home"), "USER": "user",
                                            "WANDB_MODE": "offline", **(env or {})})


def holds(root: Path, needle: str) -> list[Path]:
    """Files under root whose bytes contain needle."""
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


# ---------------------------------------------------------------------------------- 1. secrets
SECRET_OVERRIDES = [
    f"+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY={SECRET}",  # the report's command line
    f"passthrough.+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN={SECRET}",
    f"trainer.HUGGING_FACE_HUB_TOKEN={SECRET}",
    f"cluster.env.WANDB_API_KEY={SECRET}",
    f"logging.wandb_api_key={SECRET}",  # a recipe key path, any case
    f"+ray_kwargs.ray_init.runtime_env.env_vars={{WANDB_API_KEY: {SECRET}}}",  # inside a mapping value
    f"cluster.env={{NCCL_DEBUG: WARN, HF_TOKEN: {SECRET}}}",
]


@pytest.mark.parametrize("override", SECRET_OVERRIDES)
@pytest.mark.parametrize("command", ["render", "plan", "submit"])
def test_a_secret_typed_as_an_override_is_refused_unshown_and_unwritten(override: str, command: str,
                                                                         tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    runs_root = tmp_path / "runs"
    extra = {"render": ["-o", str(tmp_path / "out")], "submit": ["--dry-run"], "plan": []}[command]
    before = tree(tmp_path)
    proc = cli(command, *extra, f"recipe={RECIPE}", f"cluster={CLUSTER}", f"cluster.runs_root={runs_root}",
               override, cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert SECRET not in text, text
    assert "Traceback" not in text, text
    name = next(n for n in ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") if n in override.upper())
    flat = " ".join(proc.stderr.split())
    assert f"{name} is a secret" in flat and f"export {name}=" in flat and "inherits" in flat, flat
    assert tree(tmp_path) == before, "a refused command wrote files"
    assert not holds(tmp_path, SECRET)


def test_a_secret_typed_on_resume_is_refused_unshown_and_unwritten(tmp_path: Path) -> None:
    from hpc_grpo.launch.render import render_all, write_files
    from hpc_grpo.config.resolve import resolve_spec

    (tmp_path / "home").mkdir()
    spec = resolve_spec(RECIPE, CLUSTER, [f"cluster.runs_root={tmp_path / 'runs'}"], run_name="r")
    write_files(spec.path, render_all(spec))
    before = tree(tmp_path)
    proc = cli("resume", str(spec.path), "--force", f"trainer.env.HF_TOKEN={SECRET}", cwd=tmp_path)
    assert proc.returncode == 2 and "HF_TOKEN is a secret" in proc.stderr, proc.stdout + proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    assert tree(tmp_path) == before and not holds(tmp_path, SECRET)


def test_a_secret_in_a_cluster_profile_is_refused_without_echoing_it(tmp_path: Path) -> None:
    """The profile's refusal used to print the whole env mapping back (`got {'WANDB_API_KEY': '...'}`)."""
    (tmp_path / "home").mkdir()
    (tmp_path / "lib" / "clusters").mkdir(parents=True)
    (tmp_path / "lib" / "clusters" / "leaky.yaml").write_text(
        f"name: leaky\nscheduler: slurm\ngpus_per_node: 4\nenv:\n  NCCL_DEBUG: WARN\n  WANDB_API_KEY: {SECRET}\n")
    proc = cli("plan", f"recipe={RECIPE}", "cluster=leaky", cwd=tmp_path, env={"HPC_GRPO_PATH": str(tmp_path / "lib")})
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "WANDB_API_KEY is a secret" in " ".join(text.split()), text
    assert SECRET not in text and "leaky.yaml" in text, text


def test_a_secret_in_a_recipe_passthrough_is_refused_without_echoing_it(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "lib" / "recipes").mkdir(parents=True)
    (tmp_path / "lib" / "recipes" / "leaky.yaml").write_text(
        f"extends: {RECIPE}\npassthrough:\n  +ray_kwargs.ray_init.runtime_env.env_vars:\n    HF_TOKEN: {SECRET}\n")
    proc = cli("plan", "recipe=leaky", f"cluster={CLUSTER}", cwd=tmp_path, env={"HPC_GRPO_PATH": str(tmp_path / "lib")})
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "HF_TOKEN is a secret" in " ".join(text.split()), text
    assert SECRET not in text, text


# ---------------------------------------------------------------------------------- 2. aliases
def plan_json(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    (tmp_path / "home").mkdir(exist_ok=True)
    # A runs root this machine sees: the retention finding is the disk check's, skipped for the cluster's own
    # /scratch (not here).
    proc = cli("plan", "--json", "--no-schema", *args, f"cluster.runs_root={tmp_path / 'runs'}", cwd=tmp_path, env=env)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def retention(plan: dict) -> str:
    return next(f["message"] for f in plan["findings"] if f["key"] == "checkpoint.keep_last")


def test_the_new_key_name_on_the_command_line_overrides_the_recipe(tmp_path: Path) -> None:
    plan = plan_json(tmp_path, f"recipe={RECIPE}", f"cluster={CLUSTER}", "checkpoint.keep_last=1")
    assert "retention keeps 1 newest" in retention(plan), retention(plan)


def test_a_retired_key_name_is_refused_naming_the_new_one(tmp_path: Path) -> None:
    """checkpoint.keep is keep_last's old name: refused on the command line and in a recipe, never ignored."""
    (tmp_path / "home").mkdir()
    proc = cli("plan", f"recipe={RECIPE}", f"cluster={CLUSTER}", "checkpoint.keep=1", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("checkpoint.keep: unknown key (command line); did you mean 'checkpoint.keep_last', newest complete "
            "checkpoints to keep?") in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stderr
    (tmp_path / "lib" / "recipes").mkdir(parents=True)
    (tmp_path / "lib" / "recipes" / "old.yaml").write_text(f"extends: {RECIPE}\ncheckpoint:\n  keep: 1\n")
    proc = cli("plan", "recipe=old", f"cluster={CLUSTER}", cwd=tmp_path, env={"HPC_GRPO_PATH": str(tmp_path / "lib")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "old.yaml:3" in proc.stderr and "did you mean 'checkpoint.keep_last'," in proc.stderr, proc.stderr


def test_a_frozen_spec_with_a_retired_key_is_refused_naming_the_new_one(tmp_path: Path) -> None:
    """A run directory whose spec.yaml says checkpoint.keep: loading it names the line and the key to write."""
    from hpc_grpo.common.yamlio import SpecError
    from hpc_grpo.config.resolve import load_frozen, resolve_spec
    from hpc_grpo.launch.render import frozen_spec_text

    text = frozen_spec_text(resolve_spec("tiny-gsm8k", "local", ["checkpoint.keep_last=5"], run_name="old", now=0.0))
    assert "    keep_last: 5\n" in text
    frozen = tmp_path / "spec.yaml"
    frozen.write_text(text.replace("    keep_last: 5\n", "    keep: 5\n"))
    with pytest.raises(SpecError) as err:
        load_frozen(frozen)
    line = text.splitlines().index("    keep_last: 5") + 1
    assert str(err.value).startswith(f"recipe.checkpoint.keep: unknown key ({frozen}:{line}); "
                                     "did you mean 'recipe.checkpoint.keep_last', newest complete checkpoints to "
                                     "keep?"), err.value


# ------------------------------------------------------------------------------- 4. unreadable data
SETPRIV = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture()
def open_dir():
    """A folder any user may enter (pytest's tmp_path is root's 0700 tree), removed afterwards."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="hpc-grpo-unreadable-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_someone_who_cannot_read(cmd: list[str]) -> list[str]:
    """root reads a 0000 file anyway: run as nobody (setpriv) then, so the read really fails."""
    if os.geteuid() != 0:
        return cmd
    if subprocess.run(["sh", "-c", "command -v setpriv"], capture_output=True).returncode:
        pytest.skip("running as root without setpriv: a chmod 000 file stays readable")
    return [*SETPRIV, *cmd]


def write_data(folder: Path, suffix: str) -> Path:
    path = folder / f"train{suffix}"
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"prompt": ["q"], "reward_model": ["a"], "data_source": ["gsm8k"]}), path)
    else:
        path.write_text('{"prompt": "q", "answer": "a"}\n')
    path.chmod(0o000)
    return path


@pytest.mark.parametrize("command", ["plan", "submit"])
@pytest.mark.parametrize(("recipe", "cluster", "suffix"), [("tiny-gsm8k", "local", ".jsonl"),
                                                     (RECIPE, CLUSTER, ".parquet")])
def test_an_unreadable_data_file_is_a_finding_not_a_traceback(recipe: str, cluster: str, suffix: str, command: str,
                                                              open_dir: Path) -> None:
    home = open_dir / "home"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    data = write_data(open_dir, suffix)
    argv = [sys.executable, "-m", "hpc_grpo.cli.app", command, *(["--dry-run"] if command == "submit" else []),
            "--no-schema", f"recipe={recipe}", f"cluster={cluster}", f"data.train_files={data}", f"data.val_files={data}",
            f"cluster.runs_root={home}/runs"]
    env = {**os.environ, "COLUMNS": "300", "HOME": str(home), "USER": "nobody", "WANDB_MODE": "offline",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("HPC_GRPO_PATH", None)
    proc = subprocess.run(as_someone_who_cannot_read(argv), cwd=open_dir, capture_output=True, text=True, timeout=120,
                          env=env)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    assert proc.returncode == 1 if command == "submit" else proc.returncode in (0, 1), text
    flat = " ".join(text.split())
    assert f"data.train_files: {data} cannot be read here (Permission denied)" in flat, flat
    assert "chmod a+r" in flat, flat


# ---------------------------------------------------------------------------------- 5. file modes
@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_data_files_follow_the_umask(umask: int, mode: int, tmp_path: Path) -> None:
    """`hpc-grpo data gsm8k` wrote 0600 files (mkstemp's mode survived the atomic rename): unreadable to a group
    sharing the data, and to the job when it runs as another user of the group."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    row = json.dumps({"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"})
    for split in ("train", "test"):
        (src / f"{split}.jsonl").write_text(f"{row}\n{row}\n")
    (tmp_path / "home").mkdir()
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "data", "gsm8k", "--source", str(src), "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.umask(umask),
                          env={**os.environ, "HOME": str(tmp_path / "home")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) >= 5, files  # verl and trl train/test, source.json
    assert {str(p.relative_to(out)): oct(p.stat().st_mode & 0o777) for p in files} == \
        {str(p.relative_to(out)): oct(mode) for p in files}
    assert not [p for p in out.rglob(".*.tmp")], "a temp file was left behind"


def test_every_atomic_write_follows_the_umask(tmp_path: Path) -> None:
    """The one helper behind data files, run-dir state (train_done.json, verl's tracker) and markers."""
    from hpc_grpo.common.atomic import write_text_atomic

    old = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "state.json", "{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "state.json").stat().st_mode & 0o777 == 0o640


# ---------------------------------------------------------------------------- 6. no developer paths
def test_no_message_points_at_a_folder_users_do_not_have() -> None:
    """`../shared` is the developers' checkout neighbour; users get GSM8K through `hpc-grpo data gsm8k`."""
    package = Path(__file__).resolve().parents[2] / "hpc_grpo"
    hits = [str(p.relative_to(package)) for p in package.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and b"../shared" in p.read_bytes()]
    assert not hits, hits


def test_missing_eval_files_name_the_data_command(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "q", "answer": "a"}\n')
    plan = plan_json(tmp_path, "recipe=tiny-gsm8k", "cluster=local", f"data.train_files={data}", f"data.val_files={data}")
    found = [f for f in plan["findings"] if f["key"] == "eval.test_file"]
    assert found and "hpc-grpo data gsm8k" in found[0]["message"] and "../shared" not in json.dumps(found), found
    proc = cli("eval", "--model", str(tmp_path / "model"), cwd=tmp_path)
    assert proc.returncode == 2 and "hpc-grpo data gsm8k" in proc.stderr and "../shared" not in proc.stderr, proc.stderr


# ------------------------------------------------------------------------ 7. resume --dry-run, run folders
def fake_slurm(folder: Path) -> tuple[dict[str, str], Path]:
    """PATH with Slurm's tools recording each call and failing: the record proves what was (not) queued."""
    bin_dir, calls = folder / "fake-bin", folder / "slurm-calls"
    bin_dir.mkdir()
    for tool in ("sbatch", "sinfo", "squeue", "sacct", "scontrol", "srun"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit 1\n')
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


@pytest.fixture()
def local_run(tmp_path: Path) -> Path:
    """A trl run on cluster=local that every submit check passes, with complete checkpoints at steps 2 and 4."""
    from hpc_grpo.launch.render import render_all, write_files
    from hpc_grpo.config.resolve import resolve_spec
    from tests import ckpt_trees as trees

    (tmp_path / "home").mkdir()
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "q", "ground_truth": "2"}\n')
    spec = resolve_spec("tiny-gsm8k", "local", overrides=[f"cluster.runs_root={tmp_path / 'runs'}", "eval.enabled=false",
                                                          f"data.train_files={data}", f"data.val_files={data}"],
                        run_name="r")
    write_files(spec.path, render_all(spec))
    for step in (2, 4):
        trees.trl_checkpoint(spec.path, step)
    return spec.path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_resume_dry_run_says_what_it_would_do_and_does_nothing(local_run: Path, tmp_path: Path) -> None:
    env, calls = fake_slurm(tmp_path)
    before = snapshot(tmp_path / "runs")
    proc = cli("resume", str(local_run), "resources.time=00:30:00", "--dry-run", cwd=tmp_path, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    flat = " ".join(proc.stdout.split())
    for part in (f"resumes from {local_run / 'checkpoints'}", "(step 4)", "Overrides: resources.time=00:30:00",
                 "Would run scripts/launch.sh through submitit LocalExecutor", "spec.yaml"):
        assert part in flat, (part, flat)
    assert "Job:" not in text and "Traceback" not in text
    assert snapshot(tmp_path / "runs") == before, "a dry run wrote or changed a file"
    assert not calls.exists(), calls.read_text()


@pytest.mark.parametrize("how", ["absolute", "relative", "name"])
@pytest.mark.parametrize("command", [["resume", "--dry-run"], ["status"], ["prune-ckpts", "--dry-run"], ["logs"]])
def test_every_run_command_takes_the_runs_name_or_its_folder(command: list[str], how: str, local_run: Path,
                                                             tmp_path: Path) -> None:
    env, _ = fake_slurm(tmp_path)
    arg = {"absolute": str(local_run), "relative": os.path.relpath(local_run, tmp_path), "name": local_run.name}[how]
    # by name: the run is found under the runs root of a profile in HPC_GRPO_PATH
    (tmp_path / "lib" / "clusters").mkdir(parents=True)
    (tmp_path / "lib" / "clusters" / "mine.yaml").write_text(f"name: mine\nscheduler: local\nruns_root: {local_run.parent}\n")
    proc = cli(command[0], arg, *command[1:], cwd=tmp_path, env={**env, "HPC_GRPO_PATH": str(tmp_path / "lib")})
    text = proc.stdout + proc.stderr
    assert "no run named" not in text and "Traceback" not in text, text
    if command[0] != "logs":  # logs of a run with no job yet: exit 2 saying so
        assert proc.returncode == 0, text
    else:
        assert "has no job yet" in text, text


@pytest.mark.parametrize("command", ["resume", "status", "prune-ckpts", "eval-code", "report"])
def test_a_folder_that_is_not_a_run_is_said_to_be_one(command: str, tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "not-a-run").mkdir()
    for arg, why in ((str(tmp_path / "not-a-run"), "has no spec.yaml"), (str(tmp_path / "gone"), "does not exist")):
        proc = cli(command, arg, cwd=tmp_path)
        text = " ".join((proc.stdout + proc.stderr).split())
        assert proc.returncode == 2 and why in text and "no run named" not in text, text
