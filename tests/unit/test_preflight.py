"""Preflight checks one by one (no Slurm needed here: tests/slurm/test_preflight_slurm.py runs the Slurm part for real).

Files are real files in tmp_path: a parquet written by pyarrow, jsonl lines, model folders with or without their
tokenizer files, a fake Hugging Face cache laid out as huggingface_hub lays it out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpc_grpo.cluster import clusterpick
from hpc_grpo.planning import preflight
from hpc_grpo.cluster import slurm, slurm_output
from hpc_grpo.common.findings import Severity, error, warning
from hpc_grpo.planning.plan import run_plan
from hpc_grpo.config.resolve import resolve_spec


def write_jsonl(path: Path, row: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    return path


CONFIG = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000, "tie_word_embeddings": True}


def model_dir(root: Path, *files: str) -> Path:
    """A folder with these files; only their presence is checked (config.json is a small real config)."""
    root.mkdir(parents=True, exist_ok=True)
    for f in files:
        (root / f).write_text(json.dumps(CONFIG) if f == "config.json" else "{}")
    return root


def tiny_spec(tmp: Path, *overrides: str, cluster: str = "local"):
    train = write_jsonl(tmp / "d" / "train.jsonl", {"prompt": "q", "ground_truth": "1"})
    val = write_jsonl(tmp / "d" / "val.jsonl", {"prompt": "q", "ground_truth": "1"})
    model = model_dir(tmp / "m", "config.json", "tokenizer.json")
    return resolve_spec("tiny-gsm8k", cluster, [f"data.train_files={train}", f"data.val_files={val}",
                                                f"model.path={model}", f"cluster.runs_root={tmp / 'runs'}",
                                                *overrides], run_name="t")


def keys(findings, severity=Severity.ERROR) -> list[str]:
    return [f.key for f in findings if f.severity is severity]


make = error


# ----------------------------------------------------------------------------------------------------- model
def test_complete_model_folder_passes(isolated) -> None:
    assert preflight.check_model(tiny_spec(isolated), make) == []


@pytest.mark.parametrize("files,missing", [
    (("config.json",), "tokenizer files"),
    (("tokenizer.json",), "config.json"),
    (("config.json", "vocab.json"), "tokenizer files"),  # BPE needs its merges too
])
def test_model_folder_missing_files_is_named(isolated, files, missing) -> None:
    folder = model_dir(isolated / "half", *files)
    spec = tiny_spec(isolated, f"model.path={folder}")
    (f,) = preflight.check_model(spec, make)
    assert f.key == "model.path" and missing in f.message and f.fix


def test_bpe_vocab_and_merges_count_as_a_tokenizer(isolated) -> None:
    folder = model_dir(isolated / "bpe", "config.json", "vocab.json", "merges.txt")
    assert preflight.check_model(tiny_spec(isolated, f"model.path={folder}"), make) == []


def test_missing_model_folder_is_an_error_but_tiny_is_built_later(isolated) -> None:
    (f,) = preflight.check_model(tiny_spec(isolated, f"model.path={isolated / 'nothing'}"), make)
    assert f.severity is Severity.ERROR and "does not exist" in f.message
    (f,) = preflight.check_model(tiny_spec(isolated, f"model.path={isolated / 'tiny-x'}"), make)
    assert f.severity is Severity.INFO


def test_hub_id_must_be_cached_when_nodes_are_offline(isolated, monkeypatch) -> None:
    cache = isolated / "hf"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    spec = tiny_spec(isolated, "model.path=Org/Model-1B", "cluster.offline=true")
    (f,) = preflight.check_model(spec, make)
    assert "offline" in f.message and "huggingface-cli download Org/Model-1B" in f.fix
    snap = cache / "models--Org--Model-1B" / "snapshots" / "abc123"
    model_dir(snap, "config.json")
    assert preflight.check_model(spec, make) == []
    online = tiny_spec(isolated, "model.path=Other/Model", "cluster.offline=false")
    assert preflight.check_model(online, make) == []  # online nodes download it themselves


# ------------------------------------------------------------------------------------------------------ data
def test_jsonl_columns_are_read_from_the_first_line(isolated) -> None:
    bad = write_jsonl(isolated / "bad.jsonl", {"question": "q", "answer": "a"})
    spec = tiny_spec(isolated, f"data.train_files={bad}")
    (f,) = preflight.check_data(spec, make)
    assert f.key == "data.train_files" and "prompt" in f.message and "question, answer" in f.message


def test_missing_data_file(isolated) -> None:
    spec = tiny_spec(isolated, f"data.val_files={isolated / 'gsm8k' / 'none.jsonl'}")
    (f,) = preflight.check_data(spec, make)
    assert f.key == "data.val_files" and "does not exist" in f.message and "hpc-grpo data gsm8k" in f.fix
    spec = tiny_spec(isolated, f"data.val_files={isolated / 'code' / 'none.jsonl'}")
    (f,) = preflight.check_data(spec, make)
    assert "hpc-grpo data --help" in f.fix


def test_parquet_columns_come_from_the_footer(isolated) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    good = isolated / "train.parquet"
    pq.write_table(pa.table({"prompt": ["q"], "data_source": ["gsm8k"], "reward_model": [{"ground_truth": "1"}]}), good)
    bad = isolated / "bad.parquet"
    pq.write_table(pa.table({"prompt": ["q"]}), bad)
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", [f"data.train_files={good}", f"data.val_files={bad}"],
                        run_name="t")
    (f,) = preflight.check_data(spec, make)
    assert f.key == "data.val_files" and "data_source" in f.message and "reward_model" in f.message
    broken = isolated / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", [f"data.train_files={good}", f"data.val_files={broken}"],
                        run_name="t")
    (f,) = preflight.check_data(spec, make)
    assert "not a readable parquet" in f.message


# ------------------------------------------------------------------------------------------------- runs root
def test_runs_root_creatable_and_roomy(isolated) -> None:
    spec = tiny_spec(isolated, f"cluster.runs_root={isolated / 'new' / 'runs'}")
    found = preflight.check_runs_root(spec, None, make)
    assert keys(found) == []


def test_runs_root_not_writable(isolated) -> None:
    ro = isolated / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        import os

        if os.access(ro, os.W_OK):
            pytest.skip("running as root: every folder is writable, so this case cannot be made here")
        found = preflight.check_runs_root(tiny_spec(isolated, f"cluster.runs_root={ro / 'runs'}"), None, make)
        assert keys(found) == ["cluster.runs_root"]
    finally:
        ro.chmod(0o700)


def test_runs_root_under_a_file_is_refused(isolated) -> None:
    (isolated / "afile").write_text("x")
    found = preflight.check_runs_root(tiny_spec(isolated, f"cluster.runs_root={isolated / 'afile' / 'runs'}"), None,
                                      make)
    assert keys(found) == ["cluster.runs_root"] and "not a folder" in found[0].message


def test_no_room_for_the_kept_checkpoints(isolated) -> None:
    spec = tiny_spec(isolated, "checkpoint.disk_gb=1e9")
    found = preflight.check_runs_root(spec, None, make)
    assert keys(found) == ["checkpoint.keep_last"] and "~1000000000.0 GiB" in found[0].message


def test_the_disk_finding_names_the_filesystem_it_measured(isolated) -> None:
    spec = tiny_spec(isolated, f"cluster.runs_root={isolated / 'runs'}", "checkpoint.disk_gb=1")
    (f,) = [f for f in preflight.check_runs_root(spec, None, make) if f.key == "checkpoint.keep_last"]
    mount = preflight.mount_of(isolated)
    assert mount is not None, "this machine's mount table is unreadable"
    assert f"{isolated} (filesystem {mount[0]}, {mount[1]}) has" in f.message


def test_a_cluster_runs_root_this_machine_cannot_see_is_not_checked_here(isolated) -> None:
    """A profile's runs root on the cluster's own filesystem (no folder of it exists here) is not measured against
    this machine's `/`: one finding says so; a multi-node run's shared-folder rule still applies."""
    root = f"/hpc-grpo-no-such-fs-{os.getpid()}/runs"
    spec = resolve_spec("qwen2.5-7b-codegen", "a100-ib", [f"cluster.runs_root={root}"], run_name="t")
    (f,) = preflight.check_runs_root(spec, None, make)
    assert f.severity is Severity.INFO and f.key == "cluster.runs_root" and "not checked here" in f.message
    two = resolve_spec("ray-probe", "a100-ib", ["resources.nodes=2", f"cluster.runs_root={root}",
                                                "cluster.shared_paths=[/elsewhere]"], run_name="t")
    assert keys(preflight.check_runs_root(two, None, make)) == ["cluster.runs_root"]
    local = tiny_spec(isolated, f"cluster.runs_root={root}")  # cluster=local: this machine's `/` is where it goes
    assert "not checked here" not in " ".join(f.message for f in preflight.check_runs_root(local, None, warning))


def test_sizing_uses_the_shape_with_kept_plus_one(isolated) -> None:
    from hpc_grpo.config.models import resolve_shape

    spec = resolve_spec("qwen2.5-7b-codegen", "a100-ib", ["checkpoint.keep_last=2", f"cluster.runs_root={isolated}"],
                        run_name="t")
    shape = resolve_shape(spec.recipe.model.path)
    from hpc_grpo.planning.disk import checkpoint_gib

    one = checkpoint_gib(spec, shape)
    assert one and one > 50  # full fine-tuning of 7.6B parameters: weights + Adam
    (f,) = [f for f in preflight.check_runs_root(spec, shape, make) if f.key == "checkpoint.keep_last"]
    assert f"~{one * 3:.1f} GiB" in f.message


def test_multi_node_runs_root_must_be_shared(isolated) -> None:
    root = isolated / "runs"
    two = resolve_spec("ray-probe", "a100-ib", ["resources.nodes=2", f"cluster.runs_root={root}",
                                                f"cluster.shared_paths=[{isolated / 'elsewhere'}]"], run_name="t")
    found = preflight.check_runs_root(two, None, make)
    assert keys(found) == ["cluster.runs_root"] and "verl #625" in found[0].message
    assert "node-local /tmp" in found[0].message  # pytest's tmp_path is under /tmp
    ok = resolve_spec("ray-probe", "a100-ib", ["resources.nodes=2", f"cluster.runs_root={root}",
                                               f"cluster.shared_paths=[{isolated}]"], run_name="t")
    assert keys(preflight.check_runs_root(ok, None, make)) == []
    one = resolve_spec("ray-probe", "a100-ib", ["resources.nodes=1", f"cluster.runs_root={root}",
                                                f"cluster.shared_paths=[{isolated / 'elsewhere'}]"], run_name="t")
    assert keys(preflight.check_runs_root(one, None, make)) == []


def test_node_local_prefixes() -> None:
    assert preflight.node_local(Path("/tmp/x/runs")) == "/tmp"
    assert preflight.node_local(Path("/dev/shm/runs")) == "/dev/shm"
    assert preflight.node_local(Path("/scratch/user/runs")) is None
    assert preflight.node_local(Path("/tmpfoo/runs")) is None


# -------------------------------------------------------------------------------------------- plan vs submit
def test_plan_warns_and_submit_errors(isolated) -> None:
    spec = tiny_spec(isolated, f"data.train_files={isolated / 'none.jsonl'}")
    as_plan = run_plan(spec, schema=False)
    as_submit = run_plan(spec, schema=False, for_submit=True)
    assert as_plan.ok and "data.train_files" in keys(as_plan.findings, Severity.WARNING)
    assert not as_submit.ok and "data.train_files" in keys(as_submit.findings)


def test_slurm_checks_wait_for_submit_off_their_cluster(isolated, monkeypatch) -> None:
    monkeypatch.setattr(slurm, "cluster_name", lambda: None)
    (f,) = preflight.check_slurm(tiny_spec(isolated, cluster="slurm-dev"), make, for_submit=False)
    assert f.severity is Severity.INFO and "run at submit" in f.message


# ------------------------------------------------------------------------------------------ cluster advice
def test_gpu_recipe_on_local_names_the_profiles_that_can(isolated) -> None:
    plan = run_plan(resolve_spec("qwen2.5-7b-codegen", "local", [], run_name="t"), schema=False)
    (f,) = [f for f in plan.findings if f.key == "resources.gpus_per_node" and f.severity is Severity.ERROR]
    assert "<=0" not in f.fix
    assert "cluster=a100-ib" in f.fix and "cluster=h100-roce" in f.fix and "cluster=local" not in f.fix


def test_slurm_does_not_repeat_what_the_profile_refuses(isolated, monkeypatch) -> None:
    spec = tiny_spec(isolated, "resources.time=03:00:00", cluster="slurm-dev")
    monkeypatch.setattr(preflight, "check_slurm", lambda *a: [error("resources.time", "MaxTime"),
                                                              error("resources.account", "acct")])
    found = preflight.run_preflight(spec, None, [error("resources.time", "profile limit")], for_submit=True)
    assert [(f.key, f.message) for f in found if f.severity is Severity.ERROR] == [
        ("resources.time", "profile limit"), ("resources.account", "acct")]


def test_too_many_nodes_keeps_its_fix_and_adds_profiles(isolated) -> None:
    plan = run_plan(resolve_spec("ray-probe", "slurm-dev", ["resources.nodes=8"], run_name="t"), schema=False)
    (f,) = [f for f in plan.findings if f.key == "resources.nodes" and f.severity is Severity.ERROR]
    assert f.fix.startswith("use resources.nodes<=4") and "cluster=a100-ib" in f.fix


# ----------------------------------------------------------------------------------------- cluster choice
@pytest.fixture
def no_choice(isolated, monkeypatch):
    monkeypatch.delenv(clusterpick.ENV_VAR, raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return isolated


def test_choice_order(no_choice, monkeypatch) -> None:
    monkeypatch.setattr(slurm, "cluster_name", lambda: "hpcgrpo-dev")
    c = clusterpick.choose_cluster(None)
    assert (c.name, "ClusterName=hpcgrpo-dev" in c.why) == ("slurm-dev", True)
    cfg = Path(no_choice) / "home" / ".config" / "hpc-grpo" / "config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("cluster: a100-ib\n")
    assert clusterpick.choose_cluster(None) == clusterpick.ClusterChoice("a100-ib", f"the default in {cfg}")
    monkeypatch.setenv("HPC_GRPO_CLUSTER", "h100-efa")
    assert clusterpick.choose_cluster(None).name == "h100-efa"
    assert clusterpick.choose_cluster("h100-roce") == clusterpick.ClusterChoice("h100-roce", "cluster= on the command line")


def test_xdg_config_home_and_bad_config(no_choice, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(no_choice / "xdg"))
    cfg = no_choice / "xdg" / "hpc-grpo" / "config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("clustr: a100-ib\n")
    from hpc_grpo.common.yamlio import SpecError

    with pytest.raises(SpecError, match="clustr"):
        clusterpick.choose_cluster(None)


def test_unknown_slurm_and_no_slurm_fall_back_to_local(no_choice, monkeypatch) -> None:
    monkeypatch.setattr(slurm, "cluster_name", lambda: "somewhere")
    c = clusterpick.choose_cluster(None)
    assert c.name == "local" and "matches no profile" in c.why
    monkeypatch.setattr(slurm, "cluster_name", lambda: None)
    assert "no Slurm answers" in clusterpick.choose_cluster(None).why


# ------------------------------------------------------------------------------------------ Slurm parsing
def test_parse_node_shapes_and_config_and_assoc() -> None:
    nodes = slurm_output.parse_node_shapes("node1|4|gpu:4|4000\nnode1|4|gpu:4|4000\nnode2|8|gpu:a100:8(S:0-1)|512000\n")
    assert [(n.name, n.cpus, n.gpus, n.mem_mb, n.gpu_type) for n in nodes] == [
        ("node1", 4, 4, 4000, None), ("node2", 8, 8, 512000, "a100")]
    assert slurm_output.parse_config_value("Foo = 1\nClusterName             = hpcgrpo-dev\n", "ClusterName") == "hpcgrpo-dev"
    assert slurm_output.parse_config_value("Foo = 1\n", "ClusterName") is None
    assert slurm_output.parse_assoc("root|normal\nproj|normal,high\n|\n") == [("root", ["normal"]), ("proj", ["normal", "high"]),
                                                                     ("", [])]


def test_lock_filesystem_read_from_the_mount_table(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("rootfs / ext4 rw 0 0\n"
                      "mds@o2ib:/scratch /lus\\040tre lustre rw,localflock 0 0\n"
                      "srv:/home /home nfs4 rw,vers=4.2 0 0\n")
    assert preflight.mount_of(Path("/lus tre/u/runs"), mounts) == ("/lus tre", "lustre", "rw,localflock")
    (f,) = preflight.check_lock_filesystem(Path("/lus tre/u/runs"), Path("/lus tre/u"), mounts)
    assert f.severity is Severity.INFO and f.key == "cluster.runs_root"
    assert "lustre" in f.message and "localflock" in f.message and "O_EXCL" in f.message
    (f,) = preflight.check_lock_filesystem(Path("/home/u/runs"), Path("/home/u"), mounts)
    assert "nfs4" in f.message
    assert preflight.check_lock_filesystem(Path("/opt/runs"), Path("/opt"), mounts) == []  # local disk: nothing
    assert preflight.check_lock_filesystem(Path("/x"), Path("/x"), tmp_path / "absent") == []
