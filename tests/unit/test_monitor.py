"""Monitoring from real run-directory files: metrics.jsonl as trl_job writes it, verl console lines as verl's
console logger prints them (`step:N - key:value - ...`), history.jsonl requeues, nvidia-smi csv rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_grpo.commands import monitor
from hpc_grpo.runstate import runs
from hpc_grpo.runstate import metrics
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.runstate import layout


def trl_spec(tmp: Path, *overrides: str):
    spec = resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={tmp}", *overrides], run_name="r")
    spec.path.mkdir(parents=True, exist_ok=True)
    return spec


def write_metrics(spec, rows: list[dict]) -> None:
    with (spec.path / "metrics.jsonl").open("w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def test_trl_progress_eta_requeues(isolated) -> None:
    spec = trl_spec(isolated)  # 24 steps
    write_metrics(spec, [{"step": s, "reward": 0.1 * s, "kl": 0.001, "grad_norm": 0.5, "completion_length": 20.0,
                          "time": 1000.0 + 2.0 * s} for s in range(1, 7)])
    with (spec.path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 7, "rew')  # a line being written is skipped
    runs.append_history(spec.path, "123", "train", "local")
    runs.append_history(spec.path, "123", "requeue", "local")
    mon = monitor.monitor(spec)
    p = mon.progress
    assert (p.step, p.total, p.total_estimated, p.step_time_s, p.eta_s, p.requeues) == (6, 24, False, 2.0, 36.0, 1)
    assert mon.latest["reward"] == pytest.approx(0.6) and mon.latest["response_length"] == 20.0
    assert mon.hints == []
    assert monitor.bar(6, 24, width=8) == "[##------] 6/24 25%"
    assert monitor.bar(None, 24) == "no step logged yet"
    assert monitor.duration(3725) == "1:02:05"


def test_total_estimated_from_the_data_rows(isolated) -> None:
    train = isolated / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": "q", "ground_truth": "1"}) + "\n" for _ in range(20)))
    spec = trl_spec(isolated, "train.total_training_steps=null", "train.total_epochs=2", f"data.train_files={train}")
    assert monitor.total_steps(spec, None) == (2 * (20 // 8), True)
    assert monitor.total_steps(spec, 99) == (99, False)  # what the engine printed wins


VERL_LOG = """(TaskRunner pid=1) Total training steps: 105
(TaskRunner pid=1) step:1 - actor/entropy:0.52 - actor/kl_loss:0.0011 - actor/grad_norm:0.0051 - critic/score/mean:0.55 - response_length/mean:290.1 - response_length/clip_ratio:0.01 - timing_s/step:206.3
unrelated line with step:2 inside text but not a record? no - x
(TaskRunner pid=1) step:2 - actor/kl_loss:0.0019 - actor/grad_norm:0.0049 - critic/score/mean:0.61 - response_length/mean:280.0 - response_length/clip_ratio:0.02 - timing_s/step:200.0
"""


def test_verl_console_lines_are_parsed() -> None:
    rows, total = metrics.verl_rows(VERL_LOG)
    assert total == 105
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1] == {"step": 2, "reward": 0.61, "kl": 0.0019, "grad_norm": 0.0049, "response_length": 280.0,
                       "response_clip_ratio": 0.02, "step_time": 200.0}
    assert metrics.parse_verl_line("hpc-grpo: [1.0] Ray joined") is None


def test_verl_run_reads_every_driver_log(isolated) -> None:
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", [f"cluster.runs_root={isolated}"], run_name="v")
    layout.submitit_dir(spec.path).mkdir(parents=True)
    runs.append_history(spec.path, "10", "train", "slurm")
    runs.append_history(spec.path, "11", "resume", "slurm")
    monitor.log_path(spec, "10").write_text(VERL_LOG)
    monitor.log_path(spec, "11").write_text("step:3 - critic/score/mean:0.7 - timing_s/step:190\n")
    rows, total, source = monitor.read_rows(spec)
    assert [r["step"] for r in rows] == [1, 2, 3] and total == 105 and "console metric lines" in source
    p = monitor.progress_of(spec, rows, total)
    assert (p.step, p.total, p.step_time_s) == (3, 105, 200.0)
    assert p.eta_s == pytest.approx(200.0 * 102)


def rows_with(key: str, values: list[float]) -> list[dict]:
    return [{"step": i + 1, key: v} for i, v in enumerate(values)]


@pytest.mark.parametrize("key,values,words", [
    ("kl", [0.001, 0.002, 0.3], "far above"),
    ("kl", [0.002, 0.004, 0.008, 0.012, 0.02, 0.04], "risen for 5 logged steps"),
    ("reward", [0.5, 0.6, 0.7, 0.2, 0.1, 0.1], "reward collapsing"),
    ("grad_norm", [0.005, 0.005, 0.006, 0.005, 0.005, 0.2], "grad norm spiked"),
    ("response_length", [30.0, 31.0, 32.0], "at the limit data.max_response_length=32"),
    ("response_clip_ratio", [0.1, 0.6], "60% of responses"),
])
def test_hints_when_leaving_the_healthy_range(isolated, key, values, words) -> None:
    spec = trl_spec(isolated, *REFERENCE_SCALE)
    (hint,) = monitor.health_hints(spec, rows_with(key, values))
    assert words in hint


# The reference GPU run's health section (the defaults) on the tiny recipe, whose own section declares a demo's.
REFERENCE_SCALE = ("health.kl=0.0027", "health.length_limit_by_design=false")


def test_a_demo_is_judged_against_its_own_scale(isolated) -> None:
    """The quickstart's own numbers (KL 3.05, mean length 31 of 32) are what the tiny demo is meant to do: no hint;
    the same numbers on a recipe at the reference run's scale get both; a demo far past its own scale still gets the
    KL hint, naming its health.kl."""
    rows = [{"step": s, "kl": 3.053, "response_length": 31.0} for s in range(1, 9)]
    demo = trl_spec(isolated)
    assert demo.recipe.health.length_limit_by_design and demo.recipe.health.kl > 0.1
    assert monitor.health_hints(demo, rows) == []
    at_reference = monitor.health_hints(trl_spec(isolated, *REFERENCE_SCALE), rows)
    assert [h.split()[0] for h in at_reference] == ["KL", "mean"]
    (far,) = monitor.health_hints(demo, [{"step": 1, "kl": 500.0}])
    assert "far above this recipe's healthy ~3 (health.kl" in far


@pytest.mark.parametrize("key,values", [
    ("kl", [0.001, 0.0015, 0.002, 0.0024, 0.0026, 0.0027]),  # rising but bounded, as the reference GPU run's (docs/benchmarks.md)
    ("reward", [0.55, 0.6, 0.7, 0.8, 0.85, 0.9]),
    ("grad_norm", [0.005, 0.006, 0.004, 0.005, 0.005, 0.006]),
    ("response_length", [29.0, 22.0]),
])
def test_no_hint_in_the_healthy_range(isolated, key, values) -> None:
    assert monitor.health_hints(trl_spec(isolated, *REFERENCE_SCALE), rows_with(key, values)) == []


def test_gpu_rows_and_idle_hint() -> None:
    text = "node2, 1, NVIDIA A100-SXM4-80GB, 97, 70000, 81920\nnode1, 0, NVIDIA A100-SXM4-80GB, 12, 5000, 81920\n" \
           "node1, 1, NVIDIA A100, [N/A], 1, 2\n"
    rows = monitor.parse_gpu_rows(text)
    assert [(g.node, g.index, g.util_pct) for g in rows] == [("node1", 0, 12.0), ("node2", 1, 97.0)]
    (hint,) = monitor.gpu_hints(rows)
    assert "1 of 2 GPUs under 50%" in hint and "node1:0" in hint
    assert monitor.gpu_hints(rows[1:]) == []


def test_log_path_per_node(isolated) -> None:
    spec = trl_spec(isolated)
    assert monitor.log_path(spec, "7", 1).name == "7_1_log.out"
    assert monitor.log_path(spec, "7", 0, err=True).name == "7_0_log.err"


def test_status_prints_the_bar_and_hints(isolated, monkeypatch, capsys) -> None:
    import sys

    from hpc_grpo.cli import app as cli

    spec = trl_spec(isolated, "health.length_limit_by_design=false")
    from hpc_grpo.launch.render import render_all, write_files

    write_files(spec.path, render_all(spec))
    write_metrics(spec, [{"step": s, "reward": 0.1, "kl": 0.001, "grad_norm": 0.3, "completion_length": 32.0,
                          "time": 10.0 + s} for s in range(1, 9)])
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "status", str(spec.path)])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    text = capsys.readouterr().out
    assert exc.value.code == 0, text
    assert "Progress: [##########--------------------] 8/24 33%   1.0 s/step   ETA 0:00:16   requeues 0" in text
    assert "Latest (step 8): reward 0.1   kl 0.001   grad_norm 0.3   response_length 32" in text
    assert "hint: mean response length 32 at the limit" in " ".join(text.split())
    assert f"what the reward means: {spec.recipe.health.reward_note}" in " ".join(text.split())


def test_logs_follow_ends_with_the_job_and_node_is_checked(isolated, monkeypatch, capsys) -> None:
    """`logs -f` on a job that is no longer live prints the log once and returns; --node outside the run is refused."""
    import subprocess
    import sys
    import time

    from hpc_grpo.cli import app as cli

    spec = trl_spec(isolated)
    from hpc_grpo.launch.render import render_all, write_files

    write_files(spec.path, render_all(spec))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a local job id is its pid: this one has ended
    runs.append_history(spec.path, str(dead.pid), "train", "local")
    monitor.log_path(spec, str(dead.pid)).parent.mkdir(exist_ok=True)
    monitor.log_path(spec, str(dead.pid)).write_text("line one\nline two\n")
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "logs", str(spec.path), "-f"])
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 0 and time.monotonic() - t0 < 10
    assert capsys.readouterr().out == "line one\nline two\n"
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "logs", str(spec.path), "--node", "1"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2 and "nodes 0..0" in capsys.readouterr().err


def test_status_watch_prints_progress_and_ends_without_a_live_job(isolated, monkeypatch, capsys) -> None:
    import sys

    from hpc_grpo.cli import app as cli
    from hpc_grpo.launch.render import render_all, write_files

    spec = trl_spec(isolated)
    write_files(spec.path, render_all(spec))
    write_metrics(spec, [{"step": s, "reward": 0.1, "time": 10.0 + 2 * s} for s in range(1, 4)])
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "status", str(spec.path), "--watch"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    text = capsys.readouterr().out
    assert exc.value.code == 0
    assert text.count("Progress: [") == 1 and "3/24 12%   2.0 s/step   ETA 0:00:42" in text
