"""Import paths of the flat layout before the package re-shape, kept while live runs need them (hpc_grpo/compat.py):

- live runs' submitit folders hold `hpc_grpo.submit.TrainJob` and `hpc_grpo.evaluate.EvalJob` pickles: a job that
  starts (or requeues) after an upgrade unpickles them with the new code;
- frozen verl overrides name `pkg://hpc_grpo.code_reward` and `pkg://hpc_grpo.rewards` as the reward's module.

The old pickle bytes are made two ways: submitit's own dump (cloudpickle of a DelayedSubmission, as in a job's
`*_submitted.pkl`) of a real TrainJob/EvalJob whose class is recorded under its old module, and protocol-4 bytes written
opcode by opcode that name the old module. Each is loaded in a fresh interpreter, which has imported nothing of
hpc_grpo before the load, through submitit's own loader.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpc_grpo.evaluation import evaluate, export
from hpc_grpo.launch import submit

REPO = Path(__file__).resolve().parents[2]

LOAD = r"""
import json, sys
assert not any(m == "hpc_grpo" or m.startswith("hpc_grpo.") for m in sys.modules)
from submitit.core.utils import DelayedSubmission
import pickle
path, how = sys.argv[1], sys.argv[2]
if how == "submitit":
    obj = DelayedSubmission.load(path).function
else:
    with open(path, "rb") as fh:
        obj = pickle.load(fh)
cls = type(obj)
import hpc_grpo.launch.submit as new_submit, hpc_grpo.evaluation.evaluate as new_evaluate
new = {new_submit.TrainJob, new_evaluate.EvalJob}
print(json.dumps({"class": f"{cls.__module__}.{cls.__qualname__}",
                  "is_new_class": cls in new,
                  "state": {k: getattr(obj, k) for k in ("run_dir", "after", "eval_after", "argv") if hasattr(obj, k)},
                  "process_slot_empty": getattr(obj, "_proc", "absent") is None}))
"""


def load_fresh(path: Path, how: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", LOAD, str(path), how], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dump_as_old(obj: Any, old_module: str, path: Path) -> bytes:
    """submitit's dump of `obj`, its class recorded under `old_module` (pickle stores module + qualname, and checks
    the class is found there: the compatibility module re-exports the very class). The old module is imported first,
    as it was in the old layout: cloudpickle pickles a class whose module is not loaded by value, not by name."""
    from submitit.core.utils import DelayedSubmission

    importlib.import_module(old_module)
    cls = type(obj)
    real = cls.__module__
    cls.__module__ = old_module
    try:
        DelayedSubmission(obj).dump(path)
    finally:
        cls.__module__ = real
    return path.read_bytes()


def _unicode(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def protocol4(module: str, qualname: str, state: dict[str, Any]) -> bytes:
    """A protocol-4 pickle written by hand: module.qualname via STACK_GLOBAL, created with NEWOBJ, state by BUILD.
    Values: str, None, bool or a list of str (what TrainJob's and EvalJob's states hold)."""
    def value(v: Any) -> bytes:
        if v is None:
            return b"N"  # NONE
        if isinstance(v, bool):
            return b"\x88" if v else b"\x89"  # NEWTRUE / NEWFALSE
        if isinstance(v, str):
            return _unicode(v)
        return b"]" + b"(" + b"".join(_unicode(x) for x in v) + b"e"  # EMPTY_LIST MARK ... APPENDS
    body = (_unicode(module) + _unicode(qualname) + b"\x93"  # STACK_GLOBAL
            + b")" + b"\x81"  # EMPTY_TUPLE NEWOBJ
            + b"}" + b"(" + b"".join(_unicode(k) + value(v) for k, v in state.items())
            + b"u"  # EMPTY_DICT MARK ... SETITEMS
            + b"b" + b".")  # BUILD STOP
    return b"\x80\x04" + b"\x95" + struct.pack("<Q", len(body)) + body  # PROTO 4, one FRAME


def test_old_trainjob_pickle_loads_as_the_new_class(tmp_path: Path) -> None:
    job = submit.TrainJob("/runs/r1", after="4242", eval_after=True)
    data = dump_as_old(job, "hpc_grpo.submit", tmp_path / "old_submitted.pkl")
    assert b"hpc_grpo.submit" in data and b"hpc_grpo.launch" not in data  # it names the old module only
    got = load_fresh(tmp_path / "old_submitted.pkl", "submitit")
    assert got == {"class": "hpc_grpo.launch.submit.TrainJob", "is_new_class": True,
                   "state": {"run_dir": "/runs/r1", "after": "4242", "eval_after": True},
                   "process_slot_empty": True}, got


def test_hand_written_protocol4_trainjob_pickle_loads(tmp_path: Path) -> None:
    """Written without our pickler; its state lacks eval_after, as pickles older than cluster=local's eval do."""
    data = protocol4("hpc_grpo.submit", "TrainJob", {"run_dir": "/runs/r2", "after": None})
    assert type(pickle.loads(data)) is submit.TrainJob  # valid bytes: this process loads them too
    (tmp_path / "hand.pkl").write_bytes(data)
    got = load_fresh(tmp_path / "hand.pkl", "pickle")
    assert got == {"class": "hpc_grpo.launch.submit.TrainJob", "is_new_class": True,
                   "state": {"run_dir": "/runs/r2", "after": None, "eval_after": False},
                   "process_slot_empty": True}, got


