"""Can this interpreter import these modules? Asked of the interpreter itself, in a child process, and cached.

Why a child: the answer must be the job's interpreter's, not ours (hpc-grpo may run from a venv with verl's config
files but not its trainer), and importing verl's trainer pulls torch and Ray, which plan never imports.

Why a cache: one probe of verl's trainer costs ~10 s (torch is imported before most failures). Results are kept per
interpreter in memory and in the user cache folder (as verl_schema keeps verl's key tree), keyed by the interpreter's
path, the resolved binary and its mtime, the mtimes of its package folders (pip install and uninstall change them,
so a fixed venv is probed again), PYTHONPATH and the environment the modules are imported under. Each module's result
is kept on its own, so a later probe imports only the modules not yet known; the probe stops at the first module
that fails (that decides the answer). A probe that did not finish is not kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpc_grpo.common.atomic import write_text_atomic

TIMEOUT_S = 300.0
MARKER = "HPC_GRPO_PROBE "
# Run by the probed interpreter: import the modules in order and stop at the first that fails (after a failure,
# later imports meet half-initialised packages and fail for no reason of their own).
SCRIPT = """
import importlib, json, sys
done = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
        done[name] = {"missing": missing, "error": f"{type(exc).__name__}: {exc}"[:400]}
        break
    done[name] = None
print(MARKER + json.dumps(done), flush=True)
""".replace("MARKER", repr(MARKER))

_memo: dict[str, dict[str, dict[str, str | None] | None]] = {}


@dataclass
class Probe:
    """What the interpreter answered: each module that failed -> (the missing module or None, the error line).
    `error` is set when the interpreter gave no answer at all (it did not start, crashed or timed out)."""

    python: str
    failed: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    error: str = ""
    cached: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed and not self.error


def package_dirs(python: Path, real: Path) -> list[Path]:
    """The folders pip installs into for this interpreter: its venv's and its base prefix's site- and
    dist-packages, and the user site."""
    globs = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "local/lib/python3*/dist-packages")
    prefixes = dict.fromkeys((python.parent.parent, real.parent.parent))
    found = [d for prefix in prefixes for g in globs for d in sorted(prefix.glob(g))]
    found += sorted((Path.home() / ".local" / "lib").glob("python3*/site-packages"))
    return found


def fingerprint(python: str, env: dict[str, str]) -> str | None:
    """The cache key of the interpreter as it is now; None where it does not exist here."""
    path = Path(python)
    try:
        real = path.resolve(strict=True)
        parts = [python, str(real), str(real.stat().st_mtime_ns)]
        parts += [f"{d}:{d.stat().st_mtime_ns}" for d in package_dirs(path, real)]
    except OSError:
        return None
    parts.append(f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
    parts += [f"{k}={v}" for k, v in sorted(env.items())]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def cache_file(key: str) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpc-grpo" / "python-probe"
    return root / f"{key}.json"


def _read(key: str) -> dict[str, dict[str, str | None] | None]:
    if key in _memo:
        return _memo[key]
    try:
        known = json.loads(cache_file(key).read_text())
    except (OSError, ValueError):
        known = {}
    _memo[key] = known if isinstance(known, dict) else {}
    return _memo[key]


def _write(key: str, known: dict[str, dict[str, str | None] | None]) -> None:
    _memo[key] = known
    try:
        path = cache_file(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(known, sort_keys=True))
    except OSError:
        pass  # a read-only home: probe again next time


def run_probe(python: str, modules: list[str], env: dict[str, str]) -> tuple[dict[str, dict[str, str | None]] | None, str]:
    """({module: failure} from the interpreter, "") or (None, why there is no answer). Nothing is written: no
    bytecode, stdin closed."""
    child_env = {**os.environ, **env, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        proc = subprocess.run([python, "-c", SCRIPT, *modules], env=child_env, capture_output=True, text=True,
                              timeout=TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return None, f"it did not finish importing them in {TIMEOUT_S:.0f} s"
    except OSError as exc:
        return None, f"it cannot be run ({exc.strerror or exc})"
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(MARKER)), None)
    if line is None:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return None, f"it stopped before answering ({tail})"
    return json.loads(line.removeprefix(MARKER)), ""


def probe(python: str, modules: tuple[str, ...], env: dict[str, str] | None = None) -> Probe:
    """Which of `modules` the interpreter cannot import (under `env`), from the cache where it is known. Once one
    is known to fail the answer is decided, and the others are not tried."""
    env = dict(env or {})
    key = fingerprint(python, env)
    if key is None:
        return Probe(python, error="it does not exist on this machine")
    known = _read(key)
    unknown = [m for m in modules if m not in known]
    out = Probe(python, cached=True)
    if unknown and not any(known.get(m) for m in modules):
        t0 = time.monotonic()
        answer, why = run_probe(python, unknown, env)
        out.cached, out.seconds = False, time.monotonic() - t0
        if answer is None:
            out.error = why
            return out
        _write(key, {**known, **answer})
        known = _memo[key]
    for m in modules:
        failure = known.get(m)
        if failure:
            out.failed[m] = (failure.get("missing"), str(failure.get("error")))
    return out


def forget() -> None:
    """Drop what this process remembers (the cache files stay): the next probe reads the cache folder."""
    _memo.clear()
