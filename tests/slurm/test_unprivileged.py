"""The whole trl path as an ordinary user on the real local Slurm cluster: nobody trains as root on a cluster.

Every other Slurm test submits as root. Here the test makes (idempotently) an unprivileged account, USER, with a
home and a Slurm accounting association, and runs everything AS that user (setpriv, a minimal environment: HOME,
PATH with the venv's bin folder, SLURM_CONF, W&B offline, the Hub off, PYTHONPATH = this checkout): the tiny model
and the GSM8K files are built with `hpc-grpo model tiny` and `hpc-grpo data gsm8k` into a folder the user owns, the
runs root is in the user's home, tiny-gsm8k trains 2 steps (a checkpoint each) and its chained evaluation scores 2
problems. Then, still as the user: status --json, prune-ckpts --dry-run --json and resume --dry-run --force.

It checks that Slurm ran the jobs under the user's uid (sacct's User column and the job logs' owner), that the
evaluation wrote RUN/eval/step_2.json, and that nothing in the run folder belongs to root.

The user must be able to reach the interpreter (the venv and the Python it was made from), this checkout (the
editable install points at it) and the shared GSM8K folder: a path component others cannot traverse fails the test
with its name (the test changes no permission of the developer's tree; tools/run-tests.sh makes them traversable).
The user, its home and its association stay (idempotent creation); the test's own folder in that home is removed
when the test passes.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpc_grpo.runstate import runs
from tests.conftest import ONE_THREAD
from tests.slurm.jobs import wait_final
from tests.slurm.test_submit import GSM8K, REPO
from tests.unix_user import USER, ensure_user

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

ACCOUNT = "root"  # the one account slurm-dev has (tools/slurm-dev/start.sh registers no other)
DEADLINE_S = 600.0  # train (~30 s) + the eval job (~1 min) on 2 shared cores; room for a busy queue
LIMIT = 2


@dataclass
class As:
    """Runs commands as USER with a minimal environment."""

    uid: int
    gid: int
    home: Path
    env: dict[str, str]

    def run(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", *args],
                              capture_output=True, text=True, env=self.env, cwd=cwd, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)

    def cli(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.run("hpc-grpo", *args, cwd=cwd, timeout=timeout)

    def fresh_dir(self, prefix: str) -> Path:
        """A new folder in the user's home, made by the user (so the user owns it, as on a cluster)."""
        work = self.home / f"{prefix}-{os.getpid():x}{int(time.time()) % 100000:x}"
        proc = self.run("mkdir", "-p", str(work), cwd=self.home)
        assert proc.returncode == 0, proc.stderr
        return work


def _ensure_association() -> None:
    """Accounting knows the user (slurm-dev enforces no associations, but sacct and a real site expect one)."""
    listed = subprocess.run(["sacctmgr", "-n", "-P", "list", "user", USER, "format=user"], capture_output=True,
                            text=True, timeout=30, check=True)
    if USER in listed.stdout.split():
        return
    proc = subprocess.run(["sacctmgr", "-i", "add", "user", USER, f"account={ACCOUNT}"], capture_output=True,
                          text=True, timeout=30, check=False)
    listed = subprocess.run(["sacctmgr", "-n", "-P", "list", "user", USER, "format=user"], capture_output=True,
                            text=True, timeout=30, check=True)
    assert USER in listed.stdout.split(), proc.stdout + proc.stderr


def _blocked(path: Path, *, read: bool) -> list[str]:
    """Components of PATH (each folder from / down, and the symlinks' targets) others cannot traverse or read."""
    bad: list[str] = []
    seen: set[Path] = set()

    def check(p: Path, need: int) -> None:
        if p in seen:
            return
        seen.add(p)
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            target = Path(os.readlink(p))
            target = target if target.is_absolute() else p.parent / target
            walk(Path(os.path.normpath(target)), need)
            return
        if stat.S_ISDIR(st.st_mode):
            need |= stat.S_IXOTH
        if st.st_mode & need != need:
            bad.append(f"{p} ({stat.filemode(st.st_mode)} {st.st_uid}:{st.st_gid})")

    def walk(p: Path, last: int) -> None:
        parts = p.parts
        for i in range(1, len(parts) + 1):
            check(Path(*parts[:i]), last if i == len(parts) else stat.S_IXOTH)

    walk(Path(os.path.abspath(path)), (stat.S_IROTH if read else 0))
    return bad


