"""Waiting for a Slurm job in the tests: one poll loop for every test under tests/slurm."""

from __future__ import annotations

import time

import pytest

from hpc_grpo.cluster import slurm
from hpc_grpo.cluster.slurm_output import JobInfo


def wait_final(job_id: str, deadline_s: float, poll_s: float = 0.3) -> JobInfo:
    """The job's final state. Past the deadline the job is cancelled (it must not hold the shared cluster's
    nodes for the next test) and the test fails with the last state seen."""
    end = time.monotonic() + deadline_s
    while True:
        info = slurm.job_states([job_id]).get(job_id)
        if info is not None and not info.live:
            return info
        if time.monotonic() > end:
            slurm.cancel(job_id)
            pytest.fail(f"job {job_id} not finished after {deadline_s:.0f}s: {info}")
        time.sleep(poll_s)
