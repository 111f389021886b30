"""How many steps a run trains: what the engine printed, the recipe's train.total_training_steps, else
epochs x (rows // batch) from the training file's row count (verl's rule: the last partial batch is dropped).
Read by status's progress bar (commands/monitor) and by runstate/trained (is the final checkpoint written?)."""

from __future__ import annotations

from pathlib import Path

from hpc_grpo.config.spec import RunSpec


def data_rows(path: Path) -> int | None:
    """Rows of a data file without reading its data: the parquet footer's count, or jsonl's line count."""
    if not path.is_file():
        return None
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            return int(pq.read_metadata(path).num_rows)
        except Exception:  # no pyarrow, or a broken file: no estimate
            return None
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())


def total_steps(spec: RunSpec, printed: int | None) -> tuple[int | None, bool]:
    """(total steps, estimated?): what the engine printed, the recipe's step count, else epochs x rows / batch."""
    if printed:
        return printed, False
    t = spec.recipe.train
    if t.total_training_steps:
        return t.total_training_steps, False
    counts = [data_rows(Path(f)) for f in spec.recipe.data.train_list]  # verl concatenates a list of files
    rows = None if None in counts else sum(c or 0 for c in counts)
    if not rows:
        return None, True
    return max(1, rows // spec.recipe.batch.train) * t.total_epochs, True