def _check_reachable(extra: dict[Path, bool]) -> None:
    """The user needs the interpreter, its standard library, the venv, this checkout, SLURM_CONF and `extra`."""
    needs = {
        Path(sys.executable): True,
        Path(sysconfig.get_paths()["stdlib"]): True,
        Path(sysconfig.get_paths()["purelib"]): True,
        REPO / "hpc_grpo" / "__init__.py": True,
        REPO / "recipes": True,
        Path(os.environ["SLURM_CONF"]): True,
        **extra,
    }
    bad = sorted({b for p, read in needs.items() for b in _blocked(p, read=read)})
    if bad:
        pytest.fail(f"user {USER} cannot reach what it needs: others may not traverse/read " + ", ".join(bad)
                    + " (make these o+x / o+r, e.g. tools/run-tests.sh does so for the checkout and the interpreter)",
                    pytrace=False)


def as_user(needs: dict[Path, bool]) -> As:
    """USER (made if missing, with its accounting association), after checking it can reach the interpreter, this
    checkout and `needs` (path -> must be readable); also for tests/slurm/test_codegen.py."""
    if shutil.which("setpriv") is None or shutil.which("useradd") is None:
        pytest.fail("setpriv and useradd are needed (util-linux, passwd)", pytrace=False)
    _check_reachable(needs)
    pw = ensure_user()
    _ensure_association()
    assert pw.pw_uid != 0
    home = Path(pw.pw_dir)
    env = {
        "HOME": str(home), "USER": USER, "LOGNAME": USER, "LANG": "C.UTF-8",
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "SLURM_CONF": os.environ["SLURM_CONF"], "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1", **ONE_THREAD,
        "PYTHONPATH": str(REPO),  # this checkout, whichever the venv's editable install points at
    }
    return As(pw.pw_uid, pw.pw_gid, home, env)


@pytest.fixture(scope="module")
def user() -> As:
    if not GSM8K.is_dir():
        pytest.fail(f"{GSM8K} is missing: the GSM8K files live in ../shared beside the checkout", pytrace=False)
    return as_user({GSM8K / "train.jsonl": True, GSM8K / "test.jsonl": True})


def _owners(root: Path) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            found.setdefault(os.lstat(p).st_uid, []).append(str(p.relative_to(root)))
    found.setdefault(os.lstat(root).st_uid, []).append(".")
    return found


def _sacct_user(job_id: str) -> str:
    out = ""
    for _ in range(40):  # slurmdbd learns of a job a moment after slurmctld
        proc = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "User"], capture_output=True,
                              text=True, timeout=30, check=False)
        out = proc.stdout.strip()
        if out:
            return out
        time.sleep(0.5)
    return out


def _logs(run_dir: Path, job_id: str) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in (run_dir / "submitit").glob(f"{job_id}_0_log.*"))


