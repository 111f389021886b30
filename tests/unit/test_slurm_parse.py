"""Slurm's output parsers (hpc_grpo.cluster.slurm_output), its time strings and states, and the command runner
of hpc_grpo.cluster.slurm, on sample output (shapes measured on Slurm 22.05); no cluster needed."""

from __future__ import annotations

import pytest

from hpc_grpo.cluster import slurm, slurm_output, states
from hpc_grpo.common.slurm_time import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0:04", 4),
        ("00:00:04", 4),
        ("2:00:00", 7200),
        ("1-00:00:00", 86400),
        ("1-02:03:04", 93784),
        ("30", 1800),  # bare number: minutes
        ("2-12", 2 * 86400 + 12 * 3600),
        ("2-12:30", 2 * 86400 + 12 * 3600 + 30 * 60),
        ("infinite", None),
        ("UNLIMITED", None),
        ("", None),
    ],
)
def test_parse_duration(text: str, seconds: int | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["abc", "1:2:3:4", "x-01:00:00"])
def test_parse_duration_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm time"):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("gpu:4", (4, None)),
        ("gpu:a100:8(S:0-1)", (8, "a100")),
        ("gpu:a100:4(S:0),shard:8", (4, "a100")),
        ("gpu:a100:2,gpu:v100:2", (4, "a100")),
        ("(null)", (0, None)),
        ("mps:400", (0, None)),
        ("", (0, None)),
    ],
)
def test_parse_gres_gpus(gres: str, expected: tuple[int, str | None]) -> None:
    assert slurm_output.parse_gres_gpus(gres) == expected


@pytest.mark.parametrize(
    ("raw", "state"),
    [("CANCELLED by 0", "CANCELLED"), ("RUNNING", "RUNNING"), ("cancelled+", "CANCELLED"), ("", "UNKNOWN")],
)
def test_normalize_state(raw: str, state: str) -> None:
    assert states.normalize_state(raw) == state


SINFO = "low*|4|4|gpu:4|4000|2:00:00\nhigh|4|4|gpu:4|4000|2:00:00\n"


def test_parse_sinfo_named_and_default() -> None:
    low = slurm_output.parse_sinfo(SINFO, "low")
    assert low == slurm_output.PartitionLimits("low", 4, 4, 4, 4000, 120, None)
    assert slurm_output.parse_sinfo(SINFO, None).name == "low"
    assert slurm_output.parse_sinfo(SINFO, "high").max_time_min == 120


def test_parse_sinfo_mixed_nodes_takes_smallest_and_sums() -> None:
    text = "gpu|8|64|gpu:a100:8(S:0-1)|512000|2-00:00:00\ngpu|2|48+|gpu:a100:4|256000+|2-00:00:00\n"
    lim = slurm_output.parse_sinfo(text, "gpu")
    assert (lim.nodes, lim.cpus_per_node, lim.gpus_per_node, lim.mem_per_node_mb) == (10, 48, 4, 256000)
    assert (lim.max_time_min, lim.gpu_type) == (2880, "a100")


def test_parse_sinfo_no_limit_and_missing() -> None:
    assert slurm_output.parse_sinfo("debug|1|2|(null)|1000|infinite\n", "debug").max_time_min is None
    with pytest.raises(LookupError, match="no partition 'nope'"):
        slurm_output.parse_sinfo(SINFO, "nope")
    with pytest.raises(LookupError, match="default partition"):
        slurm_output.parse_sinfo("a|1|1|(null)|1|1:00\n", None)


def test_parse_squeue() -> None:
    text = (
        "4|COMPLETED|0:04|0|node1|None|\n"
        "5|FAILED|0:01|768|node1|NonZeroExitCode|\n"
        "6|FAILED|0:01|9|node1|JobLaunchFailure|\n"
        "7|PENDING|0:00|0||Resources|\n"
        "8_3|RUNNING|1-02:03:04|0|node[1-2]|None|\n"
    )
    jobs = slurm_output.parse_squeue(text)
    assert list(jobs) == ["4", "5", "6", "7", "8_3"]
    assert jobs["4"] == slurm_output.JobInfo("4", "COMPLETED", "0:04", "0:0", "node1", "None", "squeue")
    assert jobs["5"].exit_code == "3:0"  # wait status 768 = exit 3
    assert jobs["6"].exit_code == "0:9"  # killed by signal 9
    assert jobs["7"].nodelist == "" and jobs["7"].reason == "Resources" and jobs["7"].live
    assert jobs["8_3"].elapsed_s == 93784


