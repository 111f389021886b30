"""Container profiles: the mount syntax, what render mounts, and plan's check that every path the job reads is
mounted at its own path (hpc_grpo.config.mounts, hpc_grpo.planning.container). Real files in a temp dir; no Slurm."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path, PurePosixPath

import pytest

from hpc_grpo.common.findings import Finding, Severity
from hpc_grpo.config.mounts import Mount, job_mounts, parse_mount
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.launch.render import render_sbatch
from hpc_grpo.planning.container import check_container, mount_for

P = PurePosixPath


@pytest.mark.parametrize(("entry", "mount"), [
    ("/data", Mount(P("/data"), P("/data"))),
    ("/data:/in", Mount(P("/data"), P("/in"))),
    ("/data:/data:ro", Mount(P("/data"), P("/data"), read_only=True)),
    ("/data/:/in:rw", Mount(P("/data"), P("/in"))),
])
def test_mount_syntax(entry: str, mount: Mount) -> None:
    assert parse_mount(entry) == mount


def test_mount_expands_home_and_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.setenv("SCRATCH", "/scratch/u")
    assert parse_mount("~/data:$SCRATCH/data:ro").text() == "/home/u/data:/scratch/u/data:ro"


@pytest.mark.parametrize(("entry", "words"), [
    ("data", "not an absolute path"),
    ("/a,/b", "separates mounts with ','"),
    ("/a:/b:ro:x", "':' as its separator"),
    ("/a:/b:noexec", "unknown mount flag 'noexec'"),
    ("$HPC_GRPO_UNSET_VAR/x", "not set"),
    ("", "is not a mount"),
])
def test_bad_mounts_are_refused_with_the_rule(entry: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        parse_mount(entry)


def test_parents_are_mounted_before_what_lies_inside_them() -> None:
    mounts = job_mounts([Path("/lustre")], ["/lustre/proj/data:/lustre/proj/data:ro", "/lustre/proj:/lustre/proj:ro"],
                        "/lustre/proj/runs/r1")
    assert [m.text() for m in mounts] == ["/lustre:/lustre", "/lustre/proj:/lustre/proj:ro",
                                          "/lustre/proj/data:/lustre/proj/data:ro",
                                          "/lustre/proj/runs/r1:/lustre/proj/runs/r1"]


def test_a_path_counts_only_where_the_job_finds_the_same_file() -> None:
    mounts = job_mounts([], ["/home/u/data:/data", "/lustre", "/other:/lustre/shadowed"], "/lustre/runs/r")
    assert mount_for(Path("/home/u/data/train.jsonl"), mounts) is None  # at /data inside, not at its own path
    assert mount_for(Path("/lustre/x/train.jsonl"), mounts) == Mount(P("/lustre"), P("/lustre"))
    assert mount_for(Path("/lustre/shadowed/train.jsonl"), mounts) is None  # another file is there inside
    assert mount_for(Path("/lustre/runs/r/checkpoints"), mounts) == Mount(P("/lustre/runs/r"), P("/lustre/runs/r"))


# ------------------------------------------------------------------------------------------------ plan's check
@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model folder and data files under tmp_path; HOME inside it."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    for name in ("train.jsonl", "test.jsonl"):
        (tmp_path / "data" / name).write_text('{"prompt": "1+1?", "answer": "2"}\n')
    return tmp_path


def spec_of(root: Path, *overrides: str) -> RunSpec:
    return resolve_spec("tiny-gsm8k", "h100-roce", [
        f"cluster.runs_root={root / 'runs'}", "cluster.shared_paths=[]", "eval.enabled=false",
        f"model.path={root / 'models' / 'm'}", f"data.train_files={root / 'data' / 'train.jsonl'}",
        f"data.val_files={root / 'data' / 'test.jsonl'}", *overrides], run_name="r")


def errors(found: list[Finding]) -> dict[str, Finding]:
    return {f.key: f for f in found if f.severity is Severity.ERROR}


def test_every_path_mounted_passes(files: Path) -> None:
    spec = spec_of(files, f"cluster.setup.mounts=[{files / 'models'}:{files / 'models'}:ro,{files / 'data'}]")
    assert errors(check_container(spec)) == {}


def test_a_missing_data_mount_names_the_path_the_key_and_the_fix(files: Path) -> None:
    spec = spec_of(files, f"cluster.setup.mounts=[{files / 'models'}]")
    found = errors(check_container(spec))
    assert set(found) == {"data.train_files", "data.val_files"}
    train = found["data.train_files"]
    assert f"{files / 'data' / 'train.jsonl'} is not inside the container" in train.message
    assert str(files / "models") in train.message and str(files / "runs" / "r") in train.message  # what it sees
    assert train.fix == f"add a mount to the profile: cluster.setup.mounts: [{files / 'data'}] (or a folder above it)"


def test_a_symlink_out_of_the_mounts_is_followed(files: Path) -> None:
    (files / "elsewhere").mkdir()
    (files / "data" / "train.jsonl").rename(files / "elsewhere" / "train.jsonl")
    (files / "data" / "train.jsonl").symlink_to(files / "elsewhere" / "train.jsonl")
    spec = spec_of(files, f"cluster.setup.mounts=[{files / 'models'},{files / 'data'}]")
    found = errors(check_container(spec))
    assert set(found) == {"data.train_files"}
    assert (f"{files / 'elsewhere' / 'train.jsonl'} ({files / 'data' / 'train.jsonl'} leads there through a symlink)"
            in found["data.train_files"].message)


def test_a_mount_at_another_path_is_not_enough(files: Path) -> None:
    spec = spec_of(files, f"cluster.setup.mounts=[{files / 'models'},{files / 'data'}:/data]")
    train = errors(check_container(spec))["data.train_files"]
    assert "is mounted at /data inside the container" in train.message
    assert train.fix == f"mount it at its own path: cluster.setup.mounts: [{files / 'data'}]"


def test_a_hub_model_needs_the_hugging_face_cache(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(files / "hf"))
    mounts = f"cluster.setup.mounts=[{files / 'data'}]"
    found = errors(check_container(spec_of(files, "model.path=Qwen/Qwen2.5-0.5B-Instruct", mounts)))
    assert str(files / "hf" / "hub") in found["model.path"].message
    ok = f"cluster.setup.mounts=[{files / 'data'},{files / 'hf'}]"
    assert errors(check_container(spec_of(files, "model.path=Qwen/Qwen2.5-0.5B-Instruct", ok))) == {}


def test_the_jobs_venv_and_checkout_must_be_mounted(files: Path) -> None:
    """setup.python = this interpreter: its venv and the hpc_grpo it imports are host paths the job reads."""
    mounts = f"cluster.setup.mounts=[{files / 'models'},{files / 'data'}]"
    found = check_container(spec_of(files, mounts, f"cluster.setup.python={sys.executable}"))
    python = [f for f in found if f.key == "cluster.setup.python" and f.severity is Severity.ERROR]
    venv = Path(sys.executable).parent.parent
    assert any(str(venv) in f.message for f in python), found
    import hpc_grpo

    assert any(str(Path(hpc_grpo.__file__).resolve().parent) in f.message for f in python), found


def test_chained_mode_is_refused_in_a_container(files: Path) -> None:
    mounts = f"cluster.setup.mounts=[{files / 'models'},{files / 'data'}]"
    found = errors(check_container(spec_of(files, mounts, "cluster.restart=chain")))
    assert set(found) == {"cluster.restart"}
    assert "no Slurm client" in found["cluster.restart"].message and "restart=requeue" in found["cluster.restart"].fix


def test_no_container_no_container_findings(files: Path) -> None:
    assert check_container(spec_of(files, "cluster.setup.container=null")) == []


def test_the_srun_line_mounts_every_path_in_one_quoted_word(files: Path) -> None:
    odd = files / "data with space ; and 'quote'"
    odd.mkdir()
    spec = spec_of(files, "cluster.setup.mounts=" + json.dumps([str(files / 'models'), f"{odd}:{odd}:ro"]))
    srun = next(line for line in render_sbatch(spec).splitlines() if line.startswith("srun "))
    words = shlex.split(srun)
    assert f"--container-mounts={files / 'models'}:{files / 'models'},{odd}:{odd}:ro,{files / 'runs' / 'r'}:" \
           f"{files / 'runs' / 'r'}" in words
    assert "--kill-on-bad-exit=1" in words and "--no-container-mount-home" in words