def test_an_unprivileged_user_trains_evaluates_and_manages_a_run(user: As) -> None:
    t0 = time.monotonic()
    work = user.fresh_dir("unpriv")

    # The interpreter, the checkout (the code under test) and the CLI, as the user sees them.
    proc = user.run("python", "-c", "import hpc_grpo, os; print(hpc_grpo.__file__, os.getuid())", cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == [str(REPO / "hpc_grpo" / "__init__.py"), str(user.uid)], proc.stdout

    # Model and data, built by the user into its own folder.
    proc = user.cli("model", "tiny", "--out", str(work / "models" / "tiny-qwen2"), cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = user.cli("data", "gsm8k", "--source", str(GSM8K), "--out", str(work / "data"), cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trl_train, trl_test = work / "data" / "trl" / "train.jsonl", work / "data" / "trl" / "test.jsonl"
    assert trl_train.is_file() and trl_test.is_file(), proc.stdout
    t_prep = time.monotonic() - t0

    name = work.name  # unpriv-TAG: the run is named as its folder
    runs_root = work / "runs"
    run_dir = runs_root / name
    proc = user.cli("submit", "recipe=tiny-gsm8k", "cluster=slurm-dev", f"cluster.runs_root={runs_root}",
                    f"data.train_files={trl_train}", f"data.val_files={trl_test}",
                    f"model.path={work / 'models' / 'tiny-qwen2'}", "train.total_training_steps=2",
                    "checkpoint.save_freq=1", f"eval.limit={LIMIT}", "--name", name, "--no-wait", cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    history = runs.read_history(run_dir)
    assert [e.purpose for e in history] == ["train", "eval"], history
    train_id, eval_id = history[0].job_id, history[1].job_id

    train = wait_final(train_id, DEADLINE_S)
    assert train.state == "COMPLETED", (train, _logs(run_dir, train_id))
    t_train = time.monotonic() - t0
    ev = wait_final(eval_id, DEADLINE_S)
    assert ev.state == "COMPLETED", (ev, _logs(run_dir, eval_id))
    t_eval = time.monotonic() - t0

    # Slurm ran both jobs as the user.
    for job_id in (train_id, eval_id):
        assert _sacct_user(job_id) == USER, job_id
        log = run_dir / "submitit" / f"{job_id}_0_log.out"
        assert log.is_file() and log.stat().st_uid == user.uid, log

    result = json.loads((run_dir / "eval" / "step_2.json").read_text())
    assert result["step"] == 2 and result["scores"]["gsm8k"]["n"] == LIMIT, result.get("scores")

    # The user manages the run.
    proc = user.cli("status", str(run_dir), "--json", cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    st = json.loads(proc.stdout)
    assert st["last_step"] == 2, st
    assert st["newest_checkpoint"] and Path(st["newest_checkpoint"]).name == "checkpoint-2", st
    assert [j["state"] for j in st["jobs"] if j["job_id"] in (train_id, eval_id)] == ["COMPLETED", "COMPLETED"], st

    proc = user.cli("prune-ckpts", str(run_dir), "--dry-run", "--json", cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pruned = json.loads(proc.stdout)
    assert pruned["dry_run"] is True and not pruned["errors"], pruned
    assert [(c["step"], c["keep"]) for c in pruned["checkpoints"]] == [(1, True), (2, True)], pruned  # keep_last 2
    assert all(Path(c["path"]).is_dir() for c in pruned["checkpoints"]), pruned

    proc = user.cli("resume", str(run_dir), "--dry-run", "--force", cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = " ".join(proc.stdout.split())  # rich wraps long lines
    assert f"It resumes from {run_dir / 'checkpoints' / 'checkpoint-2'} (step 2)" in text, proc.stdout
    assert "Would submit scripts/sbatch.sh" in text, proc.stdout
    assert [e.job_id for e in runs.read_history(run_dir) if e.purpose not in runs.EVENTS] == [train_id, eval_id]

    # Nothing in the run, the test's folder or the user's home (caches the jobs wrote) belongs to anyone else.
    owners = _owners(user.home)
    assert set(owners) == {user.uid}, {uid: paths[:10] for uid, paths in owners.items() if uid != user.uid}

    print(f"\nunprivileged {USER} (uid {user.uid}): model+data {t_prep:.1f}s, train job {train_id} done at "
          f"{t_train:.1f}s, eval job {eval_id} done at {t_eval:.1f}s, total {time.monotonic() - t0:.1f}s")
    shutil.rmtree(work)
