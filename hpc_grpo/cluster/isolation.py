"""Which isolation the code sandbox gets on this node, the refusal rule, and the words that say so.

The execution reward runs policy code (hpc_grpo/sandbox/code_sandbox.py). With namespaces (root: `namespaces+uid`;
a normal user through unprivileged user namespaces: `userns`) the code sees a minimal read-only root, no
network and only its own processes. Without them (`limits-only`) it runs with the user's rights: it could read
~/.netrc, the data files with the expected answers, and reach services on the node. So the recipe key
grpo.code.isolation decides:

- `auto` (the default): namespaces; where the node allows none, the reward REFUSES to run (IsolationRefused,
  naming the key and the fix), at job start and at every scoring call;
- `limits-only`: the explicit consent to run the code with resource limits only (no namespaces even where
  the node has them: what the recipe says is what runs, on every node alike).

probe() asks the sandbox itself (`python -I -S code_sandbox.py --probe`: the real set-up, made once in a
throw-away process, ~20 ms) and is cached per process. Stdlib only: plan imports this.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

KEY = "grpo.code.isolation"
SETTINGS = ("auto", "limits-only")
MODES = ("namespaces+uid", "userns", "limits-only")
# The runner, run by path (a process of its own), never imported here: the one place its file is named.
SANDBOX = Path(__file__).resolve().parents[1] / "sandbox" / "code_sandbox.py"
# What the sandbox's process may inherit: its own environment is readable by the code (/proc/1/environ,
# /proc/self/environ: the kernel keeps the block it was started with), so it gets nothing else. The
# scorer's variables (WANDB_API_KEY, HF_TOKEN, Slurm's, Ray's) never reach it.
PASSED_ENV = ("HPC_GRPO_SANDBOX_UID_BASE",)
_LOCK = threading.Lock()


class IsolationRefused(RuntimeError):
    """grpo.code.isolation=auto on a node where the sandbox gets no namespaces."""


@dataclass(frozen=True, slots=True)
class Probe:
    """What `auto` gets here: a mode of MODES; why: the reason namespaces failed (limits-only)."""

    mode: str
    why: str = ""
    tried: str = ""


def sandbox_env() -> dict[str, str]:
    """The sandbox process's whole environment (see PASSED_ENV)."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
    return env


@functools.lru_cache(maxsize=1)
def _probe_cached() -> Probe:
    try:
        proc = subprocess.run([sys.executable, "-I", "-S", str(SANDBOX), "--probe"], capture_output=True, text=True,
                              timeout=60, env=sandbox_env(), cwd="/", check=False)
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        mode = str(report["isolation"])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, KeyError) as exc:
        return Probe("limits-only", f"the probe itself failed: {type(exc).__name__}: {exc}", "")
    if mode not in MODES:
        return Probe("limits-only", f"the probe answered {mode!r}", "")
    return Probe(mode, str(report.get("why", "")), str(report.get("tried", "")))


def probe() -> Probe:
    """This node's answer, asked once per process (threads of one scoring pool ask it together)."""
    with _LOCK:
        return _probe_cached()


def check_setting(setting: str) -> str:
    """The setting, or ValueError naming the key, the value and the accepted ones."""
    if setting not in SETTINGS:
        raise ValueError(f"{KEY}={setting!r} is not one of {', '.join(SETTINGS)}")
    return setting


def refusal_parts(found: Probe) -> tuple[str, str]:
    """The refusal: what is missing and why; and the two fixes."""
    message = (f"{KEY}=auto refuses to run policy code here: the code sandbox gets no namespaces on this node "
               f"({found.tried or 'namespaces'} failed: {found.why}), so the code would run with your own rights "
               "(it could read ~/.netrc, your data files and reach the network)")
    fix = ("enable unprivileged user namespaces on the compute nodes (sysctl user.max_user_namespaces > 0; "
           "kernel.unprivileged_userns_clone=1 where that sysctl exists; kernel.apparmor_restrict_unprivileged_userns=0 "
           f"on Ubuntu 23.10 and later), or set {KEY}=limits-only to accept resource limits only")
    return message, fix


def refusal(found: Probe) -> str:
    message, fix = refusal_parts(found)
    return f"{message}. Fix: {fix}"


def require(setting: str) -> str:
    """The mode the sandbox will run in under `setting`; IsolationRefused where `auto` finds no namespaces."""
    if check_setting(setting) == "limits-only":
        return "limits-only"
    found = probe()
    if found.mode == "limits-only":
        raise IsolationRefused(refusal(found))
    return found.mode


def describe(mode: str) -> str:
    """One line on what a mode means for the code under test."""
    return {
        "namespaces+uid": "namespaces+uid (root): no network, a minimal read-only root with private /tmp, "
                          "its own PID namespace, a uid of its own",
        "userns": "userns (unprivileged user namespaces): no network, a minimal read-only root with private "
                  "/tmp, its own PID namespace, no capability",
        "limits-only": "limits-only: resource limits and the kill of its processes only; the code runs with "
                       "your rights (your files, the network)",
    }[mode]


def job_line(setting: str) -> str:
    """What a job prints at its start: the probed result on this node (or the refusal, raised)."""
    mode = require(setting)
    if setting == "limits-only":
        return f"code sandbox: {describe(mode)} ({KEY}=limits-only)"
    return f"code sandbox on {os.uname().nodename}: {describe(mode)} (probed; {KEY}=auto)"
