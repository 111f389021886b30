"""How a verl job's Ray ports are laid out, and the range a cluster profile lets them use (`ray_ports`).

Plain data in config: the profile's validator and the job's node plan (job/node_plan) read the same numbers. A job
takes one block of JOB_BLOCK ports, chosen by its job id; each node of the job on one machine takes its own slot of
NODE_SLOT ports in the block (slurm-dev runs its 4 nodes on one machine; nodes further on are other hosts and reuse
the slots). Two jobs on one machine share nothing while their ids fall in different blocks, and never when their
profiles give disjoint ranges (the local profile and slurm-dev's nodes share this machine in the tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

JOB_BLOCK = 400
NODE_SLOT = 100
SLOTS = JOB_BLOCK // NODE_SLOT
DEFAULT = "20000-31999"  # 30 blocks below Linux's default ephemeral range (32768-60999)


@dataclass(frozen=True, slots=True)
class PortRange:
    """FIRST-LAST, inclusive: `blocks` whole job blocks from `first`."""

    first: int
    blocks: int


def parse(text: str) -> PortRange:
    """'FIRST-LAST' as a range of whole job blocks; ValueError naming the rule otherwise."""
    m = re.fullmatch(r"(\d+)-(\d+)", text.strip())
    if not m:
        raise ValueError(f"{text!r}: give the range as FIRST-LAST, e.g. {DEFAULT}")
    first, last = int(m[1]), int(m[2])
    if not 1024 <= first < last <= 65535:
        raise ValueError(f"{text!r}: ports must rise within 1024-65535")
    blocks = (last - first + 1) // JOB_BLOCK
    if blocks < 1:
        raise ValueError(f"{text!r}: a job needs a block of {JOB_BLOCK} ports; give a range of at least that")
    return PortRange(first, blocks)
