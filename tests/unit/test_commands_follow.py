"""The logic behind the CLI's following commands (hpc_grpo.commands.logs and .watch), and the option checks and
listings of the other commands (eval, catalog, report), without the CLI around them.

The job-end test runs real submitit LocalExecutor jobs (stdlib callables: one prints, one raises) in a real run
directory, so success is decided the way `submit --wait` decides it: by the run's own row for the job.
"""

from __future__ import annotations

import operator
from pathlib import Path

import pytest

from hpc_grpo.commands import catalog, logs, report, watch
from hpc_grpo.commands.eval import check_code_options
from hpc_grpo.commands.monitor import Monitor, Progress
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.launch import render
from hpc_grpo.runstate import layout, runs


def test_read_from_a_missing_then_growing_file(tmp_path: Path) -> None:
    log = tmp_path / "1_0_log.out"
    assert logs.read_from(log, 0) == ("", 0)
    log.write_text("one\n")
    chunk, pos = logs.read_from(log, 0)
    assert (chunk, pos) == ("one\n", 4)
    with log.open("a") as fh:
        fh.write("two\n")
    assert logs.read_from(log, pos) == ("two\n", 8)
    assert logs.read_from(log, 8) == ("", 8)


def test_follow_without_a_job_reads_once(tmp_path: Path) -> None:
    log = tmp_path / "log"
    assert list(logs.follow(log, None)) == []
    log.write_text("all of it\n")
    assert list(logs.follow(log, None)) == ["all of it\n"]


def test_follow_reads_once_more_after_the_job_ended(tmp_path: Path) -> None:
    """Lines written between the last read and the end of the job are not lost: one read follows the end."""
    log = tmp_path / "log"
    log.write_text("start\n")
    asked = []

    def running() -> bool:
        asked.append(1)
        with log.open("a") as fh:
            fh.write(f"line {len(asked)}\n")
        return len(asked) < 3  # the job ends on the third question, after writing its last line

    chunks = list(logs.follow(log, running, poll_s=0.0))
    assert "".join(chunks) == "start\nline 1\nline 2\nline 3\n"
    assert len(asked) == 3


