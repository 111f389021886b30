"""GSM8K slices for tests that run verl's real trainer: verl tokenizes every training row at each start to drop
overlong prompts (~20 s for GSM8K's 7473 rows on 2 cores), and ends a run when its one epoch runs out, whatever
total_training_steps says. TRAIN_ROWS covers 16 steps of 8 prompts with room for the rows dropped as overlong."""

from __future__ import annotations

from pathlib import Path

TRAIN_ROWS = 192


def head_parquet(src: Path, dst: Path, rows: int = 64) -> Path:
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(src).slice(0, rows), dst)
    return dst