def test_old_evaljob_pickles_load_as_the_new_class(tmp_path: Path) -> None:
    argv = ["--run", "/runs/r1", "--if-trained", "--after", "4242"]
    data = dump_as_old(evaluate.EvalJob(argv), "hpc_grpo.evaluate", tmp_path / "old_eval.pkl")
    assert b"hpc_grpo.evaluate" in data and b"hpc_grpo.evaluation" not in data
    want = {"class": "hpc_grpo.evaluation.evaluate.EvalJob", "is_new_class": True, "state": {"argv": argv},
            "process_slot_empty": False}  # EvalJob keeps no process: "absent", not None
    assert load_fresh(tmp_path / "old_eval.pkl", "submitit") == want
    (tmp_path / "hand_eval.pkl").write_bytes(protocol4("hpc_grpo.evaluate", "EvalJob", {"argv": argv}))
    assert load_fresh(tmp_path / "hand_eval.pkl", "pickle") == want


# ------------------------------------------------------------------------------------------ verl's loader
OLD_AND_NEW = {"pkg://hpc_grpo.code_reward": "hpc_grpo.rewards.code",
               "pkg://hpc_grpo.rewards": "hpc_grpo.rewards.gsm8k"}

VERL_LOAD = r"""
import importlib, json, sys
pairs = json.loads(sys.argv[1])
if sys.argv[2] == "verl":
    from verl.utils.import_utils import load_extern_object
else:  # the call the pinned verl's load_extern_object makes for a pkg:// path (verl/utils/import_utils.py: load_module)
    def load_extern_object(module_path, object_name):
        return getattr(importlib.import_module(module_path[len("pkg://"):].replace("/", ".")), object_name)
out = {}
for old, new in pairs.items():
    fn = load_extern_object(old, "compute_score")
    out[old] = {"same": fn is importlib.import_module(new).compute_score, "name": f"{fn.__module__}.{fn.__qualname__}"}
print(json.dumps(out))
"""


def loaded_by(python: str, how: str) -> dict[str, Any]:
    proc = subprocess.run([python, "-c", VERL_LOAD, json.dumps(OLD_AND_NEW), how], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


WANT = {"pkg://hpc_grpo.code_reward": {"same": True, "name": "hpc_grpo.rewards.code.compute_score"},
        "pkg://hpc_grpo.rewards": {"same": True, "name": "hpc_grpo.rewards.gsm8k.compute_score"}}


def test_old_reward_paths_give_the_new_functions_by_verls_import_call() -> None:
    """In this venv, which has no verl: the importlib call verl's loader makes."""
    assert loaded_by(sys.executable, "importlib") == WANT


def test_old_reward_paths_give_the_new_functions_through_verls_loader() -> None:
    """The pinned verl's own load_extern_object, in `.venv-verl` (the interpreter verl's jobs run)."""
    python = export.verl_python()
    if python == sys.executable:
        reason = "no .venv-verl with verl (bash tools/setup-env.sh verl builds it, or set HPC_GRPO_VERL_PYTHON)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    assert loaded_by(python, "verl") == WANT