def test_parse_squeue_names_array_tasks_as_sacct_does() -> None:
    """squeue's JobID of an array task is its own number; ArrayJobID/ArrayTaskID give ARRAY_TASK, and the row of
    the pending tasks ("2-3%1", "5,7%2") stands for each of them. A plain job's ArrayTaskID is N/A."""
    text = (
        "122|RUNNING|0:05|0|node1|None|121|0|\n"
        "121|PENDING|0:00|0||JobArrayTaskLimit|121|2-3%1|\n"
        "130|PENDING|0:00|0||JobArrayTaskLimit|130|5,7%2|\n"
        "140|RUNNING|0:01|0|node2|None|140|N/A|\n"
    )
    jobs = slurm_output.parse_squeue(text)
    assert list(jobs) == ["121_0", "121_2", "121_3", "130_5", "130_7", "140"]
    assert jobs["121_0"].state == "RUNNING" and jobs["121_0"].job_id == "121_0"
    assert jobs["121_3"].live and jobs["121_3"].reason == "JobArrayTaskLimit"


def test_parse_sacct_skips_steps_and_normalizes() -> None:
    text = (
        "12|CANCELLED by 0|00:00:18|0:15|node[1-4]|None\n"
        "12.batch|CANCELLED|00:00:18|0:15|node1|\n"
        "12.0|CANCELLED|00:00:18|0:15|node[1-4]|\n"
        "13|PENDING|00:00:00|0:0|None assigned|Priority\n"
        "14|RUNNING|00:00:05|0:0|node2|None\n"
    )
    jobs = slurm_output.parse_sacct(text)
    assert list(jobs) == ["12", "13", "14"]
    assert jobs["12"] == slurm_output.JobInfo("12", "CANCELLED", "00:00:18", "0:15", "node[1-4]", "None", "sacct")
    assert jobs["13"].nodelist == "" and jobs["13"].live
    assert not jobs["12"].live and jobs["14"].live


def test_parse_rejects_short_lines() -> None:
    with pytest.raises(ValueError, match="unexpected squeue line"):
        slurm_output.parse_squeue("1|RUNNING\n")
    with pytest.raises(ValueError, match="unexpected sacct line"):
        slurm_output.parse_sacct("1|RUNNING\n")


@pytest.mark.parametrize(
    "state",
    ["PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUE_HOLD", "RESIZING", "STOPPED"],
)
def test_is_live(state: str) -> None:
    assert states.is_live(state)


@pytest.mark.parametrize(
    "state",
    ["COMPLETED", "FAILED", "CANCELLED by 0", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"],
)
def test_is_not_live(state: str) -> None:
    assert not states.is_live(state)


@pytest.mark.parametrize("bad", ["12; rm -rf /", "", "abc", "1,2"])
def test_job_ids_are_checked(bad: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm job id"):
        slurm.job_states([bad])


def test_run_errors_name_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(slurm.SlurmError, match="not found on PATH"):
        slurm._run(["definitely-not-a-slurm-command-xyz"])
    with pytest.raises(slurm.SlurmError, match=r"`sh -c echo oops >&2; exit 3` failed \(exit 3\): oops"):
        slurm._run(["sh", "-c", "echo oops >&2; exit 3"])
    with pytest.raises(slurm.SlurmError, match="timed out after 0.2s"):
        slurm._run(["sleep", "5"], timeout=0.2)
    assert slurm._run(["echo", "ok"]) == "ok\n"


def test_squeue_unknown_ids_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(args: list[str], timeout: float = 20) -> tuple[str, str]:
        raise slurm.SlurmError(args, "slurm_load_jobs error: Invalid job id specified\n", 1)

    monkeypatch.setattr(slurm, "_run_full", fake_run)
    assert slurm.squeue_states(["99999"]) == {}


def test_available_false_without_sinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert slurm.available() is False