def test_follow_asks_whether_the_job_lives_at_most_every_check_interval(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("x\n")
    asked = []

    def running() -> bool:
        asked.append(1)
        return True

    gen = logs.follow(log, running, poll_s=0.0, check_every_s=3600.0)
    assert next(gen) == "x\n"
    with log.open("a") as fh:
        fh.write("y\n")
    assert next(gen) == "y\n"  # read again and again, but Slurm asked once
    gen.close()
    assert len(asked) == 1


def progress(step: int | None) -> Progress:
    return Progress(step, 10, False, 2.0, 4.0, 0)


def test_progress_updates_on_each_new_step_with_new_hints_until_no_job_is_live(monkeypatch, tmp_path: Path) -> None:
    seen = [Monitor(progress(None)), Monitor(progress(1), hints=["a"]), Monitor(progress(1), hints=["a"]),
            Monitor(progress(2), hints=["a", "b", "b"]), Monitor(progress(3), hints=["b"])]
    feed = iter(seen)
    monkeypatch.setattr(watch, "monitor", lambda spec: next(feed))
    live = iter([{"7": "RUNNING"}] * (len(seen) - 1) + [{}])
    monkeypatch.setattr(watch.runs, "live_jobs", lambda run_dir: next(live))
    got = [(p.step, hints) for p, hints in watch.progress_updates(tmp_path, object(), interval_s=0.0)]
    # nothing while no step is logged; step 1 once; each hint once
    assert got == [(1, ["a"]), (2, ["b"]), (3, [])]


def local_run(tmp: Path):
    spec = resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={tmp / 'runs'}"], run_name="r")
    render.write_files(spec.path, render.render_all(spec))
    return spec


@pytest.mark.parametrize("fails", [False, True])
def test_job_end_follows_a_real_local_job_and_judges_it_by_the_runs_row(isolated: Path, fails: bool) -> None:
    import submitit

    from hpc_grpo.launch.submit import Submission

    spec = local_run(isolated)
    executor = submitit.LocalExecutor(folder=layout.submitit_dir(spec.path))
    executor.update_parameters(timeout_min=2)
    job = executor.submit(operator.truediv, 1, 0) if fails else executor.submit(print, "hello from the job")
    runs.append_history(spec.path, job.job_id, "train", "local")
    log = layout.job_log(spec.path, job.job_id)
    (spec.path / "eval").mkdir()
    for step in (2, 4):
        (spec.path / "eval" / f"step_{step}.json").write_text(f'{{"step": {step}, "model": "m", "scores": {{}}}}')
    sub = Submission(spec.path, job.job_id, "local", str(log), job)

    echoed = "".join(watch.job_log(sub))
    assert job.done()
    end = watch.job_end(sub)
    assert ("hello from the job" in echoed) != fails
    assert end.ok is (not fails)
    assert [j.job_id for j in end.status.jobs] == [job.job_id]
    assert end.status.jobs[0].state == ("FAILED" if fails else "COMPLETED")
    assert [(r["step"], r["path"]) for r in end.newest_eval] == [(4, str(spec.path / "eval" / "step_4.json"))]


def test_watch_waits_by_default_only_on_cluster_local(isolated: Path) -> None:
    assert watch.waits_by_default(local_run(isolated))
    slurm = resolve_spec("tiny-gsm8k", "slurm-dev", [f"cluster.runs_root={isolated / 'runs'}"], run_name="s")
    assert not watch.waits_by_default(slurm)


@pytest.mark.parametrize(("run", "model", "k", "n", "message"), [
    (None, None, None, 1, "give a run (its name or folder) or --model (one of them)"),
    ("r", "m", [9], 1, "give a run (its name or folder) or --model (one of them)"),  # the first check wins
    ("r", None, [2], 1, "--k [2]: each k must be between 1 and --n=1"),
    (None, "m", [0, 1], 4, "--k [0, 1]: each k must be between 1 and --n=4"),
])
def test_eval_code_options_refused(run, model, k, n, message) -> None:
    with pytest.raises(SpecError) as exc:
        check_code_options(run, model, k, n)
    assert message in str(exc.value)


def test_eval_code_options_accepted() -> None:
    assert check_code_options("r", None, None, 1) == [1]
    assert check_code_options(None, "m", [4, 1, 4], 4) == [1, 4]


def test_catalog_lists_every_recipe_and_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Against the shipped files themselves (not the registry the catalog is built from)."""
    monkeypatch.delenv("HPC_GRPO_PATH", raising=False)  # a user's own folders would add their files
    repo = Path(__file__).resolve().parents[2]
    recipes = catalog.recipe_rows()
    assert [r["name"] for r in recipes] == sorted(p.stem for p in (repo / "recipes").glob("*.yaml"))
    assert {r["engine"] for r in recipes} <= {"verl", "trl"} and all(Path(r["path"]).is_file() for r in recipes)
    clusters = {r["name"]: r for r in catalog.cluster_rows()}
    assert sorted(clusters) == sorted(p.stem for p in (repo / "clusters").glob("*.yaml"))
    assert clusters["local"]["scheduler"] == "local" and clusters["slurm-dev"]["scheduler"] == "slurm"


def test_report_figure_goes_into_the_run_unless_told(tmp_path: Path) -> None:
    assert report.figure_path(tmp_path) == tmp_path / "report.png"
    assert report.figure_path(tmp_path, tmp_path / "x.png") == tmp_path / "x.png"


# A verl job's stdout as it arrives, in the shapes verl 0.9, vLLM and Ray print (a few lines of each): the console
# following the job gets hpc-grpo's lines, each step shortened, and an error with its traceback, nothing else.
VERL_STDOUT = """hpc-grpo: [1733490000.000] starting the Ray head on node0 (127.0.0.2:6380) for 1 node(s)
hpc-grpo: [1733490005.000] 1 node(s), 1 CPU worker(s), no GPU (verl's CPU mode) in the Ray cluster
(TaskRunner pid=4242) {'actor_rollout_ref': {'actor': {'_target_': 'verl.workers.config.FSDPActorConfig',
(TaskRunner pid=4242)                                  'checkpoint': {'save_contents': ['model', 'optimizer'],
(TaskRunner pid=4242)                        'ppo_mini_batch_size': 8}}}
(TaskRunner pid=4242) WARNING 12-06 13:00:01 [config.py:123] bfloat16 is not supported on this CPU, using float32
(WorkerDict pid=4300) INFO 12-06 13:00:02 [cpu_worker.py:77] OMP threads binding of Process 4300: auto
(TaskRunner pid=4242) Training Progress:  12%|#2        | 2/16 [00:10<01:10,  5.00s/it]\r\
Training Progress:  19%|#8        | 3/16 [00:15<01:05,  5.00s/it]
(TaskRunner pid=4242) step:1 - actor/entropy:10.3 - actor/kl_loss:0.0 - actor/grad_norm:0.52 - critic/score/mean:0.025 - response_length/mean:16.0 - response_length/clip_ratio:1.0 - timing_s/step:12.34 - perf/throughput:3.1
(TaskRunner pid=4242) [hpc-grpo] USR2: saving at the next step boundary, then stopping for the requeue
Traceback (most recent call last):
  File "/x/verl/trainer/main_ppo.py", line 42, in main
    run_ppo(config)
RuntimeError: the vLLM engine died
after the error, more noise
hpc-grpo: [1733490099.000] Ray head stopped"""


def test_console_lines_keep_ours_the_steps_and_errors() -> None:
    chunks = [VERL_STDOUT[i:i + 37] for i in range(0, len(VERL_STDOUT), 37)]  # arrives in pieces
    shown = "".join(watch.console_lines(chunks)).splitlines()
    assert shown == [
        "hpc-grpo: [1733490000.000] starting the Ray head on node0 (127.0.0.2:6380) for 1 node(s)",
        "hpc-grpo: [1733490005.000] 1 node(s), 1 CPU worker(s), no GPU (verl's CPU mode) in the Ray cluster",
        "hpc-grpo: verl step 1: reward 0.025, kl 0, response length 16 (12.3 s)",
        "(TaskRunner pid=4242) [hpc-grpo] USR2: saving at the next step boundary, then stopping for the requeue",
        "Traceback (most recent call last):",
        '  File "/x/verl/trainer/main_ppo.py", line 42, in main',
        "    run_ppo(config)",
        "RuntimeError: the vLLM engine died",
        "hpc-grpo: [1733490099.000] Ray head stopped",
    ]


def test_runs_lists_only_your_runs_and_says_where_it_looked(isolated: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A shared runs root (slurm-dev's /tmp/hpc-grpo-runs) holds another user's run: `runs` leaves it out and says
    so, names the roots it looked in, and the newest run a command picks is yours."""
    import os

    from tests.cli_run import run_cli

    if os.getuid() != 0:
        reason = "giving a run to another user needs root (chown)"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    root = isolated / "shared-runs"
    monkeypatch.setattr("hpc_grpo.commands.status.runs_roots", lambda: [root, isolated / "nowhere"])
    for name in ("mine", "theirs"):
        spec = resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={root}"], run_name=name)
        render.write_files(spec.path, render.render_all(spec))
    theirs = layout.spec_file(root / "theirs")
    os.chown(theirs, 54321, 54321)
    os.utime(theirs)  # the newest
    assert runs.scan_runs([root]) == ([(root / "mine").resolve()], 1)
    code, text = run_cli(monkeypatch, capsys, "runs")
    assert code in (None, 0)
    flat = " ".join(text.split())
    assert "mine" in flat and "theirs" not in flat
    assert f"Looked in: {root} (not on this machine: {isolated / 'nowhere'})" in flat
    assert "1 run(s) of other users there not listed" in flat
    from hpc_grpo.commands.status import locate_run

    assert locate_run(None) == (root / "mine").resolve()
