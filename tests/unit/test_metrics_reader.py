"""One reader of metrics.jsonl (hpc_grpo.runstate.metrics) for trl's flat rows and verl's file-logger rows.

verl's rows are written by verl's own FileLogger (verl.utils.tracking, in a child process: importing verl loads
torch). verl is installed --no-deps here and its dependency orjson is missing: the child then stands in a module
`orjson` whose dumps writes what orjson writes for these values (compact JSON, bytes) and uses verl's real class,
which adds the {"step": N, "data": {...}} wrapping and the newline. If verl itself cannot be imported, the child
writes that exact line format by hand and says so on stderr. The rows then go the real way: the prune poller
copies them into RUN/metrics.jsonl (also across a verl restart, which rewrites its file), and report, status
(progress and latest numbers), the training summary and prune's keep-best read every step from there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_grpo.cli import app as cli
from hpc_grpo.cli.watch_cmds import print_training_summary
from hpc_grpo.commands import monitor, report, status
from hpc_grpo.runstate import metrics as engine_metrics, runs
from hpc_grpo.launch import render
from hpc_grpo.job import prune_poller
from hpc_grpo.config.resolve import resolve_spec

WRITER = r"""
import json, sys, types
try:
    import orjson  # noqa: F401
except ImportError:  # verl's dependency, not installed here: same bytes for plain floats and ints
    stand_in = types.ModuleType("orjson")
    stand_in.OPT_SERIALIZE_NUMPY = 0
    stand_in.dumps = lambda obj, option=0: json.dumps(obj, separators=(",", ":")).encode()
    sys.modules["orjson"] = stand_in
rows = json.loads(sys.argv[1])
try:
    from verl.utils.tracking import FileLogger
except Exception as exc:
    sys.stderr.write(f"verl's FileLogger not importable ({exc!r}): writing its line format by hand\n")
    with open(__import__("os").environ["VERL_FILE_LOGGER_PATH"], "wb") as fh:
        for step, data in rows:
            fh.write(json.dumps({"step": step, "data": data}, separators=(",", ":")).encode() + b"\n")
    sys.exit(0)
logger = FileLogger("hpc-grpo", "v")
for step, data in rows:
    logger.log(data=data, step=step)
logger.finish()
"""


def verl_data(step: int) -> dict[str, float]:
    return {"critic/score/mean": 0.5 + step / 100, "actor/kl_loss": step / 1000, "response_length/mean": 300.0 - step,
            "actor/grad_norm": 0.005, "timing_s/step": 200.0 + step, "actor/entropy": 1.0 - step / 100}


def file_logger(path: Path, steps: range) -> None:
    """One verl driver session: its FileLogger opens the file with "wb" (a restart starts it empty)."""
    rows = [[s, verl_data(s)] for s in steps]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(path)}
    proc = subprocess.run([sys.executable, "-c", WRITER, json.dumps(rows)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Creating file logger" in proc.stdout or "by hand" in proc.stderr, proc.stdout  # verl's own print
    print(proc.stdout.strip(), proc.stderr.strip())


def test_verl_file_logger_rows_reach_report_status_and_prune(isolated: Path, monkeypatch, capsys) -> None:
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "local", [f"cluster.runs_root={isolated}"], run_name="v")
    render.write_files(spec.path, render.render_all(spec))
    runs.append_history(spec.path, "4242", "train", "local")
    run, src = spec.path, spec.path / "verl_metrics.jsonl"
    file_logger(src, range(1, 4))
    assert src.read_text().splitlines()[0].startswith('{"step":1,"data":{"critic/score/mean":0.51,')
    assert prune_poller.main(["--run-dir", str(run), "--once", "--verl-log", str(src)]) == 0
    file_logger(src, range(4, 7))  # verl restarted: its file holds steps 4-6 only
    assert prune_poller.main(["--run-dir", str(run), "--once", "--verl-log", str(src)]) == 0
    steps = list(range(1, 7))

    def series(key: str) -> list[tuple[int, float]]:
        return [(s, verl_data(s)[key]) for s in steps]

    rep = report.build(run)
    assert rep.steps["reward"] == series("critic/score/mean")
    assert rep.steps["kl"] == series("actor/kl_loss")
    assert rep.steps["response length"] == series("response_length/mean")
    assert rep.steps["entropy"] == series("actor/entropy")
    assert "metrics.jsonl" in rep.source

    rows, _, _ = monitor.read_rows(spec)  # what status's progress line and latest numbers come from
    assert [(r["step"], r["reward"], r["kl"], r["response_length"]) for r in rows] == [
        (s, *(verl_data(s)[k] for k in ("critic/score/mean", "actor/kl_loss", "response_length/mean"))) for s in steps]
    mon = monitor.monitor(spec)
    assert mon.progress.step == 6 and mon.progress.step_time_s == pytest.approx(203.5)  # median of steps 1-6
    assert status.run_status(run).last_step == 6

    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "status", str(run)])
    with pytest.raises(SystemExit):
        cli.main()
    text = capsys.readouterr().out
    assert "no step logged yet" not in text and "Last step: 6" in text
    assert "Latest (step 6): reward 0.56   kl 0.006   grad_norm 0.005   response_length 294" in text

    print_training_summary(run)
    table = capsys.readouterr().out
    assert all(f"{verl_data(s)['critic/score/mean']:.4f}" in table for s in steps)

    logged = engine_metrics.logged_metrics(run, "verl")  # keep_best names verl's own keys
    assert [logged[s]["critic/score/mean"] for s in steps] == [v for _, v in series("critic/score/mean")]


def test_trl_rows_and_verl_rows_read_alike(tmp_path: Path) -> None:
    """Both layouts in one vocabulary; a line being written, or not a record, is skipped."""
    from hpc_grpo.runstate import metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward": 0.5, "kl": 0.001, "completion_length": 30.0, "time": 10.0}\n'
                    '{"step":2,"data":{"critic/score/mean":0.6,"actor/kl_loss":0.002,"response_length/mean":29.0}}\n'
                    '[1, 2]\n{"step": "x"}\n{"step":3,"da')
    assert [(r["step"], r["reward"], r["kl"], r["response_length"]) for r in metrics.file_rows(path)] == [
        (1, 0.5, 0.001, 30.0), (2, 0.6, 0.002, 29.0)]
    assert metrics.read_raw(path)[2] == {"critic/score/mean": 0.6, "actor/kl_loss": 0.002, "response_length/mean": 29.0}
