"""How many steps a run trains: what the engine printed, the recipe's train.total_training_steps, else
epochs x (rows // batch) from the training files' row counts (verl's rule: the last partial batch is dropped).
The one counter of a data file's rows: plan's schedule reads it too.
Read by status's progress bar (commands/monitor) and by runstate/trained (is the final checkpoint written?)."""

from __future__ import annotations

from pathlib import Path

from hpc_grpo.common.findings import cannot_read
from hpc_grpo.config.spec import RunSpec

# Row counts of data sets hpc-grpo prepares, for plans made where the file is not readable (a login node
# without the cluster's scratch, CI): (path fragment, file stem) -> rows.
KNOWN_ROWS = {("gsm8k", "train"): 7473, ("gsm8k", "test"): 1319}


def dataset_rows(files: str | list[str]) -> tuple[int | None, str]:
    """Rows of a data key's files (verl concatenates a list) and where the number came from; None when one is
    unknown."""
    if isinstance(files, list) and len(files) != 1:
        counts = [_file_rows(f) for f in files]
        unknown = next((how for rows, how in counts if rows is None), None)
        if unknown is not None:
            return None, unknown
        return sum(rows or 0 for rows, _ in counts), " + ".join(how for _, how in counts)
    return _file_rows(files if isinstance(files, str) else files[0])


def _file_rows(path: str) -> tuple[int | None, str]:
    """Rows of one data file and where the number came from (parquet footer, jsonl lines, known table)."""
    p = Path(path)
    unread = f"{p} is not readable here"
    if p.is_file():
        try:
            if p.suffix == ".parquet":
                try:
                    import pyarrow.parquet as pq
                except ImportError:
                    pass
                else:
                    return pq.ParquetFile(p).metadata.num_rows, f"parquet footer of {p}"
            elif p.suffix in (".jsonl", ".json"):
                with p.open("rb") as fh:
                    return sum(1 for line in fh if line.strip()), f"lines of {p}"
        except Exception as exc:  # OSError (permissions, I/O) or pyarrow's ArrowInvalid: the data check names the fix
            unread = cannot_read(p, exc)
    for (fragment, stem), rows in KNOWN_ROWS.items():
        if fragment in str(p).lower() and p.stem == stem:
            return rows, f"known data set table ({fragment} {stem}: {rows} rows; {p} not read here)"
    return None, f"{unread} and is not a known data set"


def total_steps(spec: RunSpec, printed: int | None) -> tuple[int | None, bool]:
    """(total steps, estimated?): what the engine printed, the recipe's step count, else epochs x rows / batch."""
    if printed:
        return printed, False
    t = spec.recipe.train
    if t.total_training_steps:
        return t.total_training_steps, False
    rows, _ = dataset_rows(spec.recipe.data.train_files)  # verl concatenates a list of files
    if not rows:
        return None, True
    return max(1, rows // spec.recipe.batch.train) * t.total_epochs, True
