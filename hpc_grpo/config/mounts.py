"""Container mounts: which host folders a container job sees, and where.

A container job (pyxis: `srun --container-image`) sees the image and what is mounted into it, nothing else of the
host: home is not mounted (`--no-container-mount-home`: a mounted home leaks ~/.local packages into the image's
Python). `job_mounts` is the one list of what is mounted: the profile's `shared_paths`, its `setup.mounts` and the
run directory. hpc_grpo.cluster.sbatch writes it as `--container-mounts`, and hpc_grpo.planning.container checks
every path the job reads against it.

A `setup.mounts` entry is pyxis's syntax: `PATH` (mounted at its own path), `SRC:DST` or `SRC:DST:ro|rw`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hpc_grpo.config.fields import expand_vars

FLAGS = ("ro", "rw")
SYNTAX = "PATH, SRC:DST or SRC:DST:ro (absolute paths; `~` and $VARS expand)"


@dataclass(frozen=True, slots=True)
class Mount:
    """One host folder (or file) `src`, seen inside the container at `dst`."""

    src: PurePosixPath
    dst: PurePosixPath
    read_only: bool = False

    def text(self) -> str:
        """pyxis's form of this mount (one entry of --container-mounts)."""
        return f"{self.src}:{self.dst}" + (":ro" if self.read_only else "")

    def covers_inside(self, path: PurePosixPath) -> bool:
        """`path`, as the job names it inside the container, lies in this mount."""
        return path == self.dst or self.dst in path.parents

    def covers_host(self, path: PurePosixPath) -> bool:
        """`path` on the host lies in this mount's source."""
        return path == self.src or self.src in path.parents


def _absolute(text: str, what: str, entry: str) -> PurePosixPath:
    expanded = expand_vars(text)
    if "$" in expanded:
        raise ValueError(f"{entry!r}: {what} {text!r} names an environment variable that is not set")
    if not expanded.startswith("/"):
        raise ValueError(f"{entry!r}: {what} {expanded!r} is not an absolute path; write {SYNTAX}")
    return PurePosixPath(Path(expanded).absolute())


def parse_mount(entry: str) -> Mount:
    """One `setup.mounts` entry as a Mount; ValueError naming the entry and the rule."""
    if not isinstance(entry, str) or not entry.strip():
        raise ValueError(f"{entry!r} is not a mount: write {SYNTAX}")
    if "," in entry:
        raise ValueError(f"{entry!r}: pyxis separates mounts with ',', so a path cannot hold one; "
                         "give each mount its own list entry")
    parts = entry.split(":")
    if len(parts) > 3:
        raise ValueError(f"{entry!r}: pyxis reads ':' as its separator, so a path cannot hold one; write {SYNTAX}")
    flag = parts[2] if len(parts) == 3 else "rw"
    if flag not in FLAGS:
        raise ValueError(f"{entry!r}: unknown mount flag {flag!r}; use {' or '.join(FLAGS)}")
    src = _absolute(parts[0], "source", entry)
    dst = _absolute(parts[1], "destination", entry) if len(parts) > 1 else src
    return Mount(src, dst, read_only=flag == "ro")


def normalise(entry: str) -> str:
    """The entry as it is frozen: expanded now, on the login node (the job script quotes it, no shell expands it)."""
    return parse_mount(entry).text()


def job_mounts(shared: list[Path], entries: list[str], run_dir: str) -> list[Mount]:
    """Everything of the host a container job sees: the profile's shared paths (`shared`: shared_path_list()), its
    setup.mounts (`entries`) and the run directory, which the job writes (its own mount, read-write even under a
    read-only parent). Parents come before what is mounted inside them: a mount made later over a parent would
    hide a child mounted before it."""
    mounts = [Mount(PurePosixPath(p), PurePosixPath(p)) for p in shared]
    mounts += [parse_mount(m) for m in entries]
    run = PurePosixPath(Path(run_dir).absolute())
    mounts.append(Mount(run, run))
    unique = list(dict.fromkeys(mounts))
    return sorted(unique, key=lambda m: len(m.dst.parts))  # stable: equal depths keep the profile's order


def mounts_option(mounts: list[Mount]) -> str:
    """The value of srun's --container-mounts."""
    return ",".join(m.text() for m in mounts)
